"""The administrative commands, each defined once (G2): :mod:`nonstop.commands.registry`.

The CLI (``nonstop.admin``) and the HTTP API (``nonstop.adminapi``) are built
from :data:`~nonstop.commands.registry.REGISTRY`: same names, same typed
arguments, same required permission, same JSON result (docs/design/admin.md).
"""
