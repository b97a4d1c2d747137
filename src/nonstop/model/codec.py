"""Encodings: object state on disk and on the wire (msgpack), and index keys (order-preserving).

Object state is msgpack with extension types for the values msgpack lacks
(datetime, date, Decimal, references), so the same bytes travel node to node
whatever the platform (C7).

Index keys use an order-preserving byte encoding: for two values of one field
type, ``encode_key(a) < encode_key(b)`` (as bytes) exactly when ``a < b``.  LMDB
sorts keys as bytes, so ordered and range queries are plain cursor walks.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import struct
from typing import Any

import msgpack

from nonstop.errors import FieldError, KeyTooLong
from nonstop.model.ref import Ref

# LMDB's default maximum key size is 511 bytes; leave room for prefixes.
MAX_KEY_BYTES = 480

_EXT_DATETIME = 1
_EXT_DATE = 2
_EXT_DECIMAL = 3
_EXT_REF = 4

_I64 = struct.Struct(">q")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _default(value: Any) -> msgpack.ExtType:
    if isinstance(value, Ref):
        return msgpack.ExtType(_EXT_REF, value.raw)
    if isinstance(value, _dt.datetime):
        # ISO text keeps the timezone (or its absence) exactly.
        return msgpack.ExtType(_EXT_DATETIME, value.isoformat().encode())
    if isinstance(value, _dt.date):
        return msgpack.ExtType(_EXT_DATE, value.isoformat().encode())
    if isinstance(value, decimal.Decimal):
        return msgpack.ExtType(_EXT_DECIMAL, str(value).encode())
    raise TypeError(f"cannot encode a {type(value).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_REF:
        return Ref(data)
    if code == _EXT_DATETIME:
        return _dt.datetime.fromisoformat(data.decode())
    if code == _EXT_DATE:
        return _dt.date.fromisoformat(data.decode())
    if code == _EXT_DECIMAL:
        return decimal.Decimal(data.decode())
    return msgpack.ExtType(code, data)


_packer = msgpack.Packer(default=_default, use_bin_type=True, datetime=False)


def pack(value: Any) -> bytes:
    """Encode a state value (dicts, lists, scalars, datetimes, decimals, refs)."""
    return _packer.pack(value)


pack_each = _packer.pack
""":func:`pack` as the packer's own bound method: no Python call per value, for
``map(pack_each, column)`` over many values (the bulk upsert's fast path)."""

SLICE_ITEMS = 10_000
"""Items of a long list :func:`pack_sliced` packs in one C call (~10 ms)."""


def pack_sliced(value: dict[str, Any]) -> bytes:
    """``pack(value)``, byte for byte, for a map whose list values may hold hundreds of
    thousands of items (a large transaction's prepared record): such a list is packed
    :data:`SLICE_ITEMS` items at a time.  One C call over the whole holds the GIL for
    ~0.5 s, so a worker thread encoding it starved the node's event loop that long
    (the failure detector and the cluster log's leases then took the node for silent);
    between two slices the loop's thread gets the GIL.  A packer of its own: the
    module's is not shared across threads here."""
    packer = msgpack.Packer(default=_default, use_bin_type=True, datetime=False)
    out = [packer.pack_map_header(len(value))]
    for key, item in value.items():
        out.append(packer.pack(key))
        if isinstance(item, list) and len(item) > SLICE_ITEMS:
            out.append(packer.pack_array_header(len(item)))
            for i in range(0, len(item), SLICE_ITEMS):
                out.append(b"".join(map(packer.pack, item[i : i + SLICE_ITEMS])))
        else:
            out.append(packer.pack(item))
    return b"".join(out)


_unpackb = functools.partial(msgpack.unpackb, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def unpack(data: bytes) -> Any:
    return _unpackb(data)


# ------------------------------------------------------------- index keys
_T_NONE = b"\x00"
_T_FALSE = b"\x10"
_T_TRUE = b"\x11"
_T_INT = b"\x20"
_T_FLOAT = b"\x30"
_T_STR = b"\x40"
_T_BYTES = b"\x50"
_T_DATETIME = b"\x60"
_T_DATE = b"\x61"
_T_REF = b"\x70"


def _escape(data: bytes) -> bytes:
    # 0x00 terminates a string, so an embedded 0x00 becomes 0x00 0xff.
    return data.replace(b"\x00", b"\x00\xff") + b"\x00"


def encode_key(value: Any) -> bytes:
    """Order-preserving encoding of one key value.  Raises KeyTooLong past MAX_KEY_BYTES."""
    if value is None:
        out = _T_NONE
    elif value is True:
        out = _T_TRUE
    elif value is False:
        out = _T_FALSE
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise KeyTooLong(f"integer key {value} is outside the 64-bit range")
        out = _T_INT + _U64.pack(value + 2**63)
    elif isinstance(value, float):
        # -0.0 == 0.0: one key value (adding 0.0 turns -0.0 into 0.0).
        bits = _U64.unpack(_F64.pack(value + 0.0))[0]
        # Negative floats: invert all bits; positive: flip the sign bit.
        bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
        out = _T_FLOAT + _U64.pack(bits)
    elif isinstance(value, str):
        try:
            data = value.encode()
        except UnicodeEncodeError:
            raise FieldError(
                f"key value {value!r:.60} contains a lone surrogate and cannot be stored"
            ) from None
        out = _T_STR + _escape(data)
    elif isinstance(value, bytes):
        out = _T_BYTES + _escape(value)
    elif isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            micros = (value - _EPOCH) // _dt.timedelta(microseconds=1)
        else:
            micros = (value - _EPOCH.replace(tzinfo=None)) // _dt.timedelta(microseconds=1)
        out = _T_DATETIME + _U64.pack(micros + 2**63)
    elif isinstance(value, _dt.date):
        out = _T_DATE + _I64.pack(value.toordinal())
    elif isinstance(value, Ref):
        out = _T_REF + value.raw
    else:
        raise TypeError(f"a {type(value).__name__} cannot be a key value")
    if len(out) > MAX_KEY_BYTES:
        raise KeyTooLong(
            f"key value encodes to {len(out)} bytes; the limit is {MAX_KEY_BYTES} bytes"
        )
    return out
