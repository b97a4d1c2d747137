"""The node's admin HTTP API and web console (G2, G5): docs/design/admin.md.

:mod:`.app` builds the FastAPI application from the command registry
(:mod:`nonstop.commands.registry`); :mod:`.server` serves it with uvicorn on the
node's event loop; :mod:`.tokens` signs session tokens; :mod:`.principal` is
the one place that turns credentials into a user and roles; :mod:`.body_limit`
bounds request bodies before they are read; ``console/`` is the web console.
"""
