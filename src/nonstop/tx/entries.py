"""What a transaction works with, shared by embedded and remote transactions.

One definition of each, imported by :mod:`nonstop.tx.transaction` and by
:mod:`nonstop.client.remote`, so that both accept and refuse the same things
with the same words:

* :class:`Entry` — a transaction's view of one object (the handle points at it);
* :class:`TxState` — where a transaction is in its life;
* :class:`Isolation` — the isolation levels;
* the lock modes a lookup names (``NONE``/``READ``/``WRITE``, :func:`parse_lock`);
* :func:`unique_lookup` and :func:`describe_key` — checking and naming a
  unique-key lookup.

Entry statuses (``CLEAN`` ...) are in :mod:`nonstop.model.entry`.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Hashable
from typing import TYPE_CHECKING, Any

from nonstop.errors import BadArgument
from nonstop.model.managed import KeyInfo, TypeInfo
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.tx.transaction import Transaction

NONE = 0
"""Lock mode "none": read the last committed state without a lock."""
READ = LockMode.READ
WRITE = LockMode.WRITE
_LOCK_NAMES: dict[str | None, int | None] = {"none": NONE, "read": READ, "write": WRITE, None: None}

Op = Generator[tuple[Hashable, LockMode], None, Any]
"""A generator operation: yields the ``(resource, mode)`` locks it needs, returns a value.

A driver takes each lock and resumes it: ``Transaction.drive`` blocks the
thread, ``AsyncTransaction.adrive`` awaits.  That is how one body of logic
serves both flavours of transaction."""


class Isolation(enum.Enum):
    SERIALIZABLE = "serializable"
    SNAPSHOT = "snapshot"


class TxState(enum.Enum):
    """A transaction's state: only an ``ACTIVE`` one can be used."""

    ACTIVE = "active"
    COMMITTING = "committing"
    PREPARED = "prepared"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled back"


class Entry:
    """A transaction's view of one object.  Handles (Managed instances) point at it."""

    __slots__ = (
        "handle",
        "info",
        "lock",
        "orig",
        "ref",
        "state",
        "status",
        "triggered",
        "tx",
        "version",
    )

    def __init__(
        self,
        tx: Transaction,
        ref: bytes,
        info: TypeInfo,
        state: dict[str, Any],
        version: int,
        lock: int,
        status: int,
    ) -> None:
        self.tx = tx
        self.ref = ref
        self.info = info
        self.state = state
        self.version = version  # committed version this state was read at (0: new)
        self.lock = lock
        self.status = status
        self.triggered = False
        # Committed values of mutable keys, to fix their indexes at commit.
        self.orig: dict[str, Any] | None = None
        handle = info.cls.__new__(info.cls)
        # The handle's only attribute of its own (Managed.__slots__): user fields
        # are descriptors that route through it to this entry.
        object.__setattr__(handle, "_e", self)
        self.handle: Any = handle


def parse_lock(mode: str | None) -> int | None:
    """The lock mode named ``"none"``, ``"read"`` or ``"write"`` (None: the default)."""
    try:
        return _LOCK_NAMES[mode]
    except (KeyError, TypeError):
        raise BadArgument(f"lock must be 'none', 'read' or 'write', not {mode!r}") from None


def unique_lookup(info: TypeInfo, key: dict[str, Any]) -> tuple[KeyInfo, Any]:
    """The unique key and the checked value of ``find(T, key=value)``; BadArgument otherwise.

    Shared by embedded and remote transactions, so both refuse the same lookups
    with the same words.
    """
    if len(key) != 1:
        raise BadArgument(f"look up {info.name} by exactly one unique key, e.g. find(T, key=v)")
    ((name, value),) = key.items()
    k = info.keys.get(name)
    if k is None or not k.options.unique:
        uniques = [n for n, ki in info.keys.items() if ki.options.unique] or ["(none)"]
        raise BadArgument(
            f"{info.name}.{name} is not a unique key (unique keys: {', '.join(uniques)}); "
            f"use tx.query({info.cls.__name__}).where({name}=...) for non-unique lookups"
        )
    return k, info.fields[name].check(info.name, value)


def describe_key(key: dict[str, Any]) -> str:
    """``number='A-1'``: a lookup's key as a NotFound message names it."""
    return ", ".join(f"{k}={v!r}" for k, v in key.items())


__all__ = [
    "NONE",
    "READ",
    "WRITE",
    "Entry",
    "Isolation",
    "Op",
    "TxState",
    "describe_key",
    "parse_lock",
    "unique_lookup",
]
