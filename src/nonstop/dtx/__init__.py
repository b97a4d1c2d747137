"""Distributed transactions: two-phase commit whose outcome is decided in a replicated log.

* :mod:`nonstop.dtx.protocol` -- :class:`DtxNode`, the sans-I/O coordinator and
  participant machine, and the :class:`ResourceManager` seam to the store;
* :mod:`nonstop.dtx.decisions` -- the decision log's contract and state machine
  (first writer wins, compaction by floors), for the Raft integration to host;
* :mod:`nonstop.dtx.log_table` -- :class:`~nonstop.dtx.log_table.DecisionLogTable`,
  that state machine as a table of the cluster log (``nonstop.cluster.tables``);
* :mod:`nonstop.sim.scenarios.dtx_resource` -- a simulated store and decision log;
* :mod:`nonstop.dtx.clustered` -- :class:`~nonstop.dtx.clustered.DtxClusterNode`, the
  cluster node and this machine in one, the Raft cluster log as the decision log;
* :mod:`nonstop.sim.scenarios.dtx` -- the bank workload under faults, with its checker;
* :mod:`nonstop.sim.dtx_campaign` -- ``python -m nonstop.sim.dtx_campaign --seeds N``.

Design: ``docs/design/dtx.md``.
"""

from nonstop.dtx.decisions import ABORT, COMMIT, LOG, DecisionTable, make_gtid, parse_gtid
from nonstop.dtx.protocol import DtxConfig, DtxNode, Ready, Refused, ResourceManager

__all__ = [
    "ABORT",
    "COMMIT",
    "LOG",
    "DecisionTable",
    "DtxConfig",
    "DtxNode",
    "Ready",
    "Refused",
    "ResourceManager",
    "make_gtid",
    "parse_gtid",
]
