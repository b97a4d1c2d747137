"""The asyncio remote transaction: ``async with cluster.transaction() as tx``.

Same protocol logic and semantics as :class:`~nonstop.client.remote.RemoteTransaction`
(it shares :class:`~nonstop.client.remote.RemoteTransactionBase`); every method
that needs the network is a coroutine, where the embedded
:class:`~nonstop.AsyncTransaction` awaits.  Many transactions of one
:class:`~nonstop.client.handle.AsyncClient` run at once over its one connection
(requests are multiplexed by id).

Two differences from the blocking flavour, both because attribute access cannot
await: a reference field whose object this transaction has not loaded yet
raises :class:`~nonstop.errors.BadArgument` (load it with ``await
tx.by_ref(...)`` first), and a ``@nonstop.remote`` method returns an awaitable
(``await account.deposit(5)``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from nonstop.client.remote import Op, RemoteQueryBase, RemoteTransactionBase
from nonstop.client.session import AsyncSessions, Request
from nonstop.errors import BadArgument, NotFound, TransactionClosed, Unavailable
from nonstop.model.entry import DELETED
from nonstop.model.managed import Managed
from nonstop.model.ref import Ref
from nonstop.model.wire import raise_error
from nonstop.tx.entries import TxState, describe_key

M = TypeVar("M", bound=Managed)


class AsyncRemoteQuery(RemoteQueryBase[M]):
    """A remote query whose results are awaited: ``await q.all()``, ``async for obj in q``."""

    _tx: AsyncRemoteTransaction

    async def all(self) -> list[M]:
        return await self._tx.adrive(self._g_all())  # type: ignore[no-any-return]

    async def first(self) -> M | None:
        found = await self._tx.adrive(self._g_all(limit=1))
        return found[0] if found else None

    async def count(self) -> int:
        return await self._tx.adrive(self._g_count())  # type: ignore[no-any-return]

    async def __aiter__(self) -> AsyncIterator[M]:
        """Page by page when unlocked (see :meth:`page_size`), else :meth:`all`."""
        if not self._streams():
            for obj in await self.all():
                yield obj
            return
        after: list[bytes] | None = None
        produced = 0
        while True:
            handles, after, more, added = await self._tx.adrive(self._g_page(after))
            for h in handles:
                if self._filters and not all(p(h) for p in self._filters):
                    continue
                yield h
                produced += 1
                if self._limit is not None and produced >= self._limit:
                    return
            h = None  # hold nothing of the page: _forget frees what nobody else holds
            handles.clear()
            self._tx._forget(added)
            if not more:
                return


class AsyncRemoteTransaction(RemoteTransactionBase):
    """An asyncio transaction run on a cluster node (see the module docstring)."""

    _is_async = True
    sessions: AsyncSessions

    def __init__(self, sessions: AsyncSessions, isolation: str = "serializable") -> None:
        super().__init__(sessions, isolation)

    async def adrive(self, op: Op) -> Any:
        self._check_usable()
        await self._ship_queued_calls()
        return await self._adrive_one(op)

    async def _ship_queued_calls(self) -> None:
        """Asynchronous method calls go before the op that follows them (A6, queue_async_call)."""
        while self._queued_calls:
            handle, method, args, kwargs, delay = self._queued_calls.pop(0)
            await self._adrive_one(self._g_call(handle, method, args, kwargs, delay))

    async def _adrive_one(self, op: Op) -> Any:
        try:
            payload = next(op)
            while True:
                reply = await self._send(payload)
                payload = op.send(reply)
        except StopIteration as stop:
            return stop.value

    async def _send(self, payload: Request) -> Any:
        try:
            if self._s is None:
                link, reply = await self.sessions.open(self._first(payload))
                self._took_session(link, reply)
                return raise_error(reply)
            s = payload["s"] = self._s
            link = self._session_link()
            try:
                reply = await self.sessions.send(link, payload)
            except asyncio.CancelledError:
                # This task was cancelled, not the connection: other transactions share it.
                self.sessions.abandon(link, s)
                self._doomed = Unavailable("the transaction's task was cancelled")
                raise
            return raise_error(reply)
        except BaseException as exc:
            self._absorb(exc)
            raise

    def _deref(self, ref: Ref) -> Any:
        e = self._entries.get(ref.raw)
        if e is None:
            raise BadArgument(
                "a reference field of an object not loaded in this async remote transaction; "
                "load it first with `await tx.by_ref(ref)`"
            )
        return None if e.status >= DELETED else e.handle

    def remote_call(
        self, obj: Managed, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self.adrive(self._g_call(obj, method, args, kwargs))

    # --------------------------------------------------------------- API
    async def create(self, cls: type[M], /, *, node: str | None = None, **values: Any) -> M:
        """See :meth:`RemoteTransaction.create`."""
        return await self.adrive(self._g_create(cls, node, values))  # type: ignore[no-any-return]

    async def find(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M | None:
        return await self.adrive(self._g_lookup(cls, lock, key))  # type: ignore[no-any-return]

    async def get(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M:
        obj = await self.find(cls, lock=lock, **key)
        if obj is None:
            raise NotFound(f"no {getattr(cls, '__name__', cls)} with {describe_key(key)}")
        return obj

    async def get_or_create(
        self,
        cls: type[M],
        /,
        *,
        defaults: dict[str, Any] | None = None,
        node: str | None = None,
        **key: Any,
    ) -> tuple[M, bool]:
        found = await self.find(cls, lock="write", **key)
        if found is not None:
            return found, False
        return await self.create(cls, node=node, **{**(defaults or {}), **key}), True

    async def by_ref(self, ref: Ref, /, *, lock: str | None = None) -> Managed | None:
        return await self.adrive(self._g_by_ref(ref, lock))  # type: ignore[no-any-return]

    async def lock(self, obj: Managed, mode: str = "write") -> None:
        await self.adrive(self._g_lock(obj, mode))

    async def delete(self, obj: Managed) -> None:
        await self.adrive(self._g_delete(obj))

    async def count(
        self, cls: type[Managed], /, *, scope: str | list[str] = "cluster", audit: str = "skip_down"
    ) -> int:
        return await self.adrive(self._g_count(self._type(cls), scope, audit))  # type: ignore[no-any-return]

    async def extent(
        self,
        cls: type[M],
        /,
        *,
        lock: str | None = None,
        scope: str | list[str] = "cluster",
        audit: str = "skip_down",
    ) -> list[M]:
        return await self.query(cls).lock(lock).scope(scope).audit(audit).all()  # type: ignore[no-any-return]

    def query(self, cls: type[M], /) -> AsyncRemoteQuery[M]:
        self._check_usable()
        return AsyncRemoteQuery(self, self._type(cls))

    async def commit(self) -> None:
        """See :meth:`RemoteTransaction.commit` (exactly once, H1; Unavailable = unknown)."""
        try:
            self._check_usable()
            await self._ship_queued_calls()
        except TransactionClosed:
            raise
        except BaseException:
            await self.rollback()
            raise
        if self._committed_without_session():
            return
        link, payload, req = self._start_commit()
        with self._commit_outcome(link, req):  # a cancelled task: the outcome is unknown
            await self.sessions.commit(link, payload, req)

    async def rollback(self) -> None:
        """Drop every change; the node releases every lock.  Safe to call twice."""
        session = self._end_for_rollback()
        if session is not None:
            await self.sessions.rollback(*session)

    async def __aenter__(self) -> AsyncRemoteTransaction:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            if self._state is TxState.ACTIVE:
                await self.commit()
        else:
            await self.rollback()


__all__ = ["AsyncRemoteQuery", "AsyncRemoteTransaction"]
