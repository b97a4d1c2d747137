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
they are gone, or while a session it coordinates is in a known edge) it sends
them to every up peer (``data.waits``), with the *stamps* of its own sessions
(``_stamp``: a start time fixed once, so every node ranks by the same numbers; a
replay's from its first attempt when ``deadlock_age_max`` lets it, ``claimed_age``).
Each node keeps the latest edges of every node (dropped when older than
``_FRESH`` periods or when the node leaves Up) and, at each tick and each time a
peer's edges arrive:

* **wounds** (``deadlock_wound``, wound-wait): for an edge ``W → H`` whose holder
  it coordinates, if ``W`` is older than ``H`` and ``H`` waits itself, it dooms
  ``H`` at once -- so the oldest transaction is never held up behind younger
  ones that wait, and cycles end within a period;
* **searches the union for cycles**: the victim of a cycle is its youngest
  session, and its coordinator dooms it once the cycle is confirmed on fresh
  edges (a round trip, ``poll``) or a period later -- mixing snapshots of
  different nodes could show a cycle that never existed at one instant.

A doomed session hears the retryable :class:`~nonstop.errors.Deadlock`
(``@transactional`` replays it) and its branches are rolled back everywhere.
``lock_wait`` stays as the backstop (a victim that is committing, a lost message).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
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

_FALLBACK = 3
"""Periods a cycle may outlive the age rule before its greatest id is the victim."""

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


def claimed_age(raw: Any, bound: float) -> float:
    """A replay's seniority (``age`` on ``begin``, seconds since its first attempt began,
    on the client's clock), bounded: untrusted input, so a client can make itself older
    than it is by at most ``bound`` (docs/design/deadlocks.md section 2b).

    None (a first attempt, an older client): 0.  Not a finite number >= 0: BadArgument.
    Over the bound: the bound (a transaction retried for that long ranks as that old).
    """
    if raw is None:
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise errors.BadArgument(f"age must be a number of seconds, not {raw!r:.40}")
    if raw < 0:
        raise errors.BadArgument(f"age must be >= 0, not {raw!r:.40}")
    return min(float(raw), max(0.0, bound))


Rank = Callable[[str], Any]
"""A branch id → its rank as a victim: the greatest in a cycle is the victim."""


def victim_of(cycle: tuple[str, ...], rank: Rank | None = None) -> str:
    """The victim of ``cycle``: the greatest by ``rank`` (default: the greatest id)."""
    return max(cycle) if rank is None else max(cycle, key=rank)


def victims_of(edges: Iterable[Edge], rank: Rank | None = None) -> dict[str, tuple[str, ...]]:
    """Victims that leave ``edges`` without a cycle: victim → a cycle it breaks.

    :func:`find_cycles` gives one cycle per strongly connected part, but under
    heavy contention a part holds many cycles.  Breaking them one victim per
    search, each confirmed a period later, left the load stalled for several
    periods in a row (gaps of 0.3 s at 64 clients on 24 accounts).  So: take the
    victims of the cycles found, remove them from the graph, search again, until
    no cycle is left.  Deterministic, so every node picks the same set from the
    same graph.
    """
    remaining = set(edges)
    out: dict[str, tuple[str, ...]] = {}
    while True:
        cycles = find_cycles(remaining)
        if not cycles:
            return out
        for cycle in cycles:
            out.setdefault(victim_of(cycle, rank), cycle)
        remaining = {(w, h) for w, h in remaining if w not in out and h not in out}


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
        self.local_at = float("-inf")
        """When the store's edges in ``local`` were read."""
        self.polling = False
        """A fresh read was asked for a new suspect: send its edges with ``poll``."""
        self.polled_at = float("-inf")
        self.born: dict[str, float] = {}
        """Other nodes' branch id → its stamp (``_stamp``), as its coordinator sent it."""
        self.stamps: dict[str, float] = {}
        """Branch id of a session coordinated here → its stamp, fixed once sent."""
        self.ahead: dict[str, float] = {}
        """Peer → how far its clock is ahead of this node's (its ``now`` when it sent its
        latest edges minus ours when they arrived: less the transit time)."""
        self.fallback: dict[str, float] = {}
        """Victims by the greatest-id rule (coordinated here) → when first seen."""

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
        self.local_at = self.dp.now
        poll, self.polling = self.polling, False
        stamps = self._stamps_known(mine)
        if mine or had or poll or stamps:
            msg: dict[str, Any] = {
                "t": "data.waits",
                "e": sorted([w, h] for w, h in mine),
                "ts": dict(sorted(stamps.items())),  # in order: the trace digest is hash-seed free
                "now": self.dp.now,
            }
            if poll:
                msg["poll"] = True  # peers: read your edges now, do not wait for the tick
            for peer in sorted(self.dp.view.up - {self.dp.name}):
                self.dp.emit(Send(peer, msg))
        self.search()

    def received(self, sender: str, msg: dict[str, Any]) -> None:
        """A peer's edges (``data.waits``); with ``poll``, it asks for ours, fresh."""
        if msg.get("poll"):
            self.dp.emit(ReadWaits())
        raw = msg.get("e")
        if not isinstance(raw, list):
            return
        edges = frozenset(
            (e[0], e[1])
            for e in raw
            if isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e)
        )
        stamps = msg.get("ts")
        if isinstance(stamps, dict):
            prefix = sender + "."
            for bid, stamp in stamps.items():
                # Only the sender stamps its own sessions; a stamp is a finite number.
                if (
                    isinstance(bid, str)
                    and bid.startswith(prefix)
                    and isinstance(stamp, int | float)
                    and math.isfinite(stamp)
                ):
                    self.born[bid] = float(stamp)
        now = msg.get("now")
        if isinstance(now, int | float) and math.isfinite(now):
            self.ahead[sender] = float(now) - self.dp.now
        if edges:
            self.remote[sender] = (edges, self.dp.now)
            self.search()  # a cycle may be complete now: do not wait for the tick
        else:
            self.remote.pop(sender, None)

    def node_down(self, peer: str) -> None:
        self.remote.pop(peer, None)
        self.ahead.pop(peer, None)

    def search(self) -> None:
        """Cycles in the gathered graph: doom the victims coordinated here (module doc)."""
        now = self.dp.now
        stale = now - _FRESH * self.period
        for node in [n for n, (_, at) in self.remote.items() if at < stale]:
            del self.remote[node]
        edges = self.local.union(*(e for e, _ in self.remote.values()))
        nodes = {b for edge in edges for b in edge}
        self.born = {b: t for b, t in self.born.items() if b in nodes}
        self.stamps = {b: t for b, t in self.stamps.items() if self._session(b) is not None}
        if self.dp.config.deadlock_wound != "off":
            self._wound(edges)
        if not self.remote:
            # Every cycle through this node's coordinated sessions spans nodes, and
            # a local one is the lock manager's: nothing to find without a peer's edges.
            self.suspects.clear()
            return
        prefix = self.dp.name + "."
        seen = {v: c for v, c in victims_of(edges, self._rank).items() if v.startswith(prefix)}
        # Graphs differ between nodes (snapshots of other instants, a stamp not yet
        # arrived): each may leave a cycle to another.  One that outlives that is
        # broken by the id rule.
        by_id = {v: c for v, c in victims_of(edges).items() if v.startswith(prefix)}
        self.fallback = {v: self.fallback.get(v, now) for v in by_id}
        for victim, cycle in by_id.items():
            if victim not in seen and now - self.fallback[victim] >= _FALLBACK * self.period:
                seen[victim] = cycle
        new = any(v not in self.suspects for v in seen)
        self.suspects = {v: self.suspects.get(v, now) for v in seen}
        if new and now - self.polled_at >= self.period / 4:
            # Confirm in a round trip rather than a period: fresh edges from everyone.
            self.polled_at = now
            self.polling = True
            self.dp.emit(ReadWaits())
        for victim, cycle in sorted(seen.items()):
            if not self._confirmed(self.suspects[victim]):
                continue  # seen once: confirm on fresh edges (module doc)
            self._doom(victim, cycle)

    def _wound(self, edges: frozenset[Edge]) -> None:
        """Wound-wait: an older waiter dooms the younger holder it waits for, here if
        this node coordinates the holder (one decider per holder); a waiter whose stamp
        has not arrived ranks as youngest: no wound.  With ``"blocked"`` only a holder
        that is itself waiting: a running one will end soon on its own."""
        prefix = self.dp.name + "."
        blocked = {w for w, _ in edges} if self.dp.config.deadlock_wound == "blocked" else None
        wounded: set[str] = set()
        for waiter, holder in sorted(edges):
            if holder in wounded or not holder.startswith(prefix):
                continue
            if blocked is not None and holder not in blocked:
                continue
            if self._rank(waiter) >= self._rank(holder):
                continue
            s = self._session(holder)
            if not self._woundable(s):
                continue
            wounded.add(holder)
            self.suspects.pop(holder, None)
            self.fallback.pop(holder, None)
            self.dp.stats["deadlock_victims"] += 1
            self.dp.stats["deadlock_wounds"] += 1
            why = f"wounded: the older transaction {waiter} waits for {holder}"
            self.dp.log("debug", why)  # up to one per transfer under contention
            self.dp.doom(s, errors.Deadlock, why)

    def _woundable(self, s: Any) -> bool:
        """Only an active session: one that is committing may have voted yes (its
        outcome is the log's, not ours), and it releases its locks without waiting."""
        return s is not None and s.state == ACTIVE

    def _stamps_known(self, mine: frozenset[Edge]) -> dict[str, float]:
        """Stamps of the sessions coordinated here that are in a known wait-for edge."""
        known = {b for edge in mine for b in edge}
        for node_edges, _ in self.remote.values():
            known |= {b for edge in node_edges for b in edge}
        prefix = self.dp.name + "."
        out: dict[str, float] = {}
        for bid in known:
            if bid.startswith(prefix):
                stamp = self._stamp(bid)
                if stamp is not None:
                    out[bid] = stamp
        return out

    def _stamp(self, bid: str) -> float | None:
        """The rank of a session coordinated here, the same number on every node.

        Its start time, fixed the first time it is needed and sent as it is: every
        node ranks by the same numbers, so all agree on who is older (ages turned into
        start times on each receiver's clock differ by the transit time, and two nodes
        each left a cycle to the other).  On the clock of the node furthest ahead, as
        far as this one knows (``ahead``): the nodes' monotonic clocks need not agree,
        and a node whose clock lags would otherwise rank its sessions oldest for ever.
        A replay ranks from its first attempt (``Session.age``, section 2b): a victim
        replayed as the youngest every time could lose every wound and starve.
        """
        stamp = self.stamps.get(bid)
        if stamp is None:
            s = self._session(bid)
            if s is None:
                return None
            shift = max([0.0, *self.ahead.values()])
            stamp = self.stamps[bid] = s.started - s.age + shift
        return stamp

    def _session(self, bid: str) -> Any:
        sid_text = bid[len(self.dp.name) + 1 :]
        return self.dp.sessions.get(int(sid_text)) if sid_text.isdigit() else None

    def _rank(self, bid: str) -> tuple[float, str]:
        """By stamp (``_stamp``): the greatest is the youngest, the victim (the oldest
        always gets on); unknown stamps rank as youngest; ties by id."""
        if bid.startswith(self.dp.name + "."):
            stamp = self._stamp(bid)
            return (math.inf if stamp is None else stamp, bid)
        return (self.born.get(bid, math.inf), bid)

    def _confirmed(self, first_seen: float) -> bool:
        """Still in a cycle a period after it was first seen, or in edges every node
        (this one included) read after that."""
        if self.dp.now - first_seen >= self.period:
            return True
        return self.local_at > first_seen and all(at > first_seen for _, at in self.remote.values())

    def _doom(self, victim: str, cycle: tuple[str, ...]) -> None:
        sid_text = victim[len(self.dp.name) + 1 :]
        s = self.dp.sessions.get(int(sid_text)) if sid_text.isdigit() else None
        if s is None or s.state != ACTIVE or s.task is None:
            # Not waiting in an op it could abandon: lock_wait is the backstop.
            state = "gone" if s is None else s.state
            self.dp.log("debug", f"deadlock victim {victim} not doomed ({state})")
            return
        del self.suspects[victim]
        self.fallback.pop(victim, None)
        self.dp.stats["deadlock_victims"] += 1
        ring = " -> ".join((*cycle, cycle[0]))
        why = f"distributed deadlock: wait-for cycle {ring}; {victim} is the victim"
        self.dp.log("info", why)
        self.dp.doom(s, errors.Deadlock, why)


__all__ = [
    "WAITS_TIMER",
    "DeadlockDetector",
    "claimed_age",
    "find_cycles",
    "victim_of",
    "victims_of",
]
