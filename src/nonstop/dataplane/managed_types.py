"""The managed types this process knows, as the data plane checks and lists them.

A client names a type and its version (``type``, ``tv``) in every op; the node
refuses a type it does not define (``UnknownType``) or defines at another
version (``TypeVersionMismatch``) before anything runs (data-path.md §3).
"""

from __future__ import annotations

from typing import Any

from nonstop import errors
from nonstop.model.managed import _REGISTRY, TypeInfo, type_info


def check_type(name: Any, tv: Any) -> TypeInfo:
    """The node's managed type ``name``; UnknownType / TypeVersionMismatch against ``tv``."""
    if not isinstance(name, str):
        raise errors.BadArgument(f"type must be a type name, not {name!r:.40}")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise errors.UnknownType(f"managed type {name!r} is not defined on this node")
    info = type_info(cls)
    if tv is not None and tv != info.version:
        raise errors.TypeVersionMismatch(
            f"{name}: the client has version {tv!r}, this node version {info.version}"
        )
    return info


def types_reply() -> dict[str, Any]:
    """Every managed type this process knows, with its version and schema."""
    out = {}
    for name, cls in sorted(_REGISTRY.items()):
        try:
            info = type_info(cls)
        except errors.Error:
            continue
        out[name] = {"version": info.version, "schema": info.schema()}
    return out


__all__ = ["check_type", "types_reply"]
