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
from typing import TYPE_CHECKING, Any, TypeVar

from nonstop.client.remote import DELETED, Op, RemoteQueryBase, RemoteTransactionBase, Request
from nonstop.errors import BadArgument, NotFound, TransactionClosed, Unavailable
from nonstop.model.managed import Managed
from nonstop.model.ref import Ref
from nonstop.model.wire import raise_error
from nonstop.tx.transaction import _describe, _State

if TYPE_CHECKING:
    from nonstop.client.handle import AsyncClient

M = TypeVar("M", bound=Managed)


class AsyncRemoteQuery(RemoteQueryBase[M]):
    """A remote query whose results are awaited: ``await q.all()``, ``async for obj in q``."""

    _tx: AsyncRemoteTransaction

    async def all(self) -> list[M]:
        return await self._tx._adrive(self._g_all())  # type: ignore[no-any-return]

    async def first(self) -> M | None:
        found = await self._tx._adrive(self._g_all(limit=1))
        return found[0] if found else None

    async def count(self) -> int:
        return await self._tx._adrive(self._g_count())  # type: ignore[no-any-return]

    async def __aiter__(self) -> AsyncIterator[M]:
        for obj in await self.all():
            yield obj


class AsyncRemoteTransaction(RemoteTransactionBase):
    """An asyncio transaction run on a cluster node (see the module docstring)."""

    _is_async = True
    client: AsyncClient

    async def _adrive(self, op: Op) -> Any:
        self._check_usable()
        await self._ship_queued_calls()
        return await self._adrive_one(op)

    async def _ship_queued_calls(self) -> None:
        """Asynchronous method calls go before the op that follows them (A6, _enqueue_async)."""
        while self._queued_calls:
            handle, method, args, kwargs = self._queued_calls.pop(0)
            await self._adrive_one(self._g_call(handle, method, args, kwargs))

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
                chan, reply = await self.client._open_session(self._first(payload))
                self._took_session(chan, reply)
                return raise_error(reply)
            payload["s"] = self._s
            chan = self._chan
            try:
                reply = await chan.call(payload, self.client.op_timeout)
            except asyncio.CancelledError:
                # This task was cancelled, not the connection: other transactions share it.
                chan.send_nowait({"op": "tx.rollback", "s": self._s})
                self._doomed = Unavailable("the transaction's task was cancelled")
                raise
            except BaseException as exc:
                # Lost, reset or silent (B8).  The node rolls the session back when the
                # link closes; a link kept (a slow op, a live node) is told to.
                chan.send_nowait({"op": "tx.rollback", "s": self._s})
                await self.client._failed(chan, exc)
                raise Unavailable(
                    f"no answer from {chan.address} during the transaction ({exc!r}); "
                    "the node rolls it back"
                ) from exc
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

    def _remote_call(
        self, obj: Managed, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self._adrive(self._g_call(obj, method, args, kwargs))

    # --------------------------------------------------------------- API
    async def create(self, cls: type[M], /, *, node: str | None = None, **values: Any) -> M:
        """See :meth:`RemoteTransaction.create`."""
        return await self._adrive(self._g_create(cls, node, values))  # type: ignore[no-any-return]

    async def find(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M | None:
        return await self._adrive(self._g_lookup(cls, lock, key))  # type: ignore[no-any-return]

    async def get(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M:
        obj = await self.find(cls, lock=lock, **key)
        if obj is None:
            raise NotFound(f"no {getattr(cls, '__name__', cls)} with {_describe(key)}")
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
        return await self._adrive(self._g_by_ref(ref, lock))  # type: ignore[no-any-return]

    async def lock(self, obj: Managed, mode: str = "write") -> None:
        await self._adrive(self._g_lock(obj, mode))

    async def delete(self, obj: Managed) -> None:
        await self._adrive(self._g_delete(obj))

    async def count(
        self, cls: type[Managed], /, *, scope: str | list[str] = "cluster", audit: str = "skip_down"
    ) -> int:
        return await self._adrive(self._g_count(self._type(cls), scope, audit))  # type: ignore[no-any-return]

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
        if self._s is None:
            self._ended(_State.COMMITTED)
            return
        self._state = _State.COMMITTING
        chan = self._chan
        payload, req = self._commit_payload()
        try:
            try:
                reply = await chan.call(payload, self.client.op_timeout)
            except asyncio.CancelledError:
                self._ended(_State.ROLLED_BACK)  # (outcome unknown: the task is gone)
                raise
            except BaseException as exc:
                await self.client._failed(chan, exc)
                self._ended(_State.ROLLED_BACK)
                if req is not None:
                    await self.client._request_result(chan.address, req, exc)
                # (Read-only: every read was made under its locks; nothing to commit.)
                self._state = _State.COMMITTED
                return
            self._ended(_State.COMMITTED)
            try:
                raise_error(reply)
            except BaseException:
                self._state = _State.ROLLED_BACK
                raise
        finally:
            if req is not None:
                self.client._request_done(req)

    async def rollback(self) -> None:
        """Drop every change; the node releases every lock.  Safe to call twice."""
        if self._state not in (_State.ACTIVE, _State.COMMITTING):
            return
        chan, s = self._chan, self._s
        self._ended(_State.ROLLED_BACK)
        if chan is None or s is None or chan.closed:
            return
        try:
            await chan.call({"op": "tx.rollback", "s": s}, self.client.timeout)
        except BaseException:
            self.client._discard(chan)  # the node rolls back when it sees the link go

    async def __aenter__(self) -> AsyncRemoteTransaction:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            if self._state is _State.ACTIVE:
                await self.commit()
        else:
            await self.rollback()


__all__ = ["AsyncRemoteQuery", "AsyncRemoteTransaction"]
