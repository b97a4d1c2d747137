"""Data-path work that finds this node's lease lapsed waits for it to act again.

A node acknowledges reads and writes of a partition only while it *acts* for it
(ha.md §8: active in the applied table at the op's epoch, lease held, quorum).
A lease lapses by time alone: a renewal late in the cluster log, or this node's
own event loop held up past the renewal (a query reading 10,000 objects in one
op, a large swap's commit).  Before, every op that met a lapse -- checked before
it ran, or at its answer because the op itself outlasted the lease -- was
refused ``NotActive`` at once, and the client's transaction failed although
nothing moved: the partition was still this node's, at the same epoch, and the
next renewal (within a few hundred milliseconds) gave the lease back.  Seen in
CI: the locking query right after ``test_large_partition_overwrite``'s swap.

The rule (the data plane's twin of the replication host's, replication.md §4a):
work refused **only** because this node does not act *now* -- the applied
table still names the fenced epoch of every partition -- waits, doing nothing
more, until

* the node acts for every fenced (partition, epoch) again: it goes on as if
  never stopped (the op runs; an answer already computed is delivered);
* the applied epoch of one of them moves (the partition changed hands or its
  copies changed): refused ``NotActive`` as before, the client retries on the
  current active node;
* ``limit`` seconds pass: refused ``NotActive``.

Why delivering an answer computed during the lapse is safe: it is delivered
only while acting at the same epoch.  Acting now means this node's last
renewal accepted by the table was proposed at ``p`` with ``now < p + lease``,
and any failover of the partition is a later entry in the log (the epoch has
not moved here) whose new active node waits ``lease * (1 + drift)`` from when
it applied that renewal -- so no other node acted for the partition at any
instant up to now, in particular while the op ran.

A waiting op holds what it held (its locks, its branch); it is bounded by
``limit`` (a participant's by half the coordinator's ``rpc_timeout``, so the
coordinator never gives up on an op that is only waiting).

The vote (``DataPlane.take_branch``) is asked from outside the machine's events,
by the participant's resource manager: there ``DataPlane.vote_lapsed`` tells it
that the refusal is a lapse alone, and the resource manager asks again until the
node acts or its own wait is over (``participant.StoreResourceManager.open``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nonstop import errors
from nonstop.runtime.interface import SetTimer

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

LAPSE_TIMER = "dp.lapse"
"""Fires at the earliest deadline of the waiting work (refused then)."""


@dataclass(slots=True)
class _Waiting:
    fence: dict[str, int]
    until: float
    go: Callable[[], None]
    refuse: Callable[[errors.NotActive], None]


class LapseWaits:
    """The work of one data plane waiting out a lapse of its lease (module doc)."""

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        self._waiting: list[_Waiting] = []
        self._timer_at = float("inf")

    def __len__(self) -> int:
        return len(self._waiting)

    def lapsed_only(self, fence: Mapping[str, int]) -> bool:
        """Whether this node's applied table names every fenced epoch: a refusal of
        ``fence`` can then only be because the node does not act *now*."""
        return all(self.dp.epoch_here(name) == epoch for name, epoch in fence.items())

    def wait(
        self,
        fence: Mapping[str, int],
        limit: float,
        go: Callable[[], None],
        refuse: Callable[[errors.NotActive], None],
    ) -> bool:
        """Hold ``go`` until this node acts for ``fence`` again (module doc); False if
        the refusal is not a lapse alone (or ``limit`` is 0): refuse at once."""
        if limit <= 0 or not self.lapsed_only(fence):
            return False
        until = self.dp.now + limit
        self._waiting.append(_Waiting(dict(fence), until, go, refuse))
        self.dp.stats["lapse_waits"] += 1
        if until < self._timer_at:
            self._timer_at = until
            self.dp.emit(SetTimer(LAPSE_TIMER, limit))
        return True

    def settle(self) -> None:
        """After an event: waiting work goes on, is refused, or waits on."""
        if not self._waiting:
            return
        now = self.dp.now
        waiting, self._waiting = self._waiting, []
        for w in waiting:
            refused = self.dp.not_active(w.fence)
            if refused is not None and now < w.until and self.lapsed_only(w.fence):
                self._waiting.append(w)
                continue
            if refused is None:
                self.dp.stats["lapses_waited_out"] += 1
                w.go()
            else:
                self.dp.stats["lapse_refusals"] += 1
                w.refuse(refused)
        self._rearm()

    def timer_fired(self) -> None:
        """:data:`LAPSE_TIMER`: the deadlines due are refused at the settle that follows."""
        self._timer_at = float("inf")

    def _rearm(self) -> None:
        first = min((w.until for w in self._waiting), default=float("inf"))
        if first < self._timer_at:
            self._timer_at = first
            self.dp.emit(SetTimer(LAPSE_TIMER, max(0.0, first - self.dp.now)))


__all__ = ["LAPSE_TIMER", "LapseWaits"]
