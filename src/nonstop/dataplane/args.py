"""Checks of the arguments the data plane receives (client ops and branch ops).

Pure functions shared by the machine (:mod:`nonstop.dataplane.machine`) and the
store side (:mod:`nonstop.dataplane.store_ops`): each returns the checked value
or raises :class:`~nonstop.errors.BadArgument`.
"""

from __future__ import annotations

from typing import Any

from nonstop import errors
from nonstop.model.codec import unpack
from nonstop.model.ref import REF_SIZE, Ref

RequestId = tuple[str, int]
"""A commit's request id (H1): ``(client id, sequence number)``."""


def ref_arg(value: Any) -> bytes:
    """A reference argument (raw bytes or a :class:`Ref`) → its 20 bytes."""
    if isinstance(value, Ref):
        return value.raw
    if not isinstance(value, bytes) or len(value) != REF_SIZE:
        raise errors.BadArgument(f"ref must be {REF_SIZE} bytes, not {value!r:.40}")
    return value


def unpacked(value: Any, what: str) -> Any:
    """A packed argument (``codec.pack`` bytes) → its value."""
    if not isinstance(value, bytes):
        raise errors.BadArgument(f"{what} must be packed bytes")
    try:
        return unpack(value)
    except Exception as exc:
        raise errors.BadArgument(f"{what} cannot be decoded: {exc}") from None


def parse_req(req: Any) -> RequestId | None:
    """A commit's ``req`` field → ``(client id, seq)``; None when absent."""
    if req is None:
        return None
    if (
        isinstance(req, list | tuple)
        and len(req) == 2
        and isinstance(req[0], str)
        and req[0]
        and "\x00" not in req[0]
        and isinstance(req[1], int)
        and not isinstance(req[1], bool)
        and req[1] >= 0
    ):
        return req[0], req[1]
    raise errors.BadArgument("req must be [client id, seq >= 0]")


def parse_home(value: Any) -> bytes | None:
    """A request's ``home`` (requests.md): the reference whose partition keeps its record."""
    return None if value is None else ref_arg(value)


__all__ = ["RequestId", "parse_home", "parse_req", "ref_arg", "unpacked"]
