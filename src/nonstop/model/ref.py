"""Object references (C1): globally unique, immutable, and they say where an object was made.

A reference is 20 bytes: the creating store's 8-byte location code, its 4-byte
store timestamp (seconds at store creation) and an 8-byte counter.  Big-endian,
so references sort by (location, timestamp, counter) in LMDB.  Two stores never
share (location, timestamp) in practice (the location code is random or derived
from the cluster-unique node name); duplicates are what C3's DuplicateLocation /
DuplicateTimestamp states report.
"""

from __future__ import annotations

import struct

REF_SIZE = 20
_LAYOUT = struct.Struct(">QIQ")


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
        return int(_LAYOUT.unpack(self.raw)[1])

    @property
    def counter(self) -> int:
        return int(_LAYOUT.unpack(self.raw)[2])

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
