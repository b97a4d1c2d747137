"""A node's copy of its partitions: objects, prepared records and the place in the history.

This is the state replication changes and the durable layout it persists
(``Persist`` only; recovered from the ``recovered`` mapping at construction):

* ``rep/d/<P>\\0<key>`` -> msgpack value: an object of partition P;
* ``rep/p/<P>\\0<txid>`` -> msgpack write set: a prepared record, until its outcome;
  a prepared record that came in parts (``records.py``) has its part ``i`` >= 1
  at ``rep/p/<P>\\0<txid>\\0<i>``; a part that is not the last is stored
  wrapped in a list (``[write set]``), so a copy knows after a restart whether
  it holds the record whole;
* ``rep/h/<P>`` -> msgpack ``[stream, seq]``: the last record applied;
* ``rep/o/<P>`` -> msgpack stream id: the last stream this node started for P
  (written with that stream's first record): whether the last record applied
  here is this node's own (``holds.py``).

Applying a record changes memory and returns the durable writes of that one
step, head included, so that a record and the place it moves the partition to
are one atomic ``Persist``.  In the simulator this *is* the node's store; the
real node will put an adapter over its object store behind the same three
operations (apply, values, recover) -- replication.md "Wiring".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.net import plain
from nonstop.replication.records import (
    COMMIT,
    COPY,
    EMPTY,
    MORE,
    OUTCOME,
    OUTCOME_COMMIT,
    OUTCOME_PART,
    PREPARE,
    RESET,
    Head,
    Record,
)

KEYS = b"rep/"
"""Every durable key of the replication machine starts with it (a real node writes them on
a writer of their own: ``node/machine.py``)."""
K_DATA = b"rep/d/"
K_PREPARED = b"rep/p/"
K_HEAD = b"rep/h/"
K_OWN = b"rep/o/"

Write = tuple[bytes, bytes | None]


def _key(prefix: bytes, partition: str, name: str) -> bytes:
    return prefix + partition.encode() + b"\0" + name.encode()


@dataclass(slots=True)
class PartitionData:
    """Objects, prepared records and heads of every partition this node holds (module doc)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    prepared: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    heads: dict[str, Head] = field(default_factory=dict)
    own: dict[str, int] = field(default_factory=dict)
    """Partition -> the last stream this node started for it."""
    parts: dict[tuple[str, str], int] = field(default_factory=dict)
    """(P, txid) -> how many durable parts its prepared record has (absent: one)."""
    incomplete: dict[str, set[str]] = field(default_factory=dict)
    """P -> the txids whose prepared record here still lacks its last part."""

    @classmethod
    def recover(cls, recovered: Mapping[bytes, bytes]) -> PartitionData:
        data = cls()
        parts: dict[tuple[str, str], list[tuple[int, Any]]] = {}
        for key, raw in recovered.items():
            if key.startswith(K_HEAD):
                stream, seq = plain.unpack(raw)
                data.heads[key[len(K_HEAD) :].decode()] = (int(stream), int(seq))
            elif key.startswith(K_OWN):
                data.own[key[len(K_OWN) :].decode()] = int(plain.unpack(raw))
            elif key.startswith(K_DATA):
                part, _, name = key[len(K_DATA) :].partition(b"\0")
                data.objects.setdefault(part.decode(), {})[name.decode()] = plain.unpack(raw)
            elif key.startswith(K_PREPARED):
                part, _, name = key[len(K_PREPARED) :].partition(b"\0")
                txid, _, index = name.decode().partition("\0")
                parts.setdefault((part.decode(), txid), []).append(
                    (int(index or 0), plain.unpack(raw))
                )
        for (partition, txid), stored in parts.items():
            writes: dict[str, Any] = {}
            whole = False
            for _, value in sorted(stored, key=lambda item: item[0]):
                whole = whole or isinstance(value, dict)
                writes.update(value if isinstance(value, dict) else value[0])
            data.prepared.setdefault(partition, {})[txid] = writes
            data.parts[(partition, txid)] = max(i for i, _ in stored) + 1
            if not whole:
                data.incomplete.setdefault(partition, set()).add(txid)
        return data

    def head(self, partition: str) -> Head:
        return self.heads.get(partition, EMPTY)

    def last_is_own(self, partition: str) -> bool:
        """Was the last record applied here of a stream this node made (not a replica's)?"""
        return self.head(partition)[0] == self.own.get(partition)

    def start_own(self, partition: str, stream: int) -> Write:
        """This node starts ``stream`` for ``partition``: the durable write (with its first
        record)."""
        self.own[partition] = stream
        return (K_OWN + partition.encode(), plain.pack(stream))

    def values(self, partition: str) -> dict[str, Any]:
        return self.objects.get(partition, {})

    def prepared_of(self, partition: str) -> dict[str, dict[str, Any]]:
        """Every prepared record of ``partition`` here, whole or not (:meth:`whole`)."""
        return self.prepared.get(partition, {})

    def whole(self, partition: str, txid: str) -> bool:
        """Does this copy hold ``txid``'s prepared record with its last part?  One that
        lacks it was never voted on (the vote waits for the last part's completion): it can
        only be resolved as abort."""
        return txid in self.prepared_of(partition) and txid not in self.incomplete.get(
            partition, ()
        )

    def whole_prepared(self, partition: str) -> dict[str, dict[str, Any]]:
        """The prepared records of ``partition`` held whole (what a restore copy carries)."""
        partial = self.incomplete.get(partition, set())
        return {t: w for t, w in self.prepared_of(partition).items() if t not in partial}

    def apply(self, partition: str, stream: int, record: Record, me: str) -> list[Write]:
        """Apply ``record`` of ``stream`` here; return its durable writes (head last)."""
        out: list[Write] = []
        kind = record.kind
        if kind == COMMIT or (kind == COPY and record.extra == me):
            out += self._write(partition, record.writes)
        elif kind == PREPARE and record.txid is not None:
            out.append(self._prepare(partition, record.txid, record.writes, record.extra != MORE))
        elif kind == OUTCOME and record.txid is not None:
            writes = self.prepared.get(partition, {}).get(record.txid)
            if writes is not None and record.extra == OUTCOME_PART:
                # Some writes of a committed prepared record: applied now and taken out of
                # the record in memory (the rest follows).  The record stays on the disk
                # whole until the last outcome record: after a restart its writes already
                # applied are applied again, with the same values (nothing else writes
                # them in between: the active node appends nothing else to P meanwhile).
                out += self._write(
                    partition, {k: writes.pop(k) for k in record.writes if k in writes}
                )
            elif writes is not None:
                out += self._forget_prepared(partition, record.txid)
                if record.extra == OUTCOME_COMMIT:
                    out += self._write(partition, writes)
        elif kind == RESET and record.extra == me:
            out += self._clear(partition)
            for txid, writes in record.writes.items():
                out.append(self._prepare(partition, txid, writes, True))
        self.heads[partition] = (stream, record.seq)
        out.append((K_HEAD + partition.encode(), plain.pack([stream, record.seq])))
        return out

    def discard_prepared(self, partition: str) -> list[Write]:
        """Forget every prepared record of ``partition`` (only the broken variant does this)."""
        out: list[Write] = []
        for txid in list(self.prepared.get(partition, {})):
            out += self._forget_prepared(partition, txid)
        return out

    def _prepare(self, partition: str, txid: str, writes: Mapping[str, Any], last: bool) -> Write:
        """Add a part of ``txid``'s prepared record (the first part starts it)."""
        held = self.prepared.setdefault(partition, {})
        index = 0
        if txid in held:
            index = self.parts.get((partition, txid), 1)
            self.parts[(partition, txid)] = index + 1
        held.setdefault(txid, {}).update(writes)
        partial = self.incomplete.setdefault(partition, set())
        if last:
            partial.discard(txid)
        else:
            partial.add(txid)
        name = txid if index == 0 else f"{txid}\0{index}"
        value = dict(writes) if last else [dict(writes)]
        return (_key(K_PREPARED, partition, name), plain.pack(value))

    def _forget_prepared(self, partition: str, txid: str) -> list[Write]:
        """Drop ``txid``'s prepared record of ``partition``: the deletes of every part."""
        self.prepared.get(partition, {}).pop(txid, None)
        self.incomplete.get(partition, set()).discard(txid)
        count = self.parts.pop((partition, txid), 1)
        names = [txid] + [f"{txid}\0{i}" for i in range(1, count)]
        return [(_key(K_PREPARED, partition, name), None) for name in names]

    def _write(self, partition: str, writes: Mapping[str, Any]) -> list[Write]:
        objects = self.objects.setdefault(partition, {})
        out: list[Write] = []
        for name, value in writes.items():
            if value is None:
                objects.pop(name, None)
                out.append((_key(K_DATA, partition, name), None))
            else:
                objects[name] = value
                out.append((_key(K_DATA, partition, name), plain.pack(value)))
        return out

    def _clear(self, partition: str) -> list[Write]:
        out: list[Write] = [
            (_key(K_DATA, partition, name), None) for name in self.objects.pop(partition, {})
        ]
        for txid in list(self.prepared.get(partition, {})):
            out += self._forget_prepared(partition, txid)
        return out


__all__ = ["KEYS", "K_DATA", "K_HEAD", "K_OWN", "K_PREPARED", "PartitionData", "Write"]
