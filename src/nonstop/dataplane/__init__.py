"""The data plane: client sessions, branches and commit on every node.

See ``docs/design/data-path.md`` for the wire contract,
``docs/design/dataplane-machine.md`` for the machine and
``docs/design/distribution.md`` for the design.  Modules:

* :mod:`nonstop.dataplane.machine` — the sans-I/O machine (sessions, branches, commit),
  with its events (:mod:`~nonstop.dataplane.events`) and parts (``driver``, ``steps``,
  ``session_ops``, ``commit``, ``results``, ``calls``, ``branches``, ``view``, ``state``);
* :mod:`nonstop.dataplane.service` — its asyncio adapter on a real node;
* :mod:`nonstop.dataplane.store_ops` — the machine's store ops on the real store;
* :mod:`nonstop.dataplane.participant` — the object store as a two-phase-commit participant.
"""
