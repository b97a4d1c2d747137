"""Encodings shared by the client and the node's data service (data-path.md §2).

An object travels as ``[ref, type name, version, packed state]``; the state is
packed with :mod:`nonstop.model.codec` so that datetimes, decimals and
references survive the trip.  Errors travel as ``{"error": class name,
"message": text}`` and come back as the same :mod:`nonstop.errors` class.
"""

from __future__ import annotations

from typing import Any

from nonstop import errors
from nonstop.model.codec import pack, unpack

AUDITS = ("at_least_one", "skip_down", "fail_if_down")
"""Query scope audits (seed 000): what a query does about nodes of its scope that are down."""

WIRE_ISOLATION = {
    "serializable": "serializable",
    "read_committed": "read_committed",
    "snapshot": "read_committed",
}
"""An isolation name a user may give → the name the wire carries (``tx.begin`` ``iso``)."""

STORE_ISOLATION = {
    "serializable": "serializable",
    "read_committed": "snapshot",
    "snapshot": "snapshot",
}
"""An isolation name from the wire (or a user) → the store's ``Isolation`` value."""

Obj = list[Any]
"""``[ref: bytes, type: str, version: int, state: bytes]``."""

Write = list[Any]
"""``[ref: bytes, type: str, version read: int, packed {field: value}]``."""


def obj_out(ref: bytes, type_name: str, version: int, state: dict[str, Any]) -> Obj:
    return [bytes(ref), type_name, int(version), pack(state)]


def obj_in(obj: Any) -> tuple[bytes, str, int, dict[str, Any]]:
    """Decode an object; ``ProtocolError`` if it is not one."""
    if not (isinstance(obj, list) and len(obj) == 4):
        raise errors.ProtocolError(f"not an object on the wire: {obj!r:.80}")
    ref, type_name, version, state = obj
    if not (isinstance(ref, bytes) and len(ref) == 20 and isinstance(type_name, str)):
        raise errors.ProtocolError(f"not an object on the wire: {obj!r:.80}")
    if not isinstance(version, int) or not isinstance(state, bytes):
        raise errors.ProtocolError(f"not an object on the wire: {obj!r:.80}")
    decoded = unpack(state)
    if not isinstance(decoded, dict):
        raise errors.ProtocolError("an object's state must be a map")
    return ref, type_name, version, decoded


def write_out(ref: bytes, type_name: str, version: int, changes: dict[str, Any]) -> Write:
    return [bytes(ref), type_name, int(version), pack(changes)]


def write_in(write: Any) -> tuple[bytes, str, int, dict[str, Any]]:
    """Decode one write-set entry (same layout as an object)."""
    return obj_in(write)


def location_of(ref: bytes) -> int:
    """The creating store's location code: the first 8 bytes of a reference."""
    return int.from_bytes(ref[:8], "big")


# ------------------------------------------------------------------ errors
def error_out(exc: BaseException) -> dict[str, Any]:
    """An error reply naming the exception's class (a nonstop error, or ``Error``)."""
    name = type(exc).__name__ if isinstance(exc, errors.Error) else "Error"
    message = str(exc) if isinstance(exc, errors.Error) else f"{type(exc).__name__}: {exc}"
    return {"error": name, "message": message}


def error_class(name: str) -> type[errors.Error]:
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.Error):
        return cls
    return errors.Error


def raise_error(reply: Any) -> Any:
    """Raise the error a reply carries (the same class as on the node), else return it."""
    if isinstance(reply, dict) and "error" in reply:
        name = str(reply.get("error"))
        message = str(reply.get("message") or name)
        cls = error_class(name)
        if cls is errors.NotLeader:
            raise errors.NotLeader(message, reply.get("leader"))
        raise cls(message)
    return reply


__all__ = [
    "Obj",
    "Write",
    "error_class",
    "error_out",
    "location_of",
    "obj_in",
    "obj_out",
    "raise_error",
    "write_in",
    "write_out",
]
