"""Distribution: the data path between clients and nodes, and between nodes.

See ``docs/design/data-path.md`` for the wire contract and
``docs/design/distribution.md`` for the design.  Modules:

* :mod:`nonstop.dist.wire` — object, write-set and error encodings (client and node);
* :mod:`nonstop.dist.service` — the node's data service (sessions, branches, commit);
* :mod:`nonstop.dist.resource` — the two-phase-commit participant on the real store;
* :mod:`nonstop.dist.bulk` — bulk scans and loads for the Spark pipeline;
* :mod:`nonstop.dist.apps` — loading application modules (``--app``).
"""
