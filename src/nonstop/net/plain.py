"""Plain msgpack (no extension types): durable protocol records and wire payloads.

Managed objects' states use :mod:`nonstop.model.codec` instead (datetimes,
decimals, references); protocol machines (the cluster log, distributed commit,
the simulator) store and send only plain values, packed here.
"""

from __future__ import annotations

from typing import Any

import msgpack


def pack(value: Any) -> bytes:
    """Encode a plain msgpack value (bytes stay bytes, str stays str)."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(raw: bytes) -> Any:
    """Decode what :func:`pack` wrote (map keys of any type, lists as lists)."""
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


__all__ = ["pack", "unpack"]
