"""The data plane: client sessions, branches and commit on every node.

See ``docs/design/data-path.md`` for the wire contract and
``docs/design/distribution.md`` for the design.  Modules:

* :mod:`nonstop.dataplane.service` — the node's data service (sessions, branches, commit);
* :mod:`nonstop.dataplane.participant` — the object store as a two-phase-commit participant.
"""
