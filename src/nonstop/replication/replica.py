"""The replica side: fencing (I2), order (I4), buffering and idempotence.

A part of a ``rep`` message -- ``(P, e, stream, base, records)`` from node S
-- is applied here only if

* ``e`` equals this node's applied epoch of P, S is P's active node at that
  epoch and this node is in P's current list.  A lower epoch is refused
  ``stale`` (the sender's epoch is over: fencing); a higher one is answered
  ``retry`` and nothing is applied until the cluster log here has caught up;
* in the stream's order: record ``seq`` only after ``seq - 1`` of the same
  stream, record 1 only if this node's place is the stream's base.  Records
  that arrive early are buffered (up to :data:`BUFFER_LIMIT`), duplicates
  (``seq`` already applied) are skipped.  A ``reset`` record aimed at this
  node (a restore copy starting) is applied whatever the place: it replaces
  everything this node held of P.

The answer's status: ``ok`` (with the highest seq of the stream held
*durably* -- the machine sends it after ``Persisted``), ``stale``, ``retry``,
``diverged`` (this node's place is neither in the stream nor its base: it
holds records the active node never had, or lacks some it had; the active
node drops it from the list and restores it, replication.md "Divergence") or
``unknown`` (no such partition here).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nonstop.replication.data import PartitionData, Write
from nonstop.replication.records import RESET, Head, Record
from nonstop.replication.view import PartitionView
from nonstop.runtime.interface import NodeId

OK = "ok"
STALE = "stale"
RETRY = "retry"
DIVERGED = "diverged"
UNKNOWN = "unknown"
STATUSES = (OK, STALE, RETRY, DIVERGED, UNKNOWN)

BUFFER_LIMIT = 4096
"""Records buffered ahead of a gap per partition; more are dropped (the sender resends)."""


@dataclass(slots=True)
class _Incoming:
    stream: int
    buffer: dict[int, Record] = field(default_factory=dict)


class ReplicaSide:
    """Applies the records of the partitions this node replicates (module doc)."""

    def __init__(self, me: NodeId, data: PartitionData, *, fence: bool = True) -> None:
        self.me = me
        self.data = data
        self.fence = fence
        """False only in the simulator's broken variant (a stale epoch is accepted)."""
        self._incoming: dict[str, _Incoming] = {}

    def admit(self, view: PartitionView | None, epoch: int, sender: NodeId) -> str:
        """May a part of ``sender`` at ``epoch`` be applied here? ``ok`` or why not."""
        if view is None:
            return UNKNOWN
        if epoch > view.epoch:
            return RETRY
        if not self.fence:
            return OK
        if epoch < view.epoch or view.active != sender or sender == self.me:
            return STALE
        if not view.holds(self.me):
            return STALE
        return OK

    def receive(
        self, partition: str, stream: int, base: Head, records: list[Record]
    ) -> tuple[str, list[Write]]:
        """Buffer ``records`` and apply what is in order; (status, durable writes)."""
        data = self.data
        inc = self._incoming.get(partition)
        if inc is None or inc.stream != stream:
            inc = self._incoming[partition] = _Incoming(stream)
        head = data.head(partition)
        for incoming in records:
            if head[0] == stream and incoming.seq <= head[1]:
                continue  # a duplicate
            if len(inc.buffer) < BUFFER_LIMIT or incoming.seq in inc.buffer:
                inc.buffer[incoming.seq] = incoming
        writes: list[Write] = []
        while True:
            head = data.head(partition)
            in_stream = head[0] == stream
            resets = [
                s
                for s, r in inc.buffer.items()
                if r.kind == RESET and r.extra == self.me and (not in_stream or s > head[1])
            ]
            if resets:
                seq = max(resets)
                writes += data.apply(partition, stream, inc.buffer[seq], self.me)
                for old in [s for s in inc.buffer if s <= seq]:
                    del inc.buffer[old]
                continue
            nxt = head[1] + 1 if in_stream else 1 if head == base else None
            record: Record | None = inc.buffer.pop(nxt, None) if nxt is not None else None
            if record is None:
                break
            writes += data.apply(partition, stream, record, self.me)
        head = data.head(partition)
        status = OK if head[0] == stream or head == base else DIVERGED
        return status, writes

    def forget_incoming(self, partition: str) -> None:
        """This node starts its own stream of ``partition``: records buffered from others go."""
        self._incoming.pop(partition, None)


__all__ = ["DIVERGED", "OK", "RETRY", "STALE", "STATUSES", "UNKNOWN", "ReplicaSide"]
