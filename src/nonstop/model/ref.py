"""Object references (C1): globally unique, immutable, and they say where an object lives.

A reference is 20 bytes, big-endian (``>QIQ``): an 8-byte **location code**, a
4-byte **timestamp** and an 8-byte **sequence**.  References sort by (location,
timestamp, sequence) in LMDB, so the objects of one location are one key range
(the location is the key prefix).  The timestamp is the creating store's
(seconds at store creation) for a plain create into the store's own location,
and zero for a create into a partition: a partition's references name no node,
and sort in creation order (epoch, then counter) across failovers.

The location code names where the object belongs: a partition
(``nonstop.ha.partition_table.partition_location(name)``, a hash of the partition
name) when the data path creates into a partition, else the creating store's own
location (random or derived from the cluster-unique node name; today's default).
It never changes, so a partition's objects keep their identity across failover.

The sequence is ``(epoch << 40) | counter`` (store format 3): the partition's epoch
at creation (24 bits) and a counter kept per (location, epoch), durably, by the
store.  One node is active per (partition, epoch) (ha.md I1), so two nodes never
hand out the same sequence for one location.  The store's own location uses
epoch 0, where the sequence is the plain counter of formats 1 and 2.
"""

from __future__ import annotations

import struct

from nonstop.errors import BadArgument

REF_SIZE = 20
_LAYOUT = struct.Struct(">QIQ")
LOCATION_BYTES = 8
"""A reference's first 8 bytes are its location code: the key prefix of its location."""
EPOCH_BITS = 24
COUNTER_BITS = 40
MAX_EPOCH = (1 << EPOCH_BITS) - 1
MAX_COUNTER = (1 << COUNTER_BITS) - 1
_MAX_LOCATION = (1 << 64) - 1


def check_location(location: object) -> int:
    """``location`` as a location code (an int in 0..2**64-1); BadArgument naming it if not."""
    if not isinstance(location, int) or isinstance(location, bool):
        got = f"{type(location).__name__} {location!r:.40}"
        raise BadArgument(f"a location code is an int (0..2**64-1), got {got}")
    if not 0 <= location <= _MAX_LOCATION:
        raise BadArgument(f"a location code is in 0..2**64-1, got {location}")
    return location


def check_epoch(epoch: object) -> int:
    """``epoch`` as a partition epoch (an int in 0..2**24-1); BadArgument naming it if not."""
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise BadArgument(f"an epoch is an int, got {type(epoch).__name__} {epoch!r:.40}")
    if not 0 <= epoch <= MAX_EPOCH:
        raise BadArgument(
            f"an epoch is in 0..{MAX_EPOCH} (it takes the top {EPOCH_BITS} bits of a "
            f"reference's sequence), got {epoch}"
        )
    return epoch


def location_prefix(location: int) -> bytes:
    """The 8-byte key prefix of every reference of ``location`` (checked)."""
    return check_location(location).to_bytes(LOCATION_BYTES, "big")


def make_sequence(epoch: int, counter: int) -> int:
    """A reference's sequence: ``(epoch << 40) | counter``."""
    return (epoch << COUNTER_BITS) | counter


def split_sequence(sequence: int) -> tuple[int, int]:
    """``(epoch, counter)`` of a reference's sequence."""
    return sequence >> COUNTER_BITS, sequence & MAX_COUNTER


class Ref:
    """The immutable identity of a managed object."""

    __slots__ = ("raw",)

    raw: bytes

    def __init__(self, raw: bytes) -> None:
        if len(raw) != REF_SIZE:
            raise ValueError(f"a reference is {REF_SIZE} bytes, got {len(raw)}")
        object.__setattr__(self, "raw", bytes(raw))

    @classmethod
    def make(cls, location: int, timestamp: int, counter: int) -> Ref:
        return cls(_LAYOUT.pack(location, timestamp, counter))

    @classmethod
    def parse(cls, text: str) -> Ref:
        """Inverse of ``str(ref)``: ``"<location hex>-<timestamp>-<counter>"``."""
        try:
            loc, ts, counter = text.split("-")
            return cls.make(int(loc, 16), int(ts), int(counter))
        except (ValueError, struct.error) as exc:
            raise ValueError(f"not a nonstop reference: {text!r}") from exc

    @property
    def location(self) -> int:
        return int(_LAYOUT.unpack(self.raw)[0])

    @property
    def timestamp(self) -> int:
        """The creating store's timestamp (a plain create), or 0 (a create into a partition)."""
        return int(_LAYOUT.unpack(self.raw)[1])

    @property
    def counter(self) -> int:
        """The whole 8-byte sequence (``(epoch << 40) | counter``; see the module doc)."""
        return int(_LAYOUT.unpack(self.raw)[2])

    @property
    def epoch(self) -> int:
        """The epoch of the location at creation (0 for a store's own location)."""
        return split_sequence(self.counter)[0]

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Ref is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and other.raw == self.raw

    def __lt__(self, other: Ref) -> bool:
        return self.raw < other.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __str__(self) -> str:
        loc, ts, counter = _LAYOUT.unpack(self.raw)
        return f"{loc:016x}-{ts}-{counter}"

    def __repr__(self) -> str:
        return f"Ref({str(self)!r})"
