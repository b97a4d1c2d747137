"""Deterministic simulation of nonstop clusters (see ``docs/design/simulation.md``).

* :mod:`nonstop.sim.core` -- the simulator: virtual clock, seeded RNG, network,
  disks, node crash/restart/pause;
* :mod:`nonstop.sim.nemesis` -- random fault schedules drawn from the seed;
* :mod:`nonstop.sim.checker` -- invariant checkers for the cluster log;
* :mod:`nonstop.sim.scenarios.cluster_log` -- the cluster scenario (one seed = one run);
* :mod:`nonstop.sim.campaign` -- ``python -m nonstop.sim.campaign --seeds N``.
"""

from nonstop.sim.core import DiskConfig, NetConfig, Simulation, SimulationError

__all__ = ["DiskConfig", "NetConfig", "Simulation", "SimulationError"]
