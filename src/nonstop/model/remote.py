"""``@nonstop.remote``: methods that run where the object lives (C4).

A method of a managed type marked ``@nonstop.remote`` runs on the object's
master node when it is called through a handle of a *remote* transaction (a
client's ``cluster.transaction()``): the client flushes its deferred writes,
sends one ``tx.call``, and copies the states the call left back into its
handles (C5).  Inside a node-local transaction (an embedded database, or the
node running the call) it is an ordinary method call.

Methods without the mark run where they are called: on a client they run over
the handle's cached state, like any Python method.

On an asyncio remote transaction the call needs the network, so it returns an
awaitable: ``await account.deposit(5)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

REMOTE_MARK = "__nonstop_remote__"


def remote(fn: F) -> F:
    """Mark a managed type's method remote-executable (see the module docstring)."""
    if not callable(fn):
        raise TypeError("@nonstop.remote decorates a method")
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # A remote transaction provides remote_call; a node-local one does not.
        call = getattr(self._e.tx, "remote_call", None)
        if call is None:
            return fn(self, *args, **kwargs)
        return call(self, name, args, kwargs)

    setattr(fn, REMOTE_MARK, True)
    setattr(wrapper, REMOTE_MARK, True)
    return wrapper  # type: ignore[return-value]


def is_remote(method: Any) -> bool:
    """Whether ``method`` (a function or a bound method) is marked ``@nonstop.remote``."""
    return bool(getattr(getattr(method, "__func__", method), REMOTE_MARK, False))


__all__ = ["is_remote", "remote"]
