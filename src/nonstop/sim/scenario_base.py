"""What every simulation scenario shares: one seed's world, its faults, its run.

A scenario (:mod:`nonstop.sim.scenarios.cluster_log`, :mod:`nonstop.sim.scenarios.dtx`)
turns a seed into one checked run.  The skeleton is the same for all of them
and lives here, so that each scenario file is only what it is about -- its
nodes, its workload, its checks:

1. :func:`new_world` draws, in this order, the network (latency, loss,
   duplication, reordering), the disk's fsync latency (unless the config fixes
   it), the simulation's own seed and the node count -- the draws every
   scenario starts with, so a seed keeps its meaning;
2. :func:`install_faults` draws the nemesis's schedule over the given nodes
   and installs it, healing everything at ``heal_at``;
3. :func:`repeat` schedules a workload step at a fixed interval until the heal;
4. :func:`runaway_fails` turns a runaway simulation (too many events) into a
   failed run rather than a crashed campaign;
5. :func:`run_stats` gathers the counters every result carries.

:class:`CommonConfig` holds the knobs they all have; a scenario's
``ScenarioConfig`` extends it (with its own defaults where they differ).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from nonstop.runtime.interface import NodeId
from nonstop.sim import nemesis
from nonstop.sim.core import DiskConfig, NetConfig, Simulation, SimulationError


@dataclass(slots=True)
class CommonConfig:
    """The knobs every scenario has (defaults: the cluster campaign's)."""

    nodes: tuple[int, ...] = (3, 3, 4, 5)
    """The node count is drawn from these."""
    fault_start: float = 1.0
    heal_at: float = 4.0
    fault_rate: float = 2.0
    fault_kinds: tuple[str, ...] = (*nemesis.FAULT_KINDS, *nemesis.EXTRA_KINDS)
    disk: DiskConfig | None = None
    """Fixed disk behaviour; default: fsync latency drawn per seed (see :func:`new_world`)."""
    max_events: int = 400_000
    """A run that needs more events than this is a runaway."""


@dataclass(slots=True)
class World:
    """One seed's world before anything runs: its RNG, simulation and node names."""

    rng: random.Random
    """The scenario's own draws (shape, workload, faults) continue from here."""
    sim: Simulation
    names: list[NodeId]
    wall_start: float


def new_world(
    seed: int,
    cfg: CommonConfig,
    *,
    sync_max: tuple[float, ...],
    trace: bool = False,
    digest: bool = True,
) -> World:
    """The network, disk, simulation and nodes of one seed (module doc, step 1).

    ``sync_max`` are the slowest fsync latencies the seed picks from.
    """
    wall = time.perf_counter()
    rng = random.Random(seed)
    net = NetConfig(
        delay_min=0.0005,
        delay_mean=rng.choice([0.001, 0.003, 0.01]),
        drop=rng.choice([0.0, 0.0, 0.01, 0.05]),
        duplicate=rng.choice([0.0, 0.01, 0.05]),
        reorder=rng.choice([0.0, 0.05, 0.2]),
    )
    disk = cfg.disk or DiskConfig(sync_min=0.0005, sync_max=rng.choice(list(sync_max)))
    sim = Simulation(
        rng.getrandbits(64), net, disk, trace=trace, digest=digest, max_events=cfg.max_events
    )
    n = rng.choice(cfg.nodes)
    return World(rng, sim, [f"n{i}" for i in range(1, n + 1)], wall)


def install_faults(world: World, targets: list[NodeId], cfg: CommonConfig) -> list[nemesis.Fault]:
    """Draw the nemesis's schedule over ``targets`` and install it (module doc, step 2)."""
    faults = nemesis.plan(
        world.rng,
        targets,
        start=cfg.fault_start,
        heal_at=cfg.heal_at,
        rate=cfg.fault_rate,
        kinds=cfg.fault_kinds,
    )
    nemesis.install(world.sim, faults, cfg.heal_at)
    return faults


def repeat(
    sim: Simulation, start: float, until: float, interval: float, *steps: Callable[[], None]
) -> None:
    """Schedule ``steps`` (in order) at ``start``, ``start + interval``, ... before ``until``."""
    t = start
    while t < until:
        for step in steps:
            sim.at(t, step)
        t += interval


class Failing(Protocol):
    """A checker: records a violation of ``invariant`` at the simulation's time."""

    def fail(self, sim: Simulation, invariant: str, detail: str) -> None: ...


@contextmanager
def runaway_fails(checker: Failing, sim: Simulation) -> Iterator[None]:
    """A runaway protocol (more events than allowed) fails the run: ``runaway`` (step 4)."""
    try:
        yield
    except SimulationError as exc:
        checker.fail(sim, "runaway", str(exc))


def run_stats(world: World, **counters: Any) -> dict[str, Any]:
    """The counters every result carries, then the scenario's own (step 5)."""
    sim = world.sim
    return {
        "events": sim.events,
        "messages": sim.messages_sent,
        **counters,
        "virtual_time": sim.now,
        "wall_time": time.perf_counter() - world.wall_start,
    }


__all__ = [
    "CommonConfig",
    "Failing",
    "World",
    "install_faults",
    "new_world",
    "repeat",
    "run_stats",
    "runaway_fails",
]
