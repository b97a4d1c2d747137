"""The records an active node streams to its replicas, and their wire form.

A record is one step of a partition's history in the active node's order
(I4): its sequence number in the active node's *stream* (below), a kind, and
what it carries.  Records are state-based -- a write set maps keys to their
new value (``None`` deletes) -- so applying one is idempotent and a copy batch
is just the values of some keys at the record's place in the stream.

Kinds:

* ``commit`` -- a one-phase commit: its write set is applied;
* ``prepare`` -- a prepared record (``txid``, write set): kept, not applied,
  until its outcome.  A large write set goes as several ``prepare`` records of
  the same ``txid`` (parts of a bounded number of writes, in order); every part
  but the last has ``extra`` = ``more``.  A copy holds the prepared record
  *whole* once its last part is applied (``data.py``);
* ``outcome`` -- ``txid``'s outcome (``extra`` = ``commit`` | ``abort``): a
  prepared record is applied (commit) or dropped, then forgotten.  The commit of
  a large prepared record goes as several ``outcome`` records: every one but the
  last has ``extra`` = ``part`` and names in ``writes`` (its keys, values None)
  the writes of the prepared record it applies now; the last (``commit``)
  applies what is left and forgets the record (replication.md §4a);
* ``noop`` -- nothing; an active node that must make sure its replicas are
  where it is (an answer from state it did not write itself) sends one;
* ``reset`` -- for ``extra`` = the target node only: the start of a restore
  copy (D9).  The target forgets everything it held of the partition and
  takes the prepared records in ``writes`` (txid -> write set); for every
  other replica it is a noop;
* ``copy`` -- for the target only: a batch of the partition's objects (key ->
  value) as of the record's place in the stream; a noop for the others (their
  state at that place is the same values).

A **stream** is one active node's numbering of a partition's records: a
random 62-bit id drawn when the node starts acting for the partition, and
sequence numbers from 1.  Its *base* is the place (stream, seq) the active
node's state was at when the stream started; a replica applies record 1 only
from exactly that place (else the two have diverged: section "Divergence" of
replication.md).  Wire form of a record: ``[seq, kind, txid, writes, extra]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COMMIT = "commit"
PREPARE = "prepare"
OUTCOME = "outcome"
NOOP = "noop"
RESET = "reset"
COPY = "copy"
KINDS = (COMMIT, PREPARE, OUTCOME, NOOP, RESET, COPY)
TARGETED = (RESET, COPY)
"""Kinds that carry data for one target node only."""

MORE = "more"
"""``extra`` of a ``prepare`` record that is not the last part of its write set."""

OUTCOME_COMMIT = "commit"
OUTCOME_ABORT = "abort"
OUTCOME_PART = "part"
"""``extra`` of an ``outcome`` record that applies some writes of a committed prepared record
(the keys in its ``writes``) and keeps the rest for the records that follow (module doc)."""

Head = tuple[int, int]
"""A place in a partition's history: (stream id, seq).  ``(0, 0)``: nothing yet."""
EMPTY: Head = (0, 0)


@dataclass(frozen=True, slots=True)
class Record:
    """One step of a partition's history (module doc)."""

    seq: int
    kind: str
    txid: str | None = None
    writes: dict[str, Any] = field(default_factory=dict)
    extra: str | None = None

    def to_wire(self, node: str) -> list[Any]:
        """The form sent to ``node``: a targeted record is a noop for anyone else."""
        if self.kind in TARGETED and self.extra != node:
            return [self.seq, NOOP, None, {}, None]
        return [self.seq, self.kind, self.txid, self.writes, self.extra]


def record_from_wire(raw: Any) -> Record | None:
    """The record of a wire form, or None if it is malformed (bad input is dropped)."""
    if not isinstance(raw, list) or len(raw) != 5:
        return None
    seq, kind, txid, writes, extra = raw
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return None
    if kind not in KINDS or not isinstance(writes, dict):
        return None
    if not all(isinstance(k, str) for k in writes):
        return None
    if txid is not None and not isinstance(txid, str):
        return None
    if extra is not None and not isinstance(extra, str):
        return None
    if kind in (PREPARE, OUTCOME) and txid is None:
        return None
    if kind == OUTCOME and extra not in (OUTCOME_COMMIT, OUTCOME_ABORT, OUTCOME_PART):
        return None
    if kind == PREPARE and extra not in (None, MORE):
        return None
    if kind in TARGETED and extra is None:
        return None
    if kind == RESET and not all(isinstance(w, dict) for w in writes.values()):
        return None
    return Record(seq, kind, txid, writes, extra)


def head_from_wire(raw: Any) -> Head | None:
    if (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in raw)
    ):
        return (raw[0], raw[1])
    return None


__all__ = [
    "COMMIT",
    "COPY",
    "EMPTY",
    "KINDS",
    "MORE",
    "NOOP",
    "OUTCOME",
    "OUTCOME_ABORT",
    "OUTCOME_COMMIT",
    "OUTCOME_PART",
    "PREPARE",
    "RESET",
    "Head",
    "Record",
    "head_from_wire",
    "record_from_wire",
]
