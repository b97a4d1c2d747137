"""The asyncio flavour of transactions: ``async with db.transaction() as tx``.

Same semantics as :class:`~nonstop.tx.transaction.Transaction`; every method that
may wait for a lock or for the disk is a coroutine.  Lock waits suspend the task
(not the thread), and commit awaits the group committer, so thousands of
concurrent transactions can run on one event loop.

Attribute access on objects cannot await.  It never blocks: if reading or
writing a field needs a lock another transaction holds, the transaction fails
with a retryable :class:`~nonstop.errors.Conflict` and ``@transactional``
replays it.  Take the locks you need with the lookup (``lock="write"``) or with
``await tx.lock(obj, "write")`` to avoid that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Hashable
from typing import Any, TypeVar

import lmdb

from nonstop.errors import Conflict, Error, NotFound
from nonstop.model.entry import DELETED
from nonstop.model.managed import Managed
from nonstop.model.ref import Ref, check_epoch, check_location
from nonstop.store.group_commit import WriteSet
from nonstop.tx.entries import NONE, WRITE, Op, TxState, describe_key, parse_lock
from nonstop.tx.locks import LockMode
from nonstop.tx.query import Query
from nonstop.tx.transaction import Transaction

M = TypeVar("M", bound=Managed)

DRIVE_SLICE = 0.01
"""Seconds an op runs between two of its locks before :meth:`AsyncTransaction.adrive`
lets the event loop run (keep-alives, other clients)."""


class AsyncTransaction(Transaction):
    """A transaction driven by an asyncio task."""

    _is_async = True

    async def adrive(self, op: Op) -> Any:
        """Run a generator operation (:data:`~nonstop.tx.entries.Op`), awaiting each lock
        it yields; its return value (see :meth:`Transaction.drive`)."""
        try:
            request = next(op)
            slice_end = time.monotonic() + DRIVE_SLICE
            while True:
                resource, mode = request
                try:
                    await self.engine.locks.acquire_async(
                        self.id, resource, mode, self._lock_timeout
                    )
                except Error as exc:
                    self._doomed = exc
                    raise
                if time.monotonic() >= slice_end:
                    # A long op (a replica applying thousands of records, a restore
                    # batch) lets the loop run between two of its locks, as a lock
                    # wait would: its locks are held, nothing it did is visible.
                    await asyncio.sleep(0)
                    slice_end = time.monotonic() + DRIVE_SLICE
                request = op.send(None)
        except StopIteration as stop:
            return stop.value
        except lmdb.InvalidParameterError as exc:
            raise self._view_error(exc) from exc

    def _lock_now(self, resource: Hashable, mode: LockMode) -> None:
        if not self.engine.locks.try_acquire(self.id, resource, mode):
            self._doomed = Conflict(
                "attribute access in an async transaction needs a lock another transaction "
                "holds; take it up front (lock='write' or await tx.lock(obj))"
            )
            raise self._doomed

    # ------------------------------------------------------------------ API
    async def create(self, cls: type[M], /, **values: Any) -> M:  # type: ignore[override]
        self.check_usable()
        info = self.engine.ensure_type(cls)
        e = await self.adrive(self.g_insert(info, self._new_state(info, values)))
        return e.handle  # type: ignore[no-any-return]

    async def create_in(  # type: ignore[override]
        self, cls: type[M], location: int, epoch: int = 0, /, **values: Any
    ) -> M:
        self.check_usable()
        check_location(location)
        check_epoch(epoch)
        info = self.engine.ensure_type(cls)
        state = self._new_state(info, values)
        e = await self.adrive(self.g_insert(info, state, None, location, epoch))
        return e.handle  # type: ignore[no-any-return]

    async def find(  # type: ignore[override]
        self,
        cls: type[M],
        /,
        *,
        lock: str | None = None,
        **key: Any,
    ) -> M | None:
        self.check_usable()
        info, k, value, mode = self._lookup_args(cls, key, lock)
        e = await self.adrive(self._g_lookup(info, k, value, mode))
        return None if e is None else e.handle

    async def get(  # type: ignore[override]
        self,
        cls: type[M],
        /,
        *,
        lock: str | None = None,
        **key: Any,
    ) -> M:
        obj = await self.find(cls, lock=lock, **key)
        if obj is None:
            raise NotFound(f"no {cls.__name__} with {describe_key(key)}")
        return obj

    async def get_or_create(  # type: ignore[override]
        self,
        cls: type[M],
        /,
        *,
        defaults: dict[str, Any] | None = None,
        **key: Any,
    ) -> tuple[M, bool]:
        self.check_usable()
        info, k, value, _ = self._lookup_args(cls, key, "write")
        e = await self.adrive(self._g_lookup(info, k, value, WRITE))
        if e is not None:
            return e.handle, False
        return await self.create(cls, **{**(defaults or {}), **key}), True

    async def by_ref(  # type: ignore[override]
        self,
        ref: Ref,
        /,
        *,
        lock: str | None = None,
    ) -> Managed | None:
        self.check_usable()
        if not self.in_scope(ref.raw):
            return None
        mode = parse_lock(lock)
        e = await self.adrive(self.g_load(ref.raw, self.default_lock if mode is None else mode))
        return None if e is None else e.handle

    async def lock(self, obj: Managed, mode: str = "write") -> None:  # type: ignore[override]
        e = self.entry_of(obj)
        m = parse_lock(mode) or NONE
        if m > e.lock:
            await self.adrive(self._g_upgrade(e, m))

    async def delete(self, obj: Managed) -> None:  # type: ignore[override]
        e = self.entry_of(obj)
        if e.status >= DELETED:
            from nonstop.errors import Deleted

            raise Deleted(f"{e.info.name} object is already deleted")
        await self.adrive(self._g_delete(e))

    async def count(self, cls: type[Managed]) -> int:  # type: ignore[override]
        return Transaction.count(self, cls)

    async def extent(  # type: ignore[override]
        self,
        cls: type[M],
        /,
        *,
        lock: str | None = None,
    ) -> list[M]:
        q = self.query(cls)
        q.lock(lock)
        return await q.all()

    def query(self, cls: type[M], /) -> AsyncQuery[M]:
        self.check_usable()
        return AsyncQuery(self, self.engine.ensure_type(cls))

    async def commit(self) -> None:  # type: ignore[override]
        ws = self._prepare_commit()
        if ws is None:
            self._finish(TxState.COMMITTED)
            return
        await self._durable(ws, TxState.COMMITTED)

    async def prepare(self, gtid: bytes) -> bool:  # type: ignore[override]
        """See :meth:`Transaction.prepare`."""
        record = self.prepare_write_set(gtid)
        if record is None:
            return False
        await self._durable(record, None)
        self.prepared_durable()
        return True

    async def commit_prepared(self) -> None:  # type: ignore[override]
        await self._durable(self.phase_two(True), TxState.COMMITTED, keep_on_failure=True)
        self.engine.prepared.discard(self._prepared[0])

    async def abort_prepared(self) -> None:  # type: ignore[override]
        await self._durable(self.phase_two(False), TxState.ROLLED_BACK, keep_on_failure=True)
        self.engine.prepared.discard(self._prepared[0])

    async def _durable(
        self, ws: WriteSet, outcome: TxState | None, *, keep_on_failure: bool = False
    ) -> None:
        """Hand ``ws`` to the group committer, wait until durable, then finish as ``outcome``.

        ``outcome`` None: stay open (prepare).  On failure the transaction rolls back,
        unless ``keep_on_failure`` (phase two: it stays prepared and may be retried).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def done(exc: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, future, exc)

        try:
            self.engine.committer.submit(ws, done)
        except BaseException:
            if not keep_on_failure:
                self._finish(TxState.ROLLED_BACK)
            raise
        cancelled: BaseException | None = None
        while not future.done():
            # Once submitted, the outcome is the committer's: even if this task is
            # cancelled, wait for it so that no lock is released before durability.
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError as exc:
                cancelled = exc
            except BaseException:
                break
        failure = future.exception()
        if failure is not None:
            if not keep_on_failure:
                self._finish(TxState.ROLLED_BACK)
            raise failure
        if outcome is not None:
            self._finish(outcome)
        if cancelled is not None:
            raise cancelled

    async def rollback(self) -> None:  # type: ignore[override]
        if self._state is TxState.PREPARED:
            await self.abort_prepared()
        else:
            Transaction.rollback(self)

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            if self._state is TxState.ACTIVE:
                await self.commit()
            # A prepared transaction waits for phase two; leaving the block keeps it.
        else:
            await self.rollback()


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)


class AsyncQuery(Query[M]):
    """A query whose results are awaited: ``await q.all()``, ``async for obj in q``."""

    _tx: AsyncTransaction

    async def all(self) -> list[M]:  # type: ignore[override]
        return await self._tx.adrive(self._g_run())  # type: ignore[no-any-return]

    async def first(self) -> M | None:  # type: ignore[override]
        saved, self._limit = self._limit, 1
        try:
            found = await self.all()
        finally:
            self._limit = saved
        return found[0] if found else None

    async def count(self) -> int:  # type: ignore[override]
        key, path = self._access_key()
        simple = set(self._eq) <= ({key.field} if key is not None else set())
        # A range on another key than the access path's is checked only by loading.
        simple = simple and (self._range is None or path == "range")
        if self._filters or not simple:
            saved, self._lock = self._lock, NONE
            try:
                return len(await self.all())
            finally:
                self._lock = saved
        return len(self._candidates())

    async def __aiter__(self) -> AsyncIterator[M]:
        if self._streams():  # unlocked: no lock to wait for, so the pages are read inline
            for obj in self._stream():
                yield obj
            return
        for obj in await self.all():
            yield obj
