"""The active side of one partition: its stream, what each replica holds, what waits.

A :class:`Stream` exists while this node is the partition's active node and
has acted for it since it started (a restarted or newly promoted node starts
a new stream, with a new random id).  It keeps every record a replica may
still need, what each replica (:class:`Peer`) has durably acknowledged, the
callers' records waiting for completion (in seq order), and the restore copy
to each copying node.  It survives epoch changes that keep this node active
(D12 drop, restore, enable): pending records are then simply awaited from the
new epoch's replicas.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from nonstop.replication.records import Head, Record
from nonstop.runtime.interface import NodeId


@dataclass(slots=True)
class Peer:
    """One replica as the active node sees it."""

    node: NodeId
    acked: int
    """The highest seq of this stream the replica holds durably (0: it is at the base)."""
    progress_at: float
    """When ``acked`` last moved (or the peer was added): silence is measured from here."""
    heard_at: float = float("-inf")
    """When it last answered OK, with progress or not (a busy replica: ``busy_grace``)."""
    sent: int = 0
    """The highest seq sent since the last resend (a flush sends what follows)."""
    told: int = 0
    """The highest ``completed`` sent to this replica since the last resend (§6, holds)."""
    told_known: int = 0
    """The highest ``completed`` this replica said it knows (its acks echo it): a resend
    tick tells it again from here, as records are sent again from ``acked``."""
    diverged: bool = False
    """It answered that its history is not this stream's base (replication.md, Divergence)."""
    copy_reset: int | None = None
    """Seq of the reset record of a restore copy to it; None: not being copied."""
    copy_keys: list[str] = field(default_factory=list)
    """Keys still to copy, in order."""
    copy_last: int = 0
    """Seq of the last copy record created (the next waits until it is acknowledged)."""

    @property
    def copying(self) -> bool:
        return self.copy_reset is not None

    def copy_finished(self) -> bool:
        return self.copy_reset is not None and not self.copy_keys and self.acked >= self.copy_last


@dataclass(frozen=True, slots=True)
class Deferred:
    """A record to make later (:attr:`Stream.deferred`); ``last``: the caller's ``ref``
    waits for it (the last record of its write set or outcome)."""

    kind: str
    txid: str | None
    writes: dict[str, Any]
    extra: str | None
    ref: Any = None
    last: bool = False
    items: list[tuple[str, Any]] | None = None
    """If set, the record's writes are ``items[start:stop]`` (``span``), made into a dict
    only when the record is made: a large write set is not copied part by part at once."""
    span: tuple[int, int] = (0, 0)

    def weight(self) -> int:
        return self.span[1] - self.span[0] if self.items is not None else len(self.writes)

    def made_writes(self) -> dict[str, Any]:
        if self.items is None:
            return self.writes
        return dict(self.items[self.span[0] : self.span[1]])


@dataclass(slots=True)
class Stream:
    """One partition's records in this active node's order (module doc)."""

    partition: str
    stream_id: int
    base: Head
    epoch: int
    next_seq: int = 1
    log: dict[int, Record] = field(default_factory=dict)
    peers: dict[NodeId, Peer] = field(default_factory=dict)
    pending: deque[tuple[int, Any]] = field(default_factory=deque)
    """(seq, caller's ref) waiting for completion, in seq order."""
    local_durable: int = 0
    """The highest seq durable on this node's own disk."""
    completed: int = 0
    """The highest seq completed (durable here and on every in-sync sync replica, I3)."""
    pruned: int = 0
    """Every record up to this seq has been forgotten (:meth:`prune`)."""
    deferred: deque[Deferred] = field(default_factory=deque)
    """Records of a large prepared write set or outcome not made yet: made a bounded
    number of writes per event, in this order, before any other record of the partition
    (replication.md §4a, "Steps across events")."""
    drain_since: float | None = None
    """When a node this one hands the partition over to finished its copy (None: no
    handover ahead): from then on no new commit or prepare is taken (replication.md §10e)."""

    def drained(self) -> bool:
        """Every caller's record made and completed, and every peer holds every record (but
        a node whose copy is still running: the new active node copies to it again)."""
        return (
            not self.pending
            and not self.deferred
            and all(
                p.acked >= self.last
                for p in self.peers.values()
                if p.copy_finished() or not p.copying
            )
        )

    @property
    def last(self) -> int:
        return self.next_seq - 1

    def add(self, kind: str, **fields: Any) -> Record:
        record = Record(self.next_seq, kind, **fields)
        self.log[record.seq] = record
        self.next_seq += 1
        return record

    def unsent(self, peer: Peer, limit: int) -> list[Record]:
        """Records ``peer`` has not been sent since its last acknowledgement/resend."""
        start = max(peer.sent, peer.acked) + 1
        stop = min(self.next_seq, start + limit)
        return [self.log[s] for s in range(start, stop) if s in self.log]

    def prune(self) -> None:
        """Forget records every peer and this node's disk hold."""
        floor = min([p.acked for p in self.peers.values()] + [self.local_durable])
        # Seqs are given in order and forgotten in order: walk from the last floor, so that
        # a prune after every event costs the records it drops, not the whole log.
        log = self.log
        for seq in range(self.pruned + 1, floor + 1):
            log.pop(seq, None)
        self.pruned = max(self.pruned, floor)

    def can_serve(self, acked: int) -> bool:
        """Can a peer that holds up to ``acked`` be brought up to date from the log?"""
        return all(s in self.log for s in range(acked + 1, self.next_seq))


__all__ = ["Deferred", "Peer", "Stream"]
