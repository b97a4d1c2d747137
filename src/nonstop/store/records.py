"""An object's stored record: the value of its reference in the ``objects`` database.

``msgpack [type name, type version, object version, {field: value}] + crc32 (4
bytes, little-endian)`` (store format 2, see :mod:`nonstop.store.lmdb_store`).
The checksum covers the msgpack bytes and is verified on every read
(:func:`open_record`, :func:`read_record`; the CRC of a sealed record is a
constant, :data:`RESIDUE`, so the check is one C call): a damaged record raises
:class:`~nonstop.errors.CorruptRecord` naming the file, the database and the key,
never wrong field content.  Transactions write records through
:func:`pack_record`; the bulk upsert's fast path (:mod:`nonstop.bulk.fast`) packs
the same msgpack bytes column by column, seals them with :func:`seal`, and falls
back to :func:`pack_record` to say which field cannot be stored.

Why CRC-32 (``zlib.crc32``): it is in the standard library, detects every burst
error up to 32 bits and any odd number of flipped bits, and costs about 0.2 µs to
seal or check a 70-byte record here, a third of decoding it (xxhash is not on
this machine and would not be faster at these sizes once the Python call is
counted).  It guards against damage, not against
an adversary.
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from collections.abc import Callable
from typing import Any

from nonstop.errors import CorruptRecord, FieldError
from nonstop.model.codec import pack, unpack
from nonstop.model.managed import TypeInfo

CHECKSUM_BYTES = 4
RESIDUE = 0x2144DF1C
"""CRC-32 of any ``payload + crc32(payload)`` (little-endian): one C call checks a record,
with no slicing before it."""
_crc32 = zlib.crc32


def seal(payload: bytes) -> bytes:
    """``payload`` followed by its checksum: what the store keeps."""
    return payload + _crc32(payload).to_bytes(CHECKSUM_BYTES, "little")


def open_record(
    raw: bytes | memoryview,
    *,
    path: str | os.PathLike[str] = "",
    database: str = "objects",
    key: bytes | memoryview = b"",
) -> bytes | memoryview:
    """The payload of a sealed record; CorruptRecord if its checksum does not match."""
    if _crc32(raw) != RESIDUE or len(raw) < CHECKSUM_BYTES:
        raise corrupt(path, database, bytes(key))
    return raw[:-CHECKSUM_BYTES]


log = logging.getLogger("nonstop.store")
_listeners: list[Callable[[CorruptRecord], None]] = []
_logged: set[tuple[str, str, bytes]] = set()
_lock = threading.Lock()


def on_corrupt(listener: Callable[[CorruptRecord], None]) -> Callable[[], None]:
    """Call ``listener`` (in the reading thread) with every damaged record found from now on
    (the node stops serving a damaged store: ``nonstop.node.main``); returns its remover."""
    with _lock:
        _listeners.append(listener)

    def remove() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return remove


def corrupt(path: str | os.PathLike[str], database: str, key: bytes) -> CorruptRecord:
    """The error for a damaged record of ``database`` under ``key`` in the store at ``path``:
    logged (once per record) and handed to the :func:`on_corrupt` listeners."""
    where = os.path.join(os.fspath(path), "data.mdb") if path else "the store"
    err = CorruptRecord(
        f"damaged record in {where}: database {database!r}, key {key.hex()} fails its checksum "
        "(the store must be repaired or restored; nothing of it was returned)",
        path=os.fspath(path),
        database=database,
        key=key,
    )
    with _lock:
        first = (where, database, key) not in _logged
        if first and len(_logged) < 10_000:
            _logged.add((where, database, key))
        listeners = list(_listeners)
    if first:
        log.error("%s", err)
    for listener in listeners:
        listener(err)
    return err


def read_record(
    raw: bytes | memoryview, *, path: str | os.PathLike[str] = "", key: bytes | memoryview = b""
) -> Any:
    """The decoded ``[type name, type version, object version, state]`` of a sealed record."""
    if _crc32(raw) != RESIDUE or len(raw) < CHECKSUM_BYTES:
        raise corrupt(path, "objects", bytes(key))
    return unpack(raw[:-CHECKSUM_BYTES])  # type: ignore[arg-type]  # msgpack takes buffers


def pack_record(info: TypeInfo, version: int, state: dict[str, Any]) -> bytes:
    """The stored (sealed) record of an object of ``info`` at ``version``.

    FieldError naming the field if a value cannot be stored.
    """
    try:
        return seal(pack([info.name, info.version, version, state]))
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        for name, value in state.items():
            try:
                pack(value)
            except (TypeError, ValueError, OverflowError) as one:
                raise FieldError(f"{info.name}.{name} cannot be stored: {one}") from None
        raise FieldError(f"{info.name} object cannot be stored: {exc}") from None


__all__ = [
    "CHECKSUM_BYTES",
    "RESIDUE",
    "corrupt",
    "on_corrupt",
    "open_record",
    "pack_record",
    "read_record",
    "seal",
]
