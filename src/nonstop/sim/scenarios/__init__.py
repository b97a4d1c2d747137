"""Simulation scenarios: a cluster, a workload, a nemesis and the checks of one seed.

* :mod:`nonstop.sim.scenarios.cluster_log` — the cluster log (Raft, views, quorum);
* :mod:`nonstop.sim.scenarios.dtx` — two-phase commit with the decision log;
* :mod:`nonstop.sim.scenarios.dtx_resource` — the simulated store those commits run on.
"""
