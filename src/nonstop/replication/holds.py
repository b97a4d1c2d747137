"""Durable holds on a participant's phase-two acknowledgement (replication.md §6, §10b).

A two-phase-commit participant's prepared record of ``txid`` is a record of
its partitions' streams: every sync copy of those partitions holds it.  Once
every participant acknowledged phase two, the coordinator lets the decision
log forget ``txid``; a copy promoted *after* that, still holding the prepared
record without its outcome, could only guess (it resolves a forgotten txid as
abort).  So the participant acknowledges only when no copy that may be
promoted still lacks the outcome: a **hold** on ``txid`` per partition,
released when, for that partition,

* this node's copy no longer holds ``txid`` prepared, and
* either this node acts for the partition and a record of its stream made
  *after* that completed (it is on every in-sync sync replica, I3) -- the
  outcome record itself or anything later;
* or this node has no stream for the partition and its copy last applied a
  record of *another* node's stream (that node, the active one, no longer
  holds ``txid`` prepared either: it resolved it).  A copy whose last record
  is this node's own (written while it was active, not yet known to be on the
  replicas) keeps the hold until the active node's stream reaches it.

Holds are durable (``rep/u/<txid>`` -> the partitions still held), written
before the outcome is applied here, so that a participant restarted after it
applied the outcome -- which then acknowledges from its tombstone -- still
holds the acknowledgement back.  The rules above use only durable state (the
copy's prepared records, its head, which stream is this node's) and the
applied table, so they hold after a restart too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nonstop.net import plain
from nonstop.replication.data import Write

K_HOLD = b"rep/u/"


@dataclass(slots=True)
class Holds:
    """txid -> the partitions whose copies may still lack its outcome (module doc)."""

    held: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def recover(cls, recovered: Mapping[bytes, bytes]) -> Holds:
        holds = cls()
        for key, raw in recovered.items():
            if key.startswith(K_HOLD):
                parts = plain.unpack(raw)
                if parts:
                    holds.held[key[len(K_HOLD) :].decode()] = {str(p) for p in parts}
        return holds

    def is_held(self, txid: str) -> bool:
        return txid in self.held

    def add(self, txid: str, partitions: Iterable[str]) -> list[Write]:
        """Hold ``txid`` on ``partitions`` too; the durable write (none if nothing new)."""
        parts = self.held.get(txid, set())
        new = set(partitions) - parts
        if not new:
            return []
        parts = self.held[txid] = parts | new
        return [self._write(txid, parts)]

    def release(self, txid: str, partition: str) -> list[Write]:
        """``partition``'s copies hold ``txid``'s outcome; the durable write."""
        parts = self.held.get(txid)
        if parts is None or partition not in parts:
            return []
        parts.discard(partition)
        if not parts:
            del self.held[txid]
        return [self._write(txid, parts)]

    @staticmethod
    def _write(txid: str, parts: set[str]) -> Write:
        key = K_HOLD + txid.encode()
        return (key, plain.pack(sorted(parts)) if parts else None)


__all__ = ["K_HOLD", "Holds"]
