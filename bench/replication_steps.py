"""The longest single step of the replication machine for a large swap's prepare and outcome.

``python -m bench.replication_steps [--writes 25000] [--partitions 5]``

In process, no I/O: an active node ``a`` and its sync replica ``b``
(:class:`~nonstop.replication.machine.ReplicationMachine`, the product's
configuration), ``--partitions`` partitions acting on ``a``, each given a prepared
record of ``--writes`` writes shaped like an overwrite's (``<ref hex>`` ->
``[type, version, packed state]``), then its commit outcome -- what one node does
for its share of a 200,000-by-200,000 swap by partition (about 130,000 writes
over 5-6 partitions, data-path.md §6.8).  Every ``Persist`` is durable at once,
every message delivered at once, every zero-delay timer fired at once: what is
timed is each call into a machine (``replicate``, ``outcome``, ``handle``,
``on_table``), and the longest is printed per phase and node -- the step a node's
event loop cannot interleave with anything else (a keep-alive, a lease renewal).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from nonstop.replication import PartitionView, ReplicationConfig, ReplicationMachine
from nonstop.replication.records import OUTCOME_COMMIT, PREPARE
from nonstop.runtime.interface import Persist, Persisted, Received, Send, SetTimer, TimerFired
from nonstop.sim.core import decode, encode


class _Node:
    def __init__(self, me: str) -> None:
        self.machine = ReplicationMachine(me, random.Random(1), {}, ReplicationConfig())
        self.me = me
        self.queue: list[Any] = []
        self.longest: dict[str, float] = {}

    def call(self, phase: str, fn: Any, *args: Any) -> None:
        started = time.perf_counter()
        actions = fn(*args)
        took = time.perf_counter() - started
        self.longest[phase] = max(self.longest.get(phase, 0.0), took)
        self.queue += actions


def _views(names: list[str]) -> dict[str, PartitionView]:
    return {n: PartitionView(n, 1, "a", ("a", "b"), (), ("a", "b")) for n in names}


def _run(nodes: dict[str, _Node], views: dict[str, PartitionView], phase: str) -> None:
    """Deliver everything until nothing moves (the events of one phase)."""
    names = list(views)
    moved = True
    while moved:
        moved = False
        for node in nodes.values():
            queue, node.queue = node.queue, []
            for action in queue:
                moved = True
                if isinstance(action, Persist):
                    node.call(phase, node.machine.handle, Persisted(0.0, action.token))
                elif isinstance(action, Send):
                    wire = decode(encode(action.payload))
                    other = nodes[action.to]
                    other.call(phase, other.machine.handle, Received(0.0, node.me, wire))
                elif isinstance(action, SetTimer) and action.name != "rep.tick":
                    node.call(phase, node.machine.handle, TimerFired(0.0, action.name))
            acting = names if node.me == "a" else []
            if moved:
                node.call(phase, node.machine.on_table, 0.0, views, acting)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=25_000)
    p.add_argument("--partitions", type=int, default=5)
    args = p.parse_args(argv)
    names = [f"default.{i}" for i in range(args.partitions)]
    views = _views(names)
    nodes = {n: _Node(n) for n in ("a", "b")}
    for n, node in nodes.items():
        node.call("start", node.machine.on_table, 0.0, views, names if n == "a" else [])
    _run(nodes, views, "start")
    a = nodes["a"]
    state = b"\x83" + b"x" * 60
    sets = {
        name: {
            f"{i:04x}{k:028x}": (None if k % 2 else ["nonstop.demos.bank.Account", 1, state])
            for k in range(args.writes)
        }
        for i, name in enumerate(names)
    }

    def prepare() -> list[Any]:  # one call for every partition, as the host's replicate
        out: list[Any] = []
        for i, name in enumerate(names):
            out += a.machine.replicate(0.0, i, name, 1, sets[name], PREPARE, "g1")
        return out

    def outcome() -> list[Any]:  # the hold, then every partition's: the host's outcome
        out = a.machine.hold("g1", names)
        for name in names:
            out += a.machine.outcome(0.0, None, name, "g1", OUTCOME_COMMIT)
        return out

    a.call("prepare", prepare)
    _run(nodes, views, "prepare")
    a.call("outcome", outcome)
    _run(nodes, views, "outcome")
    for name in names:
        assert nodes["b"].machine.data.values(name) == a.machine.data.values(name)
    for phase in ("prepare", "outcome"):
        print(
            f"{phase}: longest step on the active node {a.longest[phase] * 1000:.1f} ms, "
            f"on the replica {nodes['b'].longest[phase] * 1000:.1f} ms "
            f"({args.partitions} partitions x {args.writes:,} writes)"
        )


if __name__ == "__main__":
    main()
