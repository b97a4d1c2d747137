"""The type gate: a lock per managed type that a bulk swap closes (data-path.md §6.3).

An overwrite's swap of a type ``T`` (``nonstop.bulk.swap_apply``) holds no lock
per object: it takes ONE lock, ``("type", T)`` in WRITE, and every transaction
takes the same resource in READ at its first touch of a ``T`` object (a load,
a lookup, a create, a count, a query).  So the swap waits for the transactions
that touched ``T`` to end, and no transaction touches ``T`` while the swap
holds it.

The swap is applied after its commit, a page per store commit, while the type
stays closed: a :class:`Gate` registered in ``engine.gates`` says so.  A
transaction finding the type closed (its READ not free at once, or the gate
still closed) fails with :class:`~nonstop.errors.LockTimeout` — retryable: the
application's retry loop runs it again once the swap has landed.  It does not
wait in the lock queue: a swap of millions of rows may hold the type for
minutes, longer than any lock timeout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from nonstop.errors import LockTimeout
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.tx.engine import Engine

GATE = "type"
"""First item of a type gate's lock resource: ``(GATE, type name)``."""


def gate_resource(type_name: str) -> tuple[str, str]:
    """The lock resource of ``type_name``'s gate."""
    return (GATE, type_name)


class Gate(Protocol):
    """A swap that keeps its type closed after its transaction ended (while it applies)."""

    def closed(self) -> bool:
        """Whether the type is still closed; False once the swap landed or was dropped."""
        ...


def enter(engine: Engine, owner: object, type_name: str) -> None:
    """Take ``type_name``'s gate in READ for transaction ``owner``, or raise LockTimeout
    (retryable) if a swap holds or applies it."""
    if engine.locks.try_acquire(owner, gate_resource(type_name), LockMode.READ):
        gate = engine.gates.get(type_name)
        if gate is None or not gate.closed():
            return
    raise LockTimeout(f"{type_name} is being overwritten (a bulk swap holds the type); retry")


__all__ = ["GATE", "Gate", "enter", "gate_resource"]
