"""Running a function as a transaction, replayed on deadlock or conflict (B4, B7).

``@nonstop.transactional`` turns ``fn(tx, *args)`` into ``fn(db, *args)``: each
call runs in a fresh transaction that commits when ``fn`` returns.  When the
transaction is a deadlock victim, times out on a lock, or meets a state conflict
(all :class:`~nonstop.errors.Retryable`), it is rolled back and ``fn`` runs
again, after a short randomized back-off, up to ``max_retries`` times; then
:class:`~nonstop.errors.TooManyRetries` is raised.  A replay on a cluster keeps
its first attempt's rank among lock waiters (wound-wait: the older wins), so a
transaction wounded again and again still becomes the oldest and commits.  Any other exception
(including :class:`~nonstop.errors.Abort`) rolls back and reaches the caller.

Passing a transaction instead of a database joins it (no commit, no replay):
transactional functions compose.  ``async def`` functions get an async runner.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import random
import time
from collections.abc import Callable
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    overload,
)

from nonstop.errors import Deadlock, Retryable, TooManyRetries

if TYPE_CHECKING:
    from nonstop.tx.database import Database
    from nonstop.tx.transaction import Transaction

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
DEFAULT_MAX_RETRIES = 100


class TransactionSource(Protocol):
    """Anything that opens transactions: an embedded database or a cluster client."""

    def transaction(self, isolation: str = ...) -> Any: ...


class JoinableTransaction(Protocol):
    """A client's remote transaction: a decorated function called with it joins it."""

    __nonstop_transaction__: bool


# What a decorated function accepts in place of its transaction parameter.  The
# embedded Transaction is named through a string so this module, below
# tx.transaction, does not import it at run time.
Target: TypeAlias = "TransactionSource | Transaction | JoinableTransaction"


class _Decorator(Protocol):
    """What ``@transactional(isolation=...)`` returns: the decorator proper."""

    def __call__(
        self, fn: Callable[Concatenate[Any, P], R], /
    ) -> Callable[Concatenate[Target, P], R]: ...


BACKOFF = 0.0002
"""First back-off bound (seconds) after a retryable error; doubled per attempt, up to 50 ms."""
DEADLOCK_BACKOFF = 0.005
"""First back-off bound after ``Deadlock``.  A deadlock victim (or a transaction wounded
by an older one, docs/design/deadlocks.md) replays as the youngest transaction into the
contention that killed it: replayed at once, it takes a first lock that older waiters
need, waits for its second, and is wounded again.  At 64 clients on 24 accounts (README
transfer, 3 real nodes, issue 14) 5 ms instead of 0.2 ms took transfers/s from 18-22 to
37-38 and the longest commit gap from 0.18-0.22 s to 0.13 s."""


def _backoff(attempt: int, exc: Retryable | None = None) -> float:
    # Randomized so two victims of the same deadlock do not collide again in step.
    base = DEADLOCK_BACKOFF if isinstance(exc, Deadlock) else BACKOFF
    return random.uniform(0, min(0.05, base * (2 ** min(attempt, 10))))


def _carry_first_attempt(tx: Any, first_at: float) -> None:
    """A replay keeps its first attempt's rank: a remote transaction sends how long ago
    that began with its ``begin`` (wound-wait, docs/design/deadlocks.md section 2b; the
    node bounds the claim); an embedded one is ranked in its lock table by it, so it is
    not the victim of a deadlock with younger transactions (nonstop.tx.waiting)."""
    if getattr(tx, "__nonstop_transaction__", False):
        tx.replay_age = max(0.0, time.monotonic() - first_at)
    elif hasattr(tx, "rank_from"):
        tx.rank_from(first_at)


def run_with_retries(
    db: Database,
    fn: Callable[..., T],
    *args: Any,
    isolation: str = "serializable",
    max_retries: int = DEFAULT_MAX_RETRIES,
    **kwargs: Any,
) -> T:
    last: Retryable | None = None
    first_at = time.monotonic()
    for attempt in range(max_retries + 1):
        try:
            with db.transaction(isolation=isolation) as tx:
                if attempt:
                    _carry_first_attempt(tx, first_at)
                return fn(tx, *args, **kwargs)
        except Retryable as exc:
            last = exc
            if attempt < max_retries:
                time.sleep(_backoff(attempt, exc))
    raise TooManyRetries(
        f"{getattr(fn, '__name__', 'transaction')} did not commit after {max_retries} retries; "
        f"last error: {type(last).__name__}: {last}"
    ) from last


async def run_with_retries_async(
    db: Database,
    fn: Callable[..., Any],
    *args: Any,
    isolation: str = "serializable",
    max_retries: int = DEFAULT_MAX_RETRIES,
    **kwargs: Any,
) -> Any:
    last: Retryable | None = None
    first_at = time.monotonic()
    for attempt in range(max_retries + 1):
        try:
            async with db.transaction(isolation=isolation) as tx:
                if attempt:
                    _carry_first_attempt(tx, first_at)
                return await fn(tx, *args, **kwargs)
        except Retryable as exc:
            last = exc
            if attempt < max_retries:
                await asyncio.sleep(_backoff(attempt, exc))
    raise TooManyRetries(
        f"{getattr(fn, '__name__', 'transaction')} did not commit after {max_retries} retries; "
        f"last error: {type(last).__name__}: {last}"
    ) from last


def _joins(target: Any, transaction: type) -> bool:
    """A transaction (embedded, or a client's remote one) is joined, not replayed."""
    return isinstance(target, transaction) or getattr(target, "__nonstop_transaction__", False)


@overload
def transactional(
    fn: Callable[Concatenate[Any, P], R], /
) -> Callable[Concatenate[Target, P], R]: ...


@overload
def transactional(
    *, isolation: str = "serializable", max_retries: int = DEFAULT_MAX_RETRIES
) -> _Decorator: ...


def transactional(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    isolation: str = "serializable",
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> Any:
    """Decorator: run ``fn(tx, ...)`` as a replayed transaction when called as ``fn(db, ...)``.

    Typed with a ParamSpec: the decorated function keeps every parameter after
    the first and its result (an ``async def`` keeps returning an awaitable of
    it), and its first parameter accepts a database, a client or a transaction.
    """
    from nonstop.tx.transaction import Transaction

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_runner(target: Any, *args: Any, **kwargs: Any) -> Any:
                if _joins(target, Transaction):
                    return await func(target, *args, **kwargs)
                return await run_with_retries_async(
                    target, func, *args, isolation=isolation, max_retries=max_retries, **kwargs
                )

            return async_runner

        @functools.wraps(func)
        def runner(target: Any, *args: Any, **kwargs: Any) -> Any:
            if _joins(target, Transaction):
                return func(target, *args, **kwargs)
            return run_with_retries(
                target, func, *args, isolation=isolation, max_retries=max_retries, **kwargs
            )

        return runner

    return wrap if fn is None else wrap(fn)
