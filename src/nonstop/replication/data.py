"""A node's copy of its partitions: objects, prepared records and the place in the history.

This is the state replication changes and the durable layout it persists
(``Persist`` only; recovered from the ``recovered`` mapping at construction):

* ``rep/d/<P>\\0<key>`` -> msgpack value: an object of partition P;
* ``rep/p/<P>\\0<txid>`` -> msgpack write set: a prepared record, until its outcome;
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
    OUTCOME,
    OUTCOME_COMMIT,
    PREPARE,
    RESET,
    Head,
    Record,
)

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

    @classmethod
    def recover(cls, recovered: Mapping[bytes, bytes]) -> PartitionData:
        data = cls()
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
                data.prepared.setdefault(part.decode(), {})[name.decode()] = plain.unpack(raw)
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
        return self.prepared.get(partition, {})

    def apply(self, partition: str, stream: int, record: Record, me: str) -> list[Write]:
        """Apply ``record`` of ``stream`` here; return its durable writes (head last)."""
        out: list[Write] = []
        kind = record.kind
        if kind == COMMIT or (kind == COPY and record.extra == me):
            out += self._write(partition, record.writes)
        elif kind == PREPARE and record.txid is not None:
            self.prepared.setdefault(partition, {})[record.txid] = dict(record.writes)
            out.append((_key(K_PREPARED, partition, record.txid), plain.pack(dict(record.writes))))
        elif kind == OUTCOME and record.txid is not None:
            writes = self.prepared.get(partition, {}).pop(record.txid, None)
            if writes is not None:
                out.append((_key(K_PREPARED, partition, record.txid), None))
                if record.extra == OUTCOME_COMMIT:
                    out += self._write(partition, writes)
        elif kind == RESET and record.extra == me:
            out += self._clear(partition)
            for txid, writes in record.writes.items():
                self.prepared.setdefault(partition, {})[txid] = dict(writes)
                out.append((_key(K_PREPARED, partition, txid), plain.pack(dict(writes))))
        self.heads[partition] = (stream, record.seq)
        out.append((K_HEAD + partition.encode(), plain.pack([stream, record.seq])))
        return out

    def discard_prepared(self, partition: str) -> list[Write]:
        """Forget every prepared record of ``partition`` (only the broken variant does this)."""
        gone = self.prepared.pop(partition, {})
        return [(_key(K_PREPARED, partition, txid), None) for txid in gone]

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
        out += [
            (_key(K_PREPARED, partition, txid), None) for txid in self.prepared.pop(partition, {})
        ]
        return out


__all__ = ["K_DATA", "K_HEAD", "K_OWN", "K_PREPARED", "PartitionData", "Write"]
