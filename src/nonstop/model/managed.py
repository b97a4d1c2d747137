"""Managed types (A1): Python classes whose instances live in the node's durable store.

An instance of a managed type is a *handle* bound to one transaction: reading a
field reads the object's state as that transaction sees it (taking the lock the
isolation level asks for), writing a field buffers the change in the
transaction's write set.  Handles are made by the transaction (``tx.create``,
``tx.get``, queries), never by calling the class.

Per-type hooks (A3) are methods a type may override:

* ``on_update(self)`` — called once per transaction, at commit (before prepare
  notifiers), for every existing object the transaction modified;
* ``on_delete(self)`` — called by ``tx.delete(obj)`` before the object goes;
* ``on_conflict(self, other)`` — reserved for split-brain merges (D17).
"""

from __future__ import annotations

import importlib
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from nonstop.errors import FieldError, SchemaError, UnknownType
from nonstop.model.fields import (
    KEYABLE_KINDS,
    MISSING,
    FieldInfo,
    FieldSpec,
    KeyOptions,
    resolve_annotation,
)

_REGISTRY: dict[str, type[Managed]] = {}


@dataclass(slots=True)
class KeyInfo:
    """An index over one field.  ``owner`` is the type that declared it: subtypes share it."""

    field: str
    owner: str
    options: KeyOptions
    db_name: bytes = b""  # the LMDB database holding the index

    def __post_init__(self) -> None:
        self.db_name = f"ix:{self.owner}:{self.field}".encode()


class TypeInfo:
    """Everything the engine needs to know about one managed type, resolved once."""

    __slots__ = (
        "cls",
        "fields",
        "has_on_delete",
        "has_on_update",
        "keys",
        "name",
        "ref_fields",
        "required",
        "subtypes",
        "version",
    )

    def __init__(self, cls: type[Managed]) -> None:
        self.cls = cls
        self.name: str = cls.__nonstop_name__
        self.version: int = cls.__nonstop_version__
        self.fields: dict[str, FieldInfo] = {}
        self.keys: dict[str, KeyInfo] = {}
        try:
            hints = typing.get_type_hints(cls)
        except NameError as exc:
            raise SchemaError(f"{self.name}: cannot resolve a field annotation: {exc}") from exc
        for klass in reversed(cls.__mro__):
            if not (isinstance(klass, type) and issubclass(klass, Managed)) or klass is Managed:
                continue
            for fname in klass.__dict__.get("__annotations__", {}):
                if fname.startswith("_") or typing.get_origin(hints.get(fname)) is ClassVar:
                    continue
                spec = klass.__nonstop_specs__.get(fname, FieldSpec())
                kind, optional, ref_type = resolve_annotation(
                    self.name, fname, hints[fname], Managed
                )
                info = FieldInfo(
                    fname,
                    kind,
                    optional,
                    spec.default,
                    spec.default_factory,
                    spec.key,
                    ref_type,
                    getattr(hints[fname], "__name__", str(hints[fname])),
                )
                if info.default is not MISSING:
                    info.default = info.check(self.name, info.default)
                self.fields[fname] = info
                if spec.key is not None:
                    if kind not in KEYABLE_KINDS:
                        raise SchemaError(f"{self.name}.{fname}: a {kind} field cannot be a key")
                    self.keys[fname] = KeyInfo(fname, klass.__nonstop_name__, spec.key)
        self.required = [f for f in self.fields.values() if not f.has_default()]
        self.ref_fields = frozenset(n for n, f in self.fields.items() if f.kind == "ref")
        self.has_on_update = cls.on_update is not Managed.on_update
        self.has_on_delete = cls.on_delete is not Managed.on_delete
        self.subtypes: list[TypeInfo] = []

    def concrete_types(self) -> list[TypeInfo]:
        """This type and every registered subtype: an extent of a type includes its subtypes."""
        out = [self]
        for name, cls in _REGISTRY.items():
            if cls is not self.cls and issubclass(cls, self.cls) and name != self.name:
                out.append(type_info(cls))
        return out

    def schema(self) -> dict[str, Any]:
        """A plain description, stored with the data and compared on open (E1/E2 ready)."""
        return {
            "name": self.name,
            "version": self.version,
            "fields": {n: [f.kind, f.optional] for n, f in self.fields.items()},
            "keys": {
                n: [k.owner, k.options.unique, k.options.ordered, k.options.mutable]
                for n, k in self.keys.items()
            },
        }


class _FieldDescriptor:
    """Routes attribute access on a handle to its transaction.

    The handle protocol: every kind of transaction (embedded, remote) answers
    ``_read_field(entry, name)`` and ``_write_field(entry, name, value)`` (and
    ``_enqueue_async`` for asynchronous methods, ``_remote_call`` for remote
    ones).  The embedded transaction also has them under public names
    (``read_field``, ``write_field``, ``queue_async_call``), which the handle
    will call once the remote transaction has them too.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: Managed | None, owner: type) -> Any:
        if obj is None:
            return self
        entry = obj._e
        return entry.tx._read_field(entry, self.name)

    def __set__(self, obj: Managed, value: Any) -> None:
        entry = obj._e
        entry.tx._write_field(entry, self.name, value)


class Managed:
    """Base class of managed types.

    ::

        class Account(nonstop.Managed, version=2):
            number: str = nonstop.key(unique=True)
            owner: str = nonstop.key(ordered=True, mutable=True)
            balance: int = 0

    Class keywords: ``version`` (int, default 1) and ``name`` (the stored type
    name; default ``module.QualName`` — set it when the module path may change).
    """

    __slots__ = ("__weakref__", "_e")
    __nonstop_name__: ClassVar[str]
    __nonstop_version__: ClassVar[int]
    __nonstop_specs__: ClassVar[dict[str, FieldSpec]]
    __nonstop_info__: ClassVar[TypeInfo | None]

    _e: Any  # the transaction's entry for this object (see nonstop.tx.transaction)

    def __init_subclass__(cls, *, version: int = 1, name: str | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if not isinstance(version, int) or version < 1:
            raise SchemaError(f"{cls.__qualname__}: version must be a positive int")
        cls.__nonstop_name__ = name or f"{cls.__module__}.{cls.__qualname__}"
        cls.__nonstop_version__ = version
        cls.__nonstop_info__ = None
        specs: dict[str, FieldSpec] = {}
        for fname in cls.__dict__.get("__annotations__", {}):
            if fname.startswith("_"):
                continue
            value = cls.__dict__.get(fname, MISSING)
            specs[fname] = value if isinstance(value, FieldSpec) else FieldSpec(default=value)
            setattr(cls, fname, _FieldDescriptor(fname))
        cls.__nonstop_specs__ = specs
        _REGISTRY[cls.__nonstop_name__] = cls

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            f"create {type(self).__name__} objects inside a transaction: "
            f"tx.create({type(self).__name__}, ...)"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name in type_info(type(self)).fields:
            object.__setattr__(self, name, value)
        else:
            raise FieldError(f"{type(self).__nonstop_name__} has no field {name!r}")

    # Triggers (A3): override in a managed type.
    def on_update(self) -> None:
        """Called at commit for each existing object the transaction changed."""

    def on_delete(self) -> None:
        """Called by ``tx.delete`` before the object is removed."""

    def on_conflict(self, other: dict[str, Any]) -> None:
        """Called on a split-brain merge conflict (D17); ``other`` is the competing state."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Managed) and other._e.ref == self._e.ref

    def __hash__(self) -> int:
        return hash(self._e.ref)

    def __repr__(self) -> str:
        entry = self._e
        state = entry.state if entry.state is not None else {}
        shown = ", ".join(f"{k}={v!r}" for k, v in list(state.items())[:6])
        return f"{type(self).__name__}<{entry.ref.hex()[-12:]}>({shown})"


def type_info(cls: type[Managed]) -> TypeInfo:
    """The resolved TypeInfo of a managed class (resolved on first use, then cached)."""
    info = cls.__dict__.get("__nonstop_info__")
    if info is None:
        if not (isinstance(cls, type) and issubclass(cls, Managed)) or cls is Managed:
            raise SchemaError(f"{cls!r} is not a managed type (subclass nonstop.Managed)")
        info = TypeInfo(cls)
        cls.__nonstop_info__ = info
    return info


def registered_type(name: str) -> type[Managed] | None:
    """The managed class defined in this process under stored name ``name``, or None.

    Unlike :func:`lookup_type` it imports nothing: a node answers only for the
    types its application defined.
    """
    return _REGISTRY.get(name)


def registered_types() -> dict[str, type[Managed]]:
    """Every managed class defined in this process, by stored name (a copy)."""
    return dict(_REGISTRY)


def lookup_type(name: str) -> TypeInfo:
    """Find a managed type by stored name, importing its module if needed."""
    cls = _REGISTRY.get(name)
    if cls is None:
        module = name.rpartition(".")[0]
        while module and cls is None:
            try:
                importlib.import_module(module)
            except ImportError:
                pass
            cls = _REGISTRY.get(name)
            module = module.rpartition(".")[0]
    if cls is None:
        raise UnknownType(
            f"managed type {name!r} is not defined in this process; import its module"
        )
    return type_info(cls)
