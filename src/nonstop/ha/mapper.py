"""Partition mappers (D3): which partition an object goes to (ha.md section 4).

A mapper is anything with ``partition_for(key, partitions) -> str``.  Built in:

* :class:`ConsistentHashMapper` -- the key's stable hash names a slot of a ring
  of ``ring_size`` slots; each partition owns the slots up to each of its
  points on the ring.  Equal keys map alike on every node and after restarts
  (blake2b of the key's msgpack form, never Python's salted ``hash``), and a
  new partition takes over about 1/(n+1) of the slots.
* :class:`RoundRobinMapper` -- spreads creates evenly over the partitions.

:func:`map_object` is the one door every mapping goes through: a mapper that
raises, or answers a name that is not one of the partitions, becomes a
:class:`MapperError` naming the mapper and the type -- nothing is created.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

import msgpack

DEFAULT_RING_SIZE = 4096
"""Slots of the ring: 'significantly larger' than the partition count (001)."""

POINTS_PER_PARTITION = 64
"""Points each partition places on the ring (smooths the share of each)."""


class MapperError(ValueError):
    """A mapper failed or answered a partition that does not exist."""


class Mapper(Protocol):
    """What a mapper is: the application may write its own."""

    def partition_for(self, key: Any, partitions: Sequence[str]) -> str: ...


def stable_hash(value: Any) -> int:
    """A 64-bit hash of ``value`` that is the same in every process and on every node."""
    packed = msgpack.packb(value, use_bin_type=True)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8).digest(), "big")


class ConsistentHashMapper:
    """Consistent hashing of the key over a ring of ``ring_size`` slots (module doc)."""

    def __init__(self, ring_size: int = DEFAULT_RING_SIZE) -> None:
        if not isinstance(ring_size, int) or isinstance(ring_size, bool) or ring_size < 1:
            raise MapperError(f"ring size must be a positive integer, not {ring_size!r}")
        self.ring_size = ring_size
        self._rings: dict[tuple[str, ...], list[str]] = {}

    def slot_of(self, key: Any) -> int:
        return stable_hash(key) % self.ring_size

    def ring(self, partitions: Sequence[str]) -> list[str]:
        """The owner of every slot for this set of partitions (cached)."""
        names = tuple(sorted(partitions))
        owners = self._rings.get(names)
        if owners is not None:
            return owners
        if not names:
            raise MapperError("no partitions to map to")
        points = sorted(
            (stable_hash([name, i]) % self.ring_size, name)
            for name in names
            for i in range(POINTS_PER_PARTITION)
        )
        positions = [p for p, _ in points]
        owners = []
        for slot in range(self.ring_size):
            # The first point at or after the slot owns it (wrapping around).
            at = bisect.bisect_left(positions, slot)
            owners.append(points[at % len(points)][1])
        self._rings[names] = owners
        return owners

    def partition_for(self, key: Any, partitions: Sequence[str]) -> str:
        return self.ring(partitions)[self.slot_of(key)]

    def partitions_for(self, keys: Sequence[Any], partitions: Sequence[str]) -> list[str]:
        """``[partition_for(k, partitions) for k in keys]`` in one pass: the hash of
        :func:`stable_hash` inlined (a bulk batch maps thousands of keys at once)."""
        owners = self.ring(partitions)
        size = self.ring_size
        pack = msgpack.Packer(use_bin_type=True).pack
        blake2b = hashlib.blake2b
        from_bytes = int.from_bytes
        return [
            owners[from_bytes(blake2b(pack(k), digest_size=8).digest(), "big") % size] for k in keys
        ]


class RoundRobinMapper:
    """Each create goes to the next partition (over partitions, not nodes)."""

    def __init__(self) -> None:
        self._next = 0

    def partition_for(self, key: Any, partitions: Sequence[str]) -> str:
        if not partitions:
            raise MapperError("no partitions to map to")
        names = sorted(partitions)
        name = names[self._next % len(names)]
        self._next += 1
        return name


def map_object(mapper: Mapper, type_name: str, key: Any, partitions: Sequence[str]) -> str:
    """The partition of a new object of ``type_name``, checked (module doc)."""
    who = type(mapper).__name__
    try:
        name = mapper.partition_for(key, partitions)
    except MapperError:
        raise
    except Exception as exc:
        raise MapperError(f"mapper {who} of type {type_name} raised {exc!r}") from exc
    if not isinstance(name, str) or name not in partitions:
        raise MapperError(
            f"mapper {who} of type {type_name} returned {name!r}, not one of its partitions "
            f"{sorted(partitions)}"
        )
    return name


__all__ = [
    "DEFAULT_RING_SIZE",
    "ConsistentHashMapper",
    "Mapper",
    "MapperError",
    "RoundRobinMapper",
    "map_object",
    "stable_hash",
]
