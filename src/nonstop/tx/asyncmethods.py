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

**Timers (D20).**  ``obj.method.after(seconds, *args)`` queues the same call with a
due time (wall clock, seconds since the epoch) as the record's fifth item, under
priority byte 2: it runs like any queued call, once, at or after its due time.
The dispatcher keeps calls not yet due in a heap and moves them to their target's
queue when due; a timer never holds back the calls queued after it.

**A gate (partitions, docs/design/ha.md "Queued calls and timers move with their
partition").**  On a node whose partitions replicate, a :class:`CallGate` decides
which targets this node may run (those of the partitions it acts for, with the
store holding the partition's copy) and commits each run through the partition's
replication stream.  A target the gate refuses is *parked*: its calls stay in the
store and come back with :meth:`AsyncDispatcher.resume` when the gate's answer
changes (this node became active for the partition).  The in-memory queue is a
cache of the store's ``asyncq``; the store is the truth.
"""

from __future__ import annotations

import contextvars
import functools
import heapq
import logging
import threading
import time
from bisect import insort
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from nonstop.errors import BadArgument, DatabaseClosed, Error, UnknownType
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
# The priority byte of a queue key (module doc): a self-send, another call, a timer.
SELF_SEND, CALL, TIMER = b"\x00", b"\x01", b"\x02"
# The longest delay a timer takes (seconds): ten years; anything longer is a mistake.
MAX_DELAY = 10 * 365 * 24 * 3600.0

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

        return QueuedCall(obj, self)


class QueuedCall:
    """``obj.method`` of an ``@asynchronous`` method: call it to queue the call (A6), or
    ``.after(seconds, ...)`` to queue it as a timer (D20)."""

    def __init__(self, obj: Managed, method: AsyncMethod) -> None:
        self._obj = obj
        self._method = method
        self.__name__ = method.name
        self.__doc__ = method.func.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        """Queue the call: it runs after this transaction commits, exactly once."""
        entry = self._obj._e
        # (The handle protocol's name: remote transactions answer it too.)
        entry.tx.queue_async_call(entry, self._method.name, args, kwargs)

    def after(self, seconds: float, /, *args: Any, **kwargs: Any) -> None:
        """Queue the call as a timer: it runs once, at least ``seconds`` after this
        transaction's commit (D20) -- in the object's partition, across failover."""
        entry = self._obj._e
        entry.tx.queue_async_call(
            entry, self._method.name, args, kwargs, delay=check_delay(seconds)
        )


def check_delay(seconds: object) -> float:
    """A timer's delay in seconds (a finite number in 0..MAX_DELAY); BadArgument if not."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise BadArgument(f"a timer's delay is a number of seconds, got {seconds!r:.40}")
    delay = float(seconds)
    if not 0.0 <= delay <= MAX_DELAY:  # (NaN fails both comparisons)
        raise BadArgument(f"a timer's delay is 0..{MAX_DELAY:.0f} seconds, got {seconds!r:.40}")
    return delay


class CallGate(Protocol):
    """Which queued calls this node runs, and how their runs commit (module doc)."""

    def admit(self, target: bytes) -> object | None:
        """A fence token if this node may run ``target``'s calls now, else None."""

    def commit(self, tx: Transaction, token: object) -> None:
        """Commit a run (blocking, on a dispatcher thread) -- only if ``token`` still holds.

        Raises :class:`Parked` if it did not commit: ``Parked(None)`` when nothing was
        made (the partition moved), ``Parked(token)`` when the outcome is not known
        here (the run's record may be on the partition's promoted copy: its calls
        wait for a copy under another token)."""


class Parked(Error):
    """The gate did not commit a run (:meth:`CallGate.commit`): the target is parked.

    Not retryable on purpose: the run is not replayed here; the calls come back with
    :meth:`AsyncDispatcher.resume` once the gate admits them under a token other than
    ``token`` (None: under any token)."""

    def __init__(self, message: str, token: object = None) -> None:
        super().__init__(message)
        self.token = token


def _due(key: bytes, record: bytes) -> float | None:
    """A queued call's due time (a timer's), or None (a call to run now)."""
    if key[REF_SIZE : REF_SIZE + 1] != TIMER:
        return None
    fields = unpack(bytes(record))
    return float(fields[4]) if len(fields) > 4 else None


def asynchronous(func: Callable[..., Any] | None = None, *, isolation: str = "serializable") -> Any:
    """Mark a managed type's method as asynchronous (A6)."""
    if func is None:
        return lambda f: AsyncMethod(f, isolation)
    return AsyncMethod(func, isolation)


def queue_records(tx: Transaction) -> list[list[Any]]:
    """The queue entries ``tx`` writes, as replication records ``["q", key, record]``
    (record None: the entry is deleted -- the call ran or was dead-lettered), so that a
    queued call rides its target partition's replicated write set with the transaction."""
    asyncq = tx.engine.store.asyncq
    out: list[list[Any]] = [["q", key, record] for key, record in tx.queued_calls()]
    for is_put, db, key, value in tx.raw_ops():
        if db is asyncq:
            out.append(["q", bytes(key), bytes(value) if is_put and value is not None else None])
    return out


def _refs_in(tx: Transaction, value: Any) -> Any:
    if isinstance(value, Ref):
        return tx.by_ref(value)
    if isinstance(value, list):
        return [_refs_in(tx, v) for v in value]
    if isinstance(value, dict):
        return {k: _refs_in(tx, v) for k, v in value.items()}
    return value


class AsyncDispatcher:
    """Runs queued asynchronous calls on worker threads, one at a time per target.

    ``held``: run nothing until :meth:`attach_gate` (a node whose partitions replicate
    opens its store before it knows which partitions it acts for).
    """

    def __init__(self, db: Database, workers: int = 2, *, held: bool = False) -> None:
        self._db = db
        self._cond = threading.Condition()
        self._pending: dict[bytes, list[bytes]] = {}
        self._queued: set[bytes] = set()  # every key of _pending, for de-duplication
        self._ready: deque[bytes] = deque()
        self._busy: set[bytes] = set()
        # Timers not due yet: (due, key), earliest first.
        self._timers: list[tuple[float, bytes]] = []
        # Targets whose last batch failed: run their calls one per transaction.
        self._single: set[bytes] = set()
        # Targets the gate refused: target -> the token they must not run under again
        # (None: any token the gate gives later).
        self._parked: dict[bytes, object | None] = {}
        self._gate: CallGate | None = None
        self._held = held
        self._stopping = False
        self.executed = 0
        self.dropped = 0
        self.failed = 0
        store = db.engine.store
        with store.read() as rtxn:
            items = self._scan(rtxn)
            # Dead letters are keyed by sequence: never reuse one after a restart.
            dead = rtxn.cursor(db=store.dead)
            last_dead = int.from_bytes(dead.key(), "big") if dead.last() else 0
        self._seq = 1 + max(
            [last_dead, *(int.from_bytes(k[REF_SIZE + 1 :], "big") for k, _ in items)]
        )
        self._add(items)
        self._threads = [
            threading.Thread(target=self._work, name=f"nonstop-async-{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def _scan(self, rtxn: Any) -> list[tuple[bytes, float | None]]:
        """Every queued call of the store: (key, due time)."""
        store = self._db.engine.store
        return [(bytes(k), _due(k, v)) for k, v in rtxn.cursor(db=store.asyncq)]

    def next_key(self, target: bytes, self_send: bool, timer: bool = False) -> bytes:
        with self._cond:
            seq = self._seq
            self._seq += 1
        kind = TIMER if timer else SELF_SEND if self_send else CALL
        return target + kind + seq.to_bytes(8, "big")

    def committed(self, calls: Iterable[tuple[bytes, bytes]]) -> None:
        """Calls (queue key, record) became durable: schedule them."""
        self._add([(k, _due(k, r)) for k, r in calls])

    def attach_gate(self, gate: CallGate) -> None:
        """Run only what ``gate`` admits, committed through it (module doc); releases a hold."""
        with self._cond:
            self._gate = gate
            self._held = False
            self._cond.notify_all()

    def resume(self) -> int:
        """The gate's answers may have changed: queue again every stored call whose target
        it now admits (parked, or loaded into the store by a partition's copy); how many."""
        with self._db.engine.store.read() as rtxn:
            items = self._scan(rtxn)
        gate = self._gate
        tokens = {} if gate is None else {k[:REF_SIZE]: gate.admit(k[:REF_SIZE]) for k, _ in items}
        # Decided under the lock, against the parked marks as they are now: a run that
        # just parked its target under its token is never queued again under that token.
        with self._cond:
            back: list[tuple[bytes, float | None]] = []
            for key, due in items:
                target = key[:REF_SIZE]
                if gate is not None:
                    token = tokens[target]
                    if token is None:
                        continue
                    if target in self._parked:
                        fenced = self._parked[target]
                        if fenced is not None and fenced == token:
                            continue
                back.append((key, due))
            for key, _ in back:
                self._parked.pop(key[:REF_SIZE], None)
            return self._add(back)

    def _add(self, items: list[tuple[bytes, float | None]]) -> int:
        if not items:
            return 0
        added = 0
        now = time.time()
        with self._cond:
            for key, due in items:
                if key in self._queued:
                    continue
                self._queued.add(key)
                added += 1
                if due is not None and due > now:
                    heapq.heappush(self._timers, (due, key))
                else:
                    self._enqueue(key)
            self._cond.notify_all()
        return added

    def _enqueue(self, key: bytes) -> None:
        # (under self._cond)
        target = key[:REF_SIZE]
        queue = self._pending.setdefault(target, [])
        insort(queue, key)
        if target not in self._busy and target not in self._ready:
            self._ready.append(target)

    def _release_due(self) -> float | None:
        """Timers now due join their target's queue; seconds until the next one (under
        self._cond)."""
        timers = self._timers
        now = time.time()
        while timers and timers[0][0] <= now:
            self._enqueue(heapq.heappop(timers)[1])
        return timers[0][0] - now if timers else None

    def parked(self) -> dict[bytes, object | None]:
        """The targets whose calls wait for the gate (:meth:`resume`), each with the token
        it must not run under again (None: any)."""
        with self._cond:
            return dict(self._parked)

    @property
    def stopping(self) -> bool:
        """Closing: a run waiting for something outside gives up (its calls stay queued)."""
        return self._stopping

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._pending.values()) + len(self._timers)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until no call is queued, running or timed (for tests and orderly shutdown)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy or self._timers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05) if self._timers else left)
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
                while True:
                    if self._stopping:
                        return
                    wait = None if self._held else self._release_due()
                    if self._ready and not self._held:
                        break
                    self._cond.wait(wait)
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
                gate = self._gate
            parked: Parked | None = None
            token: object = None
            try:
                token = None if gate is None else gate.admit(target)
                if gate is not None and token is None:
                    raise Parked("this node does not run the target's calls")
                done = self._run(keys, gate, token)
            except Parked as exc:
                parked = exc
                done = []
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
                if parked is not None:  # forget its calls: in the store until resume()
                    self._parked[target] = parked.token
                    done = list(queue)
                if done:
                    finished = set(done)  # one pass, not one list.remove per call
                    queue[:] = [k for k in queue if k not in finished]
                    self._queued.difference_update(finished)
                self._busy.discard(target)
                if queue:
                    self._ready.append(target)
                else:
                    del self._pending[target]
                    self._single.discard(target)
                self._cond.notify_all()

    def _run(self, keys: list[bytes], gate: CallGate | None, token: object) -> list[bytes]:
        """Run queued calls of one target, in order, in one transaction; return those done.

        Batching keeps "one at a time per target, in order" (they run one after the
        other inside the transaction) and exactly-once (every call's queue entry is
        deleted in the transaction that applies its effects), and turns N calls into
        one commit.  The batch ends early after a call that sends to its own target,
        so that the self-send runs next.  If a batch fails, the target falls back to
        one call per transaction, so only the failing call is dead-lettered.  With a
        gate, the transaction commits through it (module doc): a refusal propagates.
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
                if raw is None:  # already ran (a resume raced a run): nothing to do
                    outcome.append("gone")
                    continue
                tx.write_raw([(False, store.asyncq, key, None)])
                if target is None:
                    outcome.append("dropped")
                    continue
                method, args, kwargs, *_ = unpack(raw)
                descriptor = getattr(type(target), method, None)
                if not isinstance(descriptor, AsyncMethod):
                    raise Error(f"{type(target).__name__}.{method} is not an asynchronous method")
                before = len(tx.queued_calls())
                token_ = current_sender.set(target_ref)
                try:
                    descriptor.func(target, *_refs_in(tx, args), **_refs_in(tx, kwargs))
                finally:
                    current_sender.reset(token_)
                outcome.append("ran")
                if any(k[:REF_SIZE] == target_ref for k, _ in tx.queued_calls()[before:]):
                    break  # a self-send must run before the rest of the queue
            if gate is not None:
                gate.commit(tx, token)

        try:
            run_with_retries(db, call, isolation=self._isolation_of(keys[0]))
        except (DatabaseClosed, UnknownType, Parked):
            # Not the call's fault (closing, type not imported yet, the partition moved):
            # keep them queued.
            raise
        except Exception as exc:
            if len(keys) > 1:
                with self._cond:
                    self._single.add(target_ref)
                return []
            self._bury(keys[0], exc, gate, token)
            return keys
        self.dropped += outcome.count("dropped")
        self.executed += outcome.count("ran")
        return list(ran)

    def _bury(self, key: bytes, exc: Exception, gate: CallGate | None, token: object) -> None:
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
            if gate is not None:
                gate.commit(tx, token)

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
