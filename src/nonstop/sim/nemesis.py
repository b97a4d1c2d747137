"""The nemesis: a random fault schedule drawn from the run's seed, then a heal.

Faults are the ones a cluster meets in production (and that Jepsen found the
anchor systems losing data under): process crashes with restarts, process
pauses (GC, SIGSTOP, a VM migration), symmetric partitions, one-way partitions
(a firewall rule or a half-dead NIC), bursts of message loss, and (opt-in)
disk stalls.  Each fault
is undone after a random duration, so several overlap; at ``heal_at`` every
fault is undone at once and the cluster must converge (the liveness check).

The schedule is a plain list (:class:`Fault`), drawn up front, so a failing
seed prints it in full and the failure is explained by reading it.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from nonstop.runtime.interface import NodeId
from nonstop.sim.core import Simulation

FAULT_KINDS = ("crash", "pause", "partition", "one_way", "loss")
"""The default kinds (other scenarios rely on this tuple staying as it is)."""

EXTRA_KINDS = ("stall",)
"""Opt-in kinds: ``stall`` holds a node's fsyncs for a while (a slow or failing disk)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: what, when, for how long, on whom."""

    kind: str
    start: float
    duration: float
    nodes: tuple[NodeId, ...]
    """crash/pause: the node; partition: one side; one_way: (src side..., '|', dst side...)."""
    probability: float = 0.0

    def describe(self) -> str:
        end = self.start + self.duration
        who = ",".join(self.nodes)
        extra = f" p={self.probability:.2f}" if self.kind == "loss" else ""
        return f"{self.start:7.3f}-{end:7.3f} {self.kind:9s} {who}{extra}"


def plan(
    rng: random.Random,
    nodes: Sequence[NodeId],
    *,
    start: float,
    heal_at: float,
    rate: float = 2.0,
    kinds: Sequence[str] = FAULT_KINDS,
) -> list[Fault]:
    """Draw a schedule: faults arrive as a Poisson process of ``rate`` per second."""
    faults: list[Fault] = []
    t = start + rng.expovariate(rate)
    names = list(nodes)
    while t < heal_at:
        kind = rng.choice(list(kinds))
        duration = min(rng.uniform(0.2, 1.5), heal_at - t)
        if kind in ("crash", "pause", "stall"):
            faults.append(Fault(kind, t, duration, (rng.choice(names),)))
        elif kind == "partition":
            side = rng.sample(names, rng.randint(1, max(1, len(names) // 2)))
            faults.append(Fault(kind, t, duration, tuple(sorted(side))))
        elif kind == "one_way":
            shuffled = names[:]
            rng.shuffle(shuffled)
            cut = rng.randint(1, len(shuffled) - 1)
            src, dst = sorted(shuffled[:cut]), sorted(shuffled[cut:])
            faults.append(Fault(kind, t, duration, (*src, "|", *dst)))
        elif kind == "loss":
            faults.append(Fault(kind, t, duration, (), probability=rng.uniform(0.2, 0.9)))
        t += rng.expovariate(rate)
    return faults


def install(sim: Simulation, faults: Sequence[Fault], heal_at: float) -> None:
    """Schedule ``faults`` on ``sim`` and a full heal at ``heal_at``.

    Overlapping partitions are tracked as a multiset of blocked links so that
    undoing one fault does not undo another's cut.
    """
    cuts: dict[tuple[NodeId, NodeId], int] = {}

    def cut(links: list[tuple[NodeId, NodeId]], add: bool) -> None:
        for link in links:
            count = cuts.get(link, 0) + (1 if add else -1)
            if count > 0:
                cuts[link] = count
                if add and count == 1:
                    sim.block(*link)
            else:
                cuts.pop(link, None)
                sim.unblock(*link)

    def links_of(fault: Fault) -> list[tuple[NodeId, NodeId]]:
        everyone = sorted(sim.nodes)
        if fault.kind == "partition":
            side = set(fault.nodes)
            other = [n for n in everyone if n not in side]
            return [(a, b) for a in sorted(side) for b in other] + [
                (b, a) for a in sorted(side) for b in other
            ]
        bar = fault.nodes.index("|")
        src, dst = fault.nodes[:bar], fault.nodes[bar + 1 :]
        return [(a, b) for a in src for b in dst]

    for fault in faults:
        end = fault.start + fault.duration
        if fault.kind == "crash":
            node = fault.nodes[0]
            sim.at(fault.start, functools.partial(sim.crash, node))
            sim.at(end, functools.partial(sim.restart, node))
        elif fault.kind == "pause":
            node = fault.nodes[0]
            sim.at(fault.start, functools.partial(sim.pause, node))
            sim.at(end, functools.partial(sim.resume, node))
        elif fault.kind in ("partition", "one_way"):
            links = links_of(fault)
            sim.at(fault.start, functools.partial(cut, links, True))
            sim.at(end, functools.partial(cut, links, False))
        elif fault.kind == "stall":
            node = fault.nodes[0]
            sim.at(fault.start, functools.partial(sim.stall_disk, node, fault.duration))
        elif fault.kind == "loss":
            burst = functools.partial(sim.loss_burst, fault.duration, fault.probability)
            sim.at(fault.start, burst)

    def heal() -> None:
        cuts.clear()
        sim.heal()
        for name in sorted(sim.nodes):
            node = sim.nodes[name]
            if node.paused:
                sim.resume(name)
            if not node.up:
                sim.restart(name)

    sim.at(heal_at, heal)
