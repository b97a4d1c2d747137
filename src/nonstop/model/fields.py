"""Field and key declarations of managed types (A1, A4), and value checking.

A managed type declares typed fields with ordinary annotations; ``key()`` and
``field()`` add options.  Each annotation maps to a *kind* that says how values
are checked and stored::

    int float str bytes bool datetime date Decimal list dict Any  X | None  OtherManagedType
"""

from __future__ import annotations

import datetime as _dt
import decimal
import types
import typing
from dataclasses import dataclass
from typing import Any

from nonstop.errors import FieldError, SchemaError

# The declared type of a field whose key()/field() gives a default: the class
# body `balance: int = nonstop.field(default="x")` is then a type error.  Without
# a default, key() returns Any (as dataclasses.field does) so any annotation fits.
T = typing.TypeVar("T")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True, slots=True)
class KeyOptions:
    unique: bool = False
    ordered: bool = False
    mutable: bool = False


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """What ``key()`` / ``field()`` leave in the class body until the type is resolved."""

    default: Any = MISSING
    default_factory: typing.Callable[[], Any] | None = None
    key: KeyOptions | None = None


@typing.overload
def key(
    *,
    unique: bool = False,
    ordered: bool = False,
    mutable: bool = False,
    default: T,
) -> T: ...


@typing.overload
def key(
    *,
    unique: bool = False,
    ordered: bool = False,
    mutable: bool = False,
    default_factory: typing.Callable[[], T],
) -> T: ...


@typing.overload
def key(*, unique: bool = False, ordered: bool = False, mutable: bool = False) -> Any: ...


def key(
    *,
    unique: bool = False,
    ordered: bool = False,
    mutable: bool = False,
    default: Any = MISSING,
    default_factory: typing.Callable[[], Any] | None = None,
) -> Any:  # typed by the overloads above
    """Declare the field as a key (A4): an index is kept for it on every node holding the object.

    ``unique``: at most one object per value (``DuplicateKey`` otherwise).
    ``ordered``: supports ordered iteration and range queries (every key is
    stored ordered; the flag documents intent and is checked by ``range()``).
    ``mutable``: the value may change after create (immutable by default).
    """
    return FieldSpec(default, default_factory, KeyOptions(unique, ordered, mutable))


@typing.overload
def field(*, default: T) -> T: ...


@typing.overload
def field(*, default_factory: typing.Callable[[], T]) -> T: ...


def field(
    *, default: Any = MISSING, default_factory: typing.Callable[[], Any] | None = None
) -> Any:
    """Declare a plain field with a default (or a factory for mutable defaults)."""
    return FieldSpec(default, default_factory, None)


# Kinds a field can have, with the Python types a value of that kind may be.
_SCALARS: dict[type, str] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    _dt.datetime: "datetime",
    _dt.date: "date",
    decimal.Decimal: "decimal",
}
KEYABLE_KINDS = frozenset({"bool", "int", "float", "str", "bytes", "datetime", "date", "ref"})


@dataclass(slots=True)
class FieldInfo:
    """One resolved field of a managed type."""

    name: str
    kind: str  # one of _SCALARS values, "list", "dict", "any", "ref"
    optional: bool
    default: Any
    default_factory: typing.Callable[[], Any] | None
    key: KeyOptions | None
    ref_type: type | None = None  # for kind "ref": the managed class referred to
    annotation: str = ""

    def has_default(self) -> bool:
        return self.default is not MISSING or self.default_factory is not None or self.optional

    def make_default(self) -> Any:
        if self.default_factory is not None:
            return self.default_factory()
        if self.default is not MISSING:
            return self.default
        return None  # optional fields default to None

    def check(self, owner: str, value: Any) -> Any:
        """Return the value to store, or raise FieldError naming the field and the problem."""
        if value is None:
            if self.optional:
                return None
            raise FieldError(
                f"{owner}.{self.name} may not be None (declare it `{self.annotation} | None`)"
            )
        kind = self.kind
        ok: bool
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "float":
            if isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            ok = isinstance(value, float)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "str":
            ok = isinstance(value, str)
        elif kind == "bytes":
            if isinstance(value, bytearray | memoryview):
                return bytes(value)
            ok = isinstance(value, bytes)
        elif kind == "datetime":
            ok = isinstance(value, _dt.datetime)
        elif kind == "date":
            ok = isinstance(value, _dt.date) and not isinstance(value, _dt.datetime)
        elif kind == "decimal":
            if isinstance(value, int) and not isinstance(value, bool):
                return decimal.Decimal(value)
            ok = isinstance(value, decimal.Decimal)
        elif kind == "list":
            if isinstance(value, tuple):
                return list(value)
            ok = isinstance(value, list)
        elif kind == "dict":
            ok = isinstance(value, dict)
        elif kind == "ref":
            assert self.ref_type is not None
            ok = isinstance(value, self.ref_type)
        else:  # "any": anything msgpack (plus our extensions) can store; checked at encode
            ok = True
        if not ok:
            raise FieldError(
                f"{owner}.{self.name} takes {self.annotation}, "
                f"not {type(value).__name__} ({value!r:.60})"
            )
        return value


def resolve_annotation(
    owner: str, name: str, annotation: Any, managed_base: type
) -> tuple[str, bool, type | None]:
    """Map an annotation to (kind, optional, ref_type)."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1 or len(typing.get_args(annotation)) != 2:
            raise SchemaError(f"{owner}.{name}: only `X | None` unions are supported")
        optional = True
        annotation = args[0]
        origin = typing.get_origin(annotation)
    if annotation is typing.Any:
        return "any", True, None
    if origin is list or annotation is list:
        return "list", optional, None
    if origin is dict or annotation is dict:
        return "dict", optional, None
    if isinstance(annotation, type):
        if issubclass(annotation, managed_base):
            return "ref", optional, annotation
        for py, kind in _SCALARS.items():
            if annotation is py:
                return kind, optional, None
    raise SchemaError(
        f"{owner}.{name}: unsupported field type {annotation!r}; use int, float, str, bytes, bool, "
        "datetime, date, Decimal, list, dict, Any, a managed type, or `X | None` of these"
    )
