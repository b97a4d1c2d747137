"""Asynchronous methods (A6): queued by a transaction, run after it commits, exactly once.

``@nonstop.asynchronous`` marks a method of a managed type.  Calling it inside a
transaction does not run it: the call (method name, arguments, sender) is added
to the transaction's write set under the key

    target ref (20 bytes) + priority (1 byte: 0 for a self-send, 1 otherwise) + sequence (8 bytes)

in the store's ``asyncq`` database, so it becomes durable with the transaction
or not at all.  After commit the dispatcher runs it in a new transaction that
also deletes the queue entry — the method's effects and the "done" mark commit
together, which is what makes it exactly once across crashes and restarts.

Guarantees (seed 000 ch. 4, "Asynchronous methods"):

* one call at a time per target object, in queue order: per target FIFO by
  sequence, so calls from one sender run in send order;
* a call an object sends to itself runs before other queued calls to it;
* replayed on deadlock or conflict (the runner's retry loop);
* dropped if the target was deleted before it ran;
* pending calls resume when the database is reopened after a stop or crash;
* a call that raises a non-retryable error is rolled back, removed from the
  queue and recorded in the ``dead`` database (see ``Database.dead_letters``).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
from bisect import insort
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from nonstop.errors import DatabaseClosed, Error, UnknownType
from nonstop.model.codec import pack, unpack
from nonstop.model.ref import REF_SIZE, Ref

if TYPE_CHECKING:
    from nonstop.model.managed import Managed
    from nonstop.tx.database import Database
    from nonstop.tx.transaction import Transaction

log = logging.getLogger("nonstop.async")

# Most queued calls of one target run together in one transaction (see _run).
MAX_BATCH = 256
# Seconds a worker waits for more calls before running a batch smaller than MAX_BATCH.
LINGER = 0.01

# The object whose asynchronous method is running (None outside one): the sender
# of any call it makes, so that self-sends can be recognised.
current_sender: contextvars.ContextVar[bytes | None] = contextvars.ContextVar(
    "nonstop_current_sender", default=None
)


class AsyncMethod:
    """Descriptor made by ``@asynchronous``: a call on a handle queues instead of running."""

    # Queuing a call is location independent: a client's remote transaction ships
    # it to the target's master node (as a ``tx.call`` of this method), where it is
    # queued in that node's commit and runs there, exactly once (A6 to remote targets).
    __nonstop_remote__ = True

    def __init__(self, func: Callable[..., Any], isolation: str) -> None:
        self.func = func
        self.isolation = isolation
        self.name = func.__name__
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Managed | None, owner: type) -> Any:
        if obj is None:
            return self

        def queue_call(*args: Any, **kwargs: Any) -> None:
            entry = obj._e
            # (The handle protocol's name: remote transactions answer it too; the
            # embedded one also as queue_async_call.)
            entry.tx.queue_async_call(entry, self.name, args, kwargs)

        queue_call.__name__ = self.name
        queue_call.__doc__ = self.func.__doc__
        return queue_call


def asynchronous(func: Callable[..., Any] | None = None, *, isolation: str = "serializable") -> Any:
    """Mark a managed type's method as asynchronous (A6)."""
    if func is None:
        return lambda f: AsyncMethod(f, isolation)
    return AsyncMethod(func, isolation)


def _refs_in(tx: Transaction, value: Any) -> Any:
    if isinstance(value, Ref):
        return tx.by_ref(value)
    if isinstance(value, list):
        return [_refs_in(tx, v) for v in value]
    if isinstance(value, dict):
        return {k: _refs_in(tx, v) for k, v in value.items()}
    return value


class AsyncDispatcher:
    """Runs queued asynchronous calls on worker threads, one at a time per target."""

    def __init__(self, db: Database, workers: int = 2) -> None:
        self._db = db
        self._cond = threading.Condition()
        self._pending: dict[bytes, list[bytes]] = {}
        self._ready: deque[bytes] = deque()
        self._busy: set[bytes] = set()
        # Targets whose last batch failed: run their calls one per transaction.
        self._single: set[bytes] = set()
        self._stopping = False
        self.executed = 0
        self.dropped = 0
        self.failed = 0
        store = db.engine.store
        with store.read() as rtxn:
            # lmdb returns bytes (buffers=False); its stubs say bytes | memoryview.
            keys = cast(
                list[bytes], list(rtxn.cursor(db=store.asyncq).iternext(keys=True, values=False))
            )
            # Dead letters are keyed by sequence: never reuse one after a restart.
            dead = rtxn.cursor(db=store.dead)
            last_dead = int.from_bytes(dead.key(), "big") if dead.last() else 0
        self._seq = 1 + max([last_dead, *(int.from_bytes(k[REF_SIZE + 1 :], "big") for k in keys)])
        self._add(keys)
        self._threads = [
            threading.Thread(target=self._work, name=f"nonstop-async-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def next_key(self, target: bytes, self_send: bool) -> bytes:
        with self._cond:
            seq = self._seq
            self._seq += 1
        return target + (b"\x00" if self_send else b"\x01") + seq.to_bytes(8, "big")

    def committed(self, keys: list[bytes]) -> None:
        """Calls became durable: schedule them."""
        self._add(keys)

    def _add(self, keys: list[bytes]) -> None:
        if not keys:
            return
        with self._cond:
            for key in keys:
                target = key[:REF_SIZE]
                queue = self._pending.setdefault(target, [])
                insort(queue, key)
                if target not in self._busy and target not in self._ready:
                    self._ready.append(target)
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._pending.values())

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no call is queued or running (for tests and orderly shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()

    # -------------------------------------------------------------- workers
    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._ready and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                target = self._ready.popleft()
                self._busy.add(target)
                small = len(self._pending[target]) < MAX_BATCH
            if small and LINGER:
                # Let more calls for this target arrive first: fewer, larger transactions,
                # and a worker that is runnable less often.  A runnable worker costs the
                # application threads dearly: LMDB drops the GIL on every read and the
                # worker takes it each time (measured: 53 us per read instead of ~2 us).
                time.sleep(LINGER)
            with self._cond:
                size = 1 if target in self._single else MAX_BATCH
                keys = self._pending[target][:size]
            try:
                done = self._run(keys)
            except UnknownType as exc:
                # Opened before the application imported the type: wait for it.
                log.warning("asynchronous calls wait for their type: %s", exc)
                time.sleep(0.5)
                done = []
            except Exception:
                if self._stopping:
                    return  # closing: the calls stay queued and run after a reopen
                log.exception("asynchronous call dispatcher failed; the calls stay queued")
                time.sleep(0.1)
                done = []
            with self._cond:
                queue = self._pending[target]
                if done:
                    finished = set(done)  # one pass, not one list.remove per call
                    queue[:] = [k for k in queue if k not in finished]
                self._busy.discard(target)
                if queue:
                    self._ready.append(target)
                else:
                    del self._pending[target]
                    self._single.discard(target)
                self._cond.notify_all()

    def _run(self, keys: list[bytes]) -> list[bytes]:
        """Run queued calls of one target, in order, in one transaction; return those done.

        Batching keeps "one at a time per target, in order" (they run one after the
        other inside the transaction) and exactly-once (every call's queue entry is
        deleted in the transaction that applies its effects), and turns N calls into
        one commit.  The batch ends early after a call that sends to its own target,
        so that the self-send runs next.  If a batch fails, the target falls back to
        one call per transaction, so only the failing call is dead-lettered.
        """
        from nonstop.tx.runner import run_with_retries

        db = self._db
        store = db.engine.store
        target_ref = keys[0][:REF_SIZE]
        outcome: list[str] = []
        ran: list[bytes] = []

        def call(tx: Transaction) -> None:
            outcome.clear()
            ran.clear()
            target = tx.by_ref(Ref(target_ref))
            with store.read() as rtxn:  # every queued record of the batch, one snapshot
                records = cast(list[bytes | None], [rtxn.get(key, db=store.asyncq) for key in keys])
            for key, raw in zip(keys, records, strict=True):
                ran.append(key)
                if raw is None:  # already ran (cannot happen in one process; cheap to check)
                    outcome.append("gone")
                    continue
                tx.write_raw([(False, store.asyncq, key, None)])
                if target is None:
                    outcome.append("dropped")
                    continue
                method, args, kwargs, _sender = unpack(raw)
                descriptor = getattr(type(target), method, None)
                if not isinstance(descriptor, AsyncMethod):
                    raise Error(f"{type(target).__name__}.{method} is not an asynchronous method")
                before = len(tx.queued_calls())
                token = current_sender.set(target_ref)
                try:
                    descriptor.func(target, *_refs_in(tx, args), **_refs_in(tx, kwargs))
                finally:
                    current_sender.reset(token)
                outcome.append("ran")
                if any(k[:REF_SIZE] == target_ref for k, _ in tx.queued_calls()[before:]):
                    break  # a self-send must run before the rest of the queue

        try:
            run_with_retries(db, call, isolation=self._isolation_of(keys[0]))
        except (DatabaseClosed, UnknownType):
            raise  # not the call's fault (closing, type not imported yet): keep them queued
        except Exception as exc:
            if len(keys) > 1:
                with self._cond:
                    self._single.add(target_ref)
                return []
            self._bury(keys[0], exc)
            return keys
        self.dropped += outcome.count("dropped")
        self.executed += outcome.count("ran")
        return list(ran)

    def _bury(self, key: bytes, exc: Exception) -> None:
        """Dead-letter one failed call: remove it from the queue, keep it in ``dead``."""
        from nonstop.tx.runner import run_with_retries

        db = self._db
        target_ref = key[:REF_SIZE]
        error_text = f"{type(exc).__name__}: {exc}"
        self.failed += 1
        log.error(
            "asynchronous call %s on %s failed and was dead-lettered: %s",
            key[REF_SIZE + 1 :].hex(),
            Ref(target_ref),
            exc,
        )

        def bury(tx: Transaction) -> None:
            store = db.engine.store
            raw = db.engine.get_raw(store.asyncq, key)
            if raw is None:
                return
            record = [Ref(target_ref), unpack(raw), error_text, time.time()]
            tx.write_raw(
                [
                    (False, store.asyncq, key, None),
                    (True, store.dead, key[REF_SIZE + 1 :], pack(record)),
                ]
            )

        run_with_retries(db, bury)

    def _isolation_of(self, key: bytes) -> str:
        engine = self._db.engine
        raw = engine.store.asyncq_get(key)
        if raw is None:
            return "serializable"
        method = unpack(raw)[0]
        rec = engine.store.get_object(key[:REF_SIZE])
        if rec is None:
            return "serializable"
        try:
            cls = engine.type_by_name(rec[0]).cls
        except Error:
            return "serializable"
        descriptor = getattr(cls, method, None)
        return descriptor.isolation if isinstance(descriptor, AsyncMethod) else "serializable"
