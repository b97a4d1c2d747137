"""Many object records decoded at once: the checksums by C loops, ONE msgpack call.

A bulk scan or an overwrite's swap reads thousands of records; decoding them one
``store.record`` call each costs a few µs of Python per object.  Here every
checksum is checked by ``map(zlib.crc32, ...)`` (a sealed record's CRC-32 is a
constant: ``records.RESIDUE``) and the payloads are unpacked as ONE msgpack
array; only when a checksum fails does the store's own check run, which raises
``CorruptRecord`` naming the record.
"""

from __future__ import annotations

import zlib
from typing import Any

from nonstop.model.codec import unpack
from nonstop.store.records import CHECKSUM_BYTES, RESIDUE


def payloads(store: Any, raws: list[Any], refs: list[bytes]) -> list[Any]:
    """The records' msgpack payloads, every checksum verified."""
    if all(map(RESIDUE.__eq__, map(zlib.crc32, raws))):
        return [raw[:-CHECKSUM_BYTES] for raw in raws]
    return list(map(store.record_payload, raws, refs))


def decode_all(store: Any, raws: list[Any], refs: list[bytes]) -> list[Any]:
    """Every record ``[type name, type version, version, state]``, in order."""
    if not raws:
        return []
    return unpack(array_header(len(raws)) + b"".join(payloads(store, raws, refs)))  # type: ignore[no-any-return]


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (what precedes the packed items)."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")
