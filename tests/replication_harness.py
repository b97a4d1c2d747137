"""Helpers for the replication machine's unit tests: views, nodes with a disk, a hand network.

:class:`Node` wraps one :class:`~nonstop.replication.machine.ReplicationMachine`
and a dict that plays its disk: :meth:`Node.sync` makes every ``Persist`` the
node emitted durable and feeds the ``Persisted`` events back.  Messages are
delivered by the test itself (:meth:`Node.deliver`), through msgpack as on the
wire, so a test decides what is lost, duplicated or reordered.
"""

from __future__ import annotations

import random
from typing import Any

from nonstop.replication import PartitionView, ReplicationConfig, ReplicationMachine
from nonstop.replication.machine import SLICE
from nonstop.runtime.interface import Persist, Persisted, Received, Send, SetTimer, TimerFired
from nonstop.sim.core import decode, encode

P = "P"


def view(
    epoch: int = 1,
    active: str | None = "a",
    current: tuple[str, ...] = ("a", "b"),
    copying: tuple[str, ...] = (),
    sync: tuple[str, ...] | None = None,
    name: str = P,
) -> PartitionView:
    return PartitionView(name, epoch, active, current, copying, current if sync is None else sync)


class Node:
    """One machine, its disk, and what it emitted that was not looked at yet."""

    def __init__(
        self,
        me: str,
        config: ReplicationConfig | None = None,
        disk: dict[bytes, bytes] | None = None,
        seed: int = 1,
    ) -> None:
        self.me = me
        self.config = config or ReplicationConfig()
        self.disk: dict[bytes, bytes] = dict(disk or {})
        self.machine = ReplicationMachine(me, random.Random(seed), dict(self.disk), self.config)
        self.out: list[Any] = []
        self.now = 0.0

    def restart(self) -> None:
        self.machine = ReplicationMachine(self.me, random.Random(7), dict(self.disk), self.config)
        self.out = []

    def take(self, actions: list[Any]) -> list[Any]:
        self.out += actions
        return actions

    def table(self, *views: PartitionView, acting: tuple[str, ...] = ()) -> list[Any]:
        return self.take(self.machine.on_table(self.now, {v.name: v for v in views}, acting))

    def sync(self) -> list[Any]:
        """Make every pending Persist durable; feed back the Persisted events."""
        persists = [a for a in self.out if isinstance(a, Persist)]
        self.out = [a for a in self.out if not isinstance(a, Persist)]
        got: list[Any] = []
        for persist in persists:
            for key, value in persist.writes:
                if value is None:
                    self.disk.pop(key, None)
                else:
                    self.disk[key] = value
            got += self.take(self.machine.handle(Persisted(self.now, persist.token)))
        return got

    def sends(self, to: str | None = None, kind: str | None = None) -> list[Send]:
        """Take the Sends emitted so far (to ``to``, of type ``kind``)."""
        picked = [
            a
            for a in self.out
            if isinstance(a, Send)
            and (to is None or a.to == to)
            and (kind is None or a.payload.get("t") == kind)
        ]
        self.out = [a for a in self.out if not any(a is p for p in picked)]
        return picked

    def deliver(self, sender: str, payload: Any) -> list[Any]:
        wire = decode(encode(payload))
        return self.take(self.machine.handle(Received(self.now, sender, wire)))

    def slices(self) -> int:
        """Fire the ``rep.slice`` timers set so far (the next step of deferred records);
        returns how many."""
        timers = [a for a in self.out if isinstance(a, SetTimer) and a.name == SLICE]
        self.out = [a for a in self.out if not any(a is t for t in timers)]
        for _ in timers:
            self.take(self.machine.handle(TimerFired(self.now, SLICE)))
        return len(timers)

    def of(self, cls: type) -> list[Any]:
        """Take the actions of type ``cls`` emitted so far."""
        picked = [a for a in self.out if isinstance(a, cls)]
        self.out = [a for a in self.out if not isinstance(a, cls)]
        return picked


def pump(src: Node, dst: Node, kind: str | None = None) -> int:
    """Deliver every message ``src`` has for ``dst``; returns how many."""
    messages = src.sends(dst.me, kind)
    for message in messages:
        dst.deliver(src.me, message.payload)
    return len(messages)


def settle(*nodes: Node, rounds: int = 20) -> None:
    """Sync disks and exchange messages until nothing moves (a perfect network)."""
    for _ in range(rounds):
        moved = 0
        for node in nodes:
            moved += node.slices()
            node.sync()
        for src in nodes:
            for dst in nodes:
                if src is not dst:
                    moved += pump(src, dst)
        for node in nodes:
            node.take(node.machine.on_table(node.now, node.machine.views, node.machine.acting))
        if not moved and not any(isinstance(a, Persist) for n in nodes for a in n.out):
            return
