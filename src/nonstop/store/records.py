"""An object's stored record: the value of its reference in the ``objects`` database.

``msgpack [type name, type version, object version, {field: value}]`` (see
:mod:`nonstop.store.lmdb_store`).  Transactions write records through
:func:`pack_record`; the bulk upsert's fast path (:mod:`nonstop.bulk.fast`)
writes the same bytes column by column and falls back to :func:`pack_record`
to say which field cannot be stored.
"""

from __future__ import annotations

from typing import Any

from nonstop.errors import FieldError
from nonstop.model.codec import pack
from nonstop.model.managed import TypeInfo


def pack_record(info: TypeInfo, version: int, state: dict[str, Any]) -> bytes:
    """The stored record of an object of ``info`` at ``version``.

    FieldError naming the field if a value cannot be stored.
    """
    try:
        return pack([info.name, info.version, version, state])
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        for name, value in state.items():
            try:
                pack(value)
            except (TypeError, ValueError, OverflowError) as one:
                raise FieldError(f"{info.name}.{name} cannot be stored: {one}") from None
        raise FieldError(f"{info.name} object cannot be stored: {exc}") from None


__all__ = ["pack_record"]
