"""Distributed deadlock detection: every node gathers the cluster's wait-for graph
(docs/design/deadlocks.md).

Each node's lock manager finds the deadlocks that lie inside its store at once
(the requester is the victim, ``tx/locks.py``).  A cycle through two nodes --
``A.1`` waits on A for ``B.7``, which waits on B for ``A.1`` -- is seen by no
single lock manager.  Branch ids are the same on every node
(``"<coordinator>.<session id>"``), so the union of the nodes' local wait-for
edges *is* the global graph between transactions.

Every ``deadlock_every`` seconds the machine asks its store for its local edges
(:class:`ReadWaits` → :class:`LocalWaits`); while it has any (and once more when
they are gone) it sends them to every up peer (``data.waits``).  Each node keeps
the latest edges of every node (dropped when older than ``_FRESH`` periods or
when the node leaves Up) and searches the union for cycles, at each tick and
each time a peer's edges arrive.  The victim of a
cycle is its greatest branch id: every node computes the same one, and only its
coordinator acts.  It does so if the cycle is still there at least one period
after it first saw it (mixing snapshots of different nodes taken at different
times could show a cycle that never existed at one instant; a real one lasts),
and the session is active with an op running: it dooms the session with the
retryable :class:`~nonstop.errors.Deadlock` (``@transactional`` replays it) and
rolls its branches back everywhere, which breaks the cycle.  ``lock_wait``
stays as the backstop (a victim that is committing, a lost message).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.events import ReadWaits
from nonstop.dataplane.state import ACTIVE
from nonstop.runtime.interface import Send, SetTimer

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

WAITS_TIMER = "dp.waits"
"""Every ``deadlock_every``: read the store's wait-for edges, share them, search."""

_FRESH = 4
"""A node's edges older than this many periods are dropped (it stopped sending)."""

Edge = tuple[str, str]


def find_cycles(edges: Iterable[Edge]) -> list[tuple[str, ...]]:
    """One cycle per strongly connected part of the graph that has one (sorted, deterministic).

    A cycle is listed from its smallest branch id, in wait order.
    """
    graph: dict[str, list[str]] = {}
    for waiter, holder in edges:
        if waiter != holder:
            graph.setdefault(waiter, []).append(holder)
    for succ in graph.values():
        succ.sort()
    cycles: list[tuple[str, ...]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        # Iterative DFS from ``start``; a back edge to a node on the path closes a cycle.
        path: list[str] = [start]
        on_path = {start: 0}
        iters = [iter(graph.get(start, ()))]
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                iters.pop()
                node = path.pop()
                del on_path[node]
                done.add(node)
                continue
            if nxt in on_path:
                cycle = path[on_path[nxt] :]
                low = cycle.index(min(cycle))
                cycles.append(tuple(cycle[low:] + cycle[:low]))
                continue
            if nxt in done:
                continue
            on_path[nxt] = len(path)
            path.append(nxt)
            iters.append(iter(graph.get(nxt, ())))
    return sorted(set(cycles))


def victim_of(cycle: tuple[str, ...]) -> str:
    """The branch every node picks as the victim of ``cycle``: the greatest id."""
    return max(cycle)


class DeadlockDetector:
    """The data plane's side of distributed deadlock detection (module doc)."""

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        self.period = dp.config.deadlock_every
        self.local: frozenset[Edge] = frozenset()
        self.remote: dict[str, tuple[frozenset[Edge], float]] = {}
        """node → (its latest edges, when they arrived)."""
        self.suspects: dict[str, float] = {}
        """victim branch id (coordinated here) → when its cycle was first seen."""

    @property
    def enabled(self) -> bool:
        return self.period > 0

    def start(self) -> None:
        if self.enabled:
            self.dp.emit(SetTimer(WAITS_TIMER, self.period))

    def tick(self) -> None:
        """The period is over: ask the store for its edges (answered by ``LocalWaits``)."""
        self.dp.emit(ReadWaits())
        self.dp.emit(SetTimer(WAITS_TIMER, self.period))

    def local_waits(self, edges: Iterable[Edge]) -> None:
        """The store's wait-for edges now: share them, then search."""
        mine = frozenset((w, h) for w, h in edges if isinstance(w, str) and isinstance(h, str))
        had = self.local
        self.local = mine
        if mine or had:
            msg = {"t": "data.waits", "e": sorted([w, h] for w, h in mine)}
            for peer in sorted(self.dp.view.up - {self.dp.name}):
                self.dp.emit(Send(peer, msg))
        self.search()

    def received(self, sender: str, msg: dict[str, Any]) -> None:
        """A peer's edges (``data.waits``)."""
        raw = msg.get("e")
        if not isinstance(raw, list):
            return
        edges = frozenset(
            (e[0], e[1])
            for e in raw
            if isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)
        )
        if edges:
            self.remote[sender] = (edges, self.dp.now)
            self.search()  # a cycle may be complete now: do not wait for the tick
        else:
            self.remote.pop(sender, None)

    def node_down(self, peer: str) -> None:
        self.remote.pop(peer, None)

    def search(self) -> None:
        """Cycles in the gathered graph: doom the victims coordinated here (module doc)."""
        now = self.dp.now
        stale = now - _FRESH * self.period
        for node in [n for n, (_, at) in self.remote.items() if at < stale]:
            del self.remote[node]
        if not self.remote:
            # Every cycle through this node's coordinated sessions spans nodes, and
            # a local one is the lock manager's: nothing to find without a peer's edges.
            self.suspects.clear()
            return
        edges: set[Edge] = set(self.local)
        for node_edges, _ in self.remote.values():
            edges |= node_edges
        prefix = self.dp.name + "."
        seen: dict[str, tuple[str, ...]] = {}
        for cycle in find_cycles(edges):
            victim = victim_of(cycle)
            if victim.startswith(prefix):
                seen.setdefault(victim, cycle)
        self.suspects = {v: self.suspects.get(v, now) for v in seen}
        for victim, cycle in sorted(seen.items()):
            if now - self.suspects[victim] < self.period:
                continue  # seen once: confirm at the next period (module doc)
            self._doom(victim, cycle)

    def _doom(self, victim: str, cycle: tuple[str, ...]) -> None:
        sid_text = victim[len(self.dp.name) + 1 :]
        s = self.dp.sessions.get(int(sid_text)) if sid_text.isdigit() else None
        if s is None or s.state != ACTIVE or s.task is None:
            # Not waiting in an op it could abandon: lock_wait is the backstop.
            state = "gone" if s is None else s.state
            self.dp.log("debug", f"deadlock victim {victim} not doomed ({state})")
            return
        del self.suspects[victim]
        self.dp.stats["deadlock_victims"] += 1
        ring = " -> ".join((*cycle, cycle[0]))
        why = f"distributed deadlock: wait-for cycle {ring}; {victim} is the victim"
        self.dp.log("info", why)
        self.dp.doom(s, errors.Deadlock, why)


__all__ = ["WAITS_TIMER", "DeadlockDetector", "find_cycles", "victim_of"]
