"""Blocking on locks: a thread-safe facade over the sans-I/O :class:`LockManager`.

Transactions run in threads and in asyncio tasks, often both in one process,
so one ``threading.Lock`` guards the manager and each waiter brings its own
way to be woken: a thread blocks on its own ``threading.Event``; a task
awaits a future that the releaser resolves with ``loop.call_soon_threadsafe``
(the releaser may be another thread or the same loop).

Whether a waiter was granted is decided only under the mutex (the releaser
marks it granted there), so a timeout that fires just as the grant arrives
is resolved one way: if the grant got there first the caller gets the lock
and no error; otherwise the request is cancelled and nothing is left held.

**Which transaction a deadlock kills.**  The manager reports a cycle to the
request that would close it.  A transaction that has been *ranked*
(:meth:`LockTable.rank`: when it began, its first attempt's time for a replay)
is protected by its age: the victim is the youngest ranked transaction of the
cycle, which is woken with :class:`~nonstop.errors.Deadlock` while the older
requester goes on waiting.  Without this a long transaction (a serializable
scan that read-locks every account) is the requester of nearly every cycle it
is in, dies each time and, replayed, meets the same short writers again:
starved for as long as they run (it was seen to finish nothing in a 90-transfer
run on a loaded 2-core machine).  Unranked transactions (the node's branches,
whose deadlocks across nodes are settled by ``dataplane/deadlocks.py``) keep
the plain rule: the requester is the victim.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Hashable
from threading import Event, Lock

from nonstop.errors import Deadlock, LockTimeout, TransactionClosed
from nonstop.tx.locks import DeadlockFound, Grant, Granted, LockManager, LockMode, Waiting
from nonstop.tx.loop_slices import SliceRunner

__all__ = ["RELEASE_SLICE", "LockTable"]

RELEASE_SLICE = 2000
"""Locks released per step (~3-15 ms on a loaded 2-core machine, with as many entries
freed in the same loop turn: ~10 ms); a transaction holding no more is
released in one step, as any ordinary transaction."""


class _Waiter(ABC):
    """One blocked request; ``granted``/``error`` are written only under the table's mutex."""

    __slots__ = ("error", "granted")

    def __init__(self) -> None:
        self.granted = False
        self.error: BaseException | None = None

    @abstractmethod
    def wake(self) -> None:
        """Wake whoever waits (a thread's event or a task's future)."""


class _ThreadWaiter(_Waiter):
    __slots__ = ("event",)

    def __init__(self) -> None:
        super().__init__()
        self.event = Event()

    def wake(self) -> None:
        self.event.set()


def _settle(future: asyncio.Future[None]) -> None:
    """Resolve a waiting task's future (on its loop); the outcome is read from the waiter."""
    if not future.done():
        future.set_result(None)


class _AsyncWaiter(_Waiter):
    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(_settle, self.future)
        except RuntimeError:  # the loop is closed: nobody is left to wake
            pass


def _deadlock(txn: Hashable, resource: Hashable, mode: LockMode, found: DeadlockFound) -> Deadlock:
    cycle = " -> ".join(repr(t) for t in (*found.cycle, found.cycle[0]))
    return Deadlock(
        f"deadlock: {txn!r} asking {mode.name} on {resource!r} would close the "
        f"wait-for cycle {cycle}; {txn!r} is the victim"
    )


def _wounded(victim: Hashable, by: Hashable, found: DeadlockFound) -> Deadlock:
    cycle = " -> ".join(repr(t) for t in (*found.cycle, found.cycle[0]))
    return Deadlock(
        f"deadlock: wait-for cycle {cycle}; {victim!r} is the victim, as the youngest "
        f"transaction of the cycle ({by!r}, older, closed it)"
    )


class LockTable:
    """The lock manager shared by every transaction of a process, safe from any thread or loop.

    Errors: :class:`~nonstop.errors.Deadlock` when the request would close a
    wait-for cycle (the caller must roll back, which calls :meth:`release_all`),
    :class:`~nonstop.errors.LockTimeout` when ``timeout`` seconds pass first,
    :class:`~nonstop.errors.TransactionClosed` when the transaction is
    released while one of its requests waits.
    """

    __slots__ = (
        "_born",
        "_manager",
        "_mutex",
        "_waits",
        "deadlocks",
        "slices",
        "timeouts",
        "waits",
    )

    def __init__(
        self, manager: LockManager | None = None, slices: SliceRunner | None = None
    ) -> None:
        self._manager = LockManager() if manager is None else manager
        self.slices = SliceRunner() if slices is None else slices
        """Where a large release runs its slices (the engine's, homed on the node's loop)."""
        self._mutex = Lock()
        self._waits: dict[int, _Waiter] = {}  # ticket -> waiter, for every queued request
        # txn -> when it began (a monotonic clock's seconds): its rank when a deadlock picks
        # a victim (the module's docstring).  Forgotten by release_all.
        self._born: dict[Hashable, float] = {}
        # Counters for the node's metrics (nonstop.node.metrics), changed under the mutex.
        self.waits = 0
        self.timeouts = 0
        self.deadlocks = 0

    def acquire(
        self, txn: Hashable, resource: Hashable, mode: LockMode, timeout: float | None = None
    ) -> None:
        """Take the lock, blocking this thread until granted (or ``timeout`` seconds).

        Never call this on an event loop's thread while the lock may be
        contended: it would block the loop; use :meth:`acquire_async` there.
        """
        with self._mutex:
            outcome, wounded = self._request(txn, resource, mode)
            if not isinstance(outcome, Granted):
                waiter = _ThreadWaiter()
                self._waits[outcome.ticket] = waiter
        for other in wounded:
            other.wake()
        if isinstance(outcome, Granted):
            return
        try:
            waiter.event.wait(timeout)
        except BaseException:
            self._abandon(outcome.ticket, waiter)
            raise
        self._finish(outcome.ticket, waiter, txn, resource, mode, timeout)

    async def acquire_async(
        self, txn: Hashable, resource: Hashable, mode: LockMode, timeout: float | None = None
    ) -> None:
        """Take the lock, suspending this task until granted (or ``timeout`` seconds).

        If the task is cancelled while waiting, the request is withdrawn; if the
        grant had already arrived, the lock stays held by ``txn`` (like its
        other locks) until :meth:`release_all`.
        """
        loop = asyncio.get_running_loop()
        with self._mutex:
            outcome, wounded = self._request(txn, resource, mode)
            if not isinstance(outcome, Granted):
                waiter = _AsyncWaiter(loop)
                self._waits[outcome.ticket] = waiter
        for other in wounded:
            other.wake()
        if isinstance(outcome, Granted):
            return
        timer = None if timeout is None else loop.call_later(timeout, _settle, waiter.future)
        try:
            await waiter.future
        except BaseException:
            self._abandon(outcome.ticket, waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._finish(outcome.ticket, waiter, txn, resource, mode, timeout)

    def rank(self, txn: Hashable, born: float) -> None:
        """Rank ``txn`` by when it began (``time.monotonic()``; a replay passes its first
        attempt's), so that a deadlock kills the youngest of its cycle, not whoever
        closed it.  Call before its first lock; :meth:`release_all` forgets it."""
        self._born[txn] = born  # one dict store: atomic under the GIL, read under the mutex

    def try_acquire(self, txn: Hashable, resource: Hashable, mode: LockMode) -> bool:
        """Take the lock if it is free for ``txn`` now; otherwise change nothing."""
        with self._mutex:
            return self._manager.try_acquire(txn, resource, mode)

    def try_acquire_many(
        self, txn: Hashable, resources: list[Hashable], mode: LockMode
    ) -> list[Hashable]:
        """Take each lock of ``resources`` that is free for ``txn`` now, under ONE mutex
        hold (a bulk write's thousands of locks); return those not granted, in order."""
        with self._mutex:
            return self._manager.try_acquire_many(txn, resources, mode)

    def release_all(self, txn: Hashable) -> None:
        """``txn`` ended: free its locks and wake every waiter that is now granted.

        A transaction holding more than :data:`RELEASE_SLICE` locks has them released
        a slice at a time (``slices``: a turn of the node's loop each, data-path.md
        §6.8): until its last slice it still holds the rest, and whoever waits for
        one of them is woken by the slice that frees it.  The mutex is held for one
        slice at a time, never for the whole release.
        """
        if not self._release_slice(txn):
            self.slices.run(lambda: self._release_slice(txn))

    def _release_slice(self, txn: Hashable) -> bool:
        """Free up to :data:`RELEASE_SLICE` of ``txn``'s locks (its queued requests
        first: each waiter raises ``TransactionClosed``); True once it holds none."""
        with self._mutex:
            self._born.pop(txn, None)
            manager = self._manager
            orphans = [self._waits.pop(req.ticket) for req in manager.pending(txn)]
            grants, done = manager.release_some(txn, RELEASE_SLICE)
            woken = self._claim(grants)
            for waiter in orphans:
                waiter.error = TransactionClosed(f"{txn!r} was released while waiting for a lock")
        for waiter in (*woken, *orphans):
            waiter.wake()
        return done

    def interrupt(self, txn: Hashable, error: BaseException) -> None:
        """Withdraw ``txn``'s waiting requests: each waiter raises ``error``; its held locks stay.

        A transaction being rolled back while one of its ops waits for a lock (a
        deadlock victim across nodes, an idle or orphaned branch): the wait ends
        now, so the rollback that is queued behind the op can run and free the
        locks the others wait for, instead of after ``lock_wait``.
        """
        with self._mutex:
            woken = self._interrupt(txn, error)
        for waiter in woken:
            waiter.wake()

    def held_by(self, txn: Hashable) -> dict[Hashable, LockMode]:
        """A copy of every lock ``txn`` holds (to make a prepared transaction's locks durable)."""
        with self._mutex:
            return self._manager.held_by(txn)

    def mode_held(self, txn: Hashable, resource: Hashable) -> LockMode | None:
        """The mode ``txn`` holds on ``resource``, or ``None``."""
        with self._mutex:
            return self._manager.mode_held(txn, resource)

    def wait_for(self) -> dict[Hashable, set[Hashable]]:
        """The wait-for graph now: waiting txn -> the txns it waits for (deadlock detection
        across nodes reads it; empty, and cheap, when nobody waits)."""
        with self._mutex:
            return self._manager.wait_for()

    def waiting(self, resource: Hashable) -> int:
        """How many requests wait for ``resource`` (diagnostics, tests)."""
        with self._mutex:
            return len(self._manager.waiters(resource))

    # --------------------------------------------------------------- internals
    def _request(
        self, txn: Hashable, resource: Hashable, mode: LockMode
    ) -> tuple[Granted | Waiting, list[_Waiter]]:
        """Ask the manager (under the mutex); settle a deadlock by age (module docstring).

        Returns the outcome and the waiters to wake once the mutex is released: the
        victims woken with ``Deadlock`` and whoever their withdrawn requests unblock.
        Raises ``Deadlock`` when ``txn`` itself is the victim.  Each round withdraws a
        victim's waits, removing edges from the (finite) wait-for graph, so it ends.
        """
        woken: list[_Waiter] = []
        while True:
            outcome = self._manager.acquire(txn, resource, mode)
            if not isinstance(outcome, DeadlockFound):
                if isinstance(outcome, Waiting):
                    self.waits += 1
                return outcome, woken
            self.deadlocks += 1
            victim = self._youngest(txn, outcome.cycle)
            withdrawn = (
                [] if victim == txn else self._interrupt(victim, _wounded(victim, txn, outcome))
            )
            if not withdrawn:  # txn is the victim (or, defensively, nothing to withdraw)
                for waiter in woken:  # raised under the mutex: wake them on the way out
                    waiter.wake()
                raise _deadlock(txn, resource, mode, outcome)
            woken.extend(withdrawn)

    def _youngest(self, txn: Hashable, cycle: tuple[Hashable, ...]) -> Hashable:
        """The cycle's victim: its youngest ranked member, or ``txn`` if ``txn`` is
        unranked or younger than them all (every other member waits in a queue)."""
        born = self._born
        victim = txn
        youngest = born.get(txn)
        if youngest is None:
            return txn
        for member in cycle:
            at = born.get(member)
            if at is not None and at > youngest:
                victim, youngest = member, at
        return victim

    def _interrupt(self, txn: Hashable, error: BaseException) -> list[_Waiter]:
        """Withdraw ``txn``'s queued requests (under the mutex), each waiter to raise
        ``error``; the waiters to wake: those, and whoever the withdrawals unblock."""
        woken: list[_Waiter] = []
        for req in self._manager.pending(txn):
            waiter = self._waits.pop(req.ticket, None)
            if waiter is None:
                continue
            waiter.error = error
            woken.append(waiter)
            woken.extend(self._claim(self._manager.cancel(req.ticket)))
        return woken

    def _claim(self, grants: list[Grant]) -> list[_Waiter]:
        """Mark the waiters of ``grants`` granted (under the mutex); wake them after."""
        woken = []
        for grant in grants:
            waiter = self._waits.pop(grant.ticket, None)
            if waiter is not None:
                waiter.granted = True
                woken.append(waiter)
        return woken

    def _withdraw(self, ticket: int) -> list[_Waiter]:
        """Cancel a still-queued request (under the mutex); return the waiters it unblocks."""
        del self._waits[ticket]
        return self._claim(self._manager.cancel(ticket))

    def _finish(
        self,
        ticket: int,
        waiter: _Waiter,
        txn: Hashable,
        resource: Hashable,
        mode: LockMode,
        timeout: float | None,
    ) -> None:
        """The wait ended, woken or timed out: return if granted, else withdraw and raise."""
        with self._mutex:
            if waiter.granted:
                return
            if waiter.error is not None:
                raise waiter.error
            woken = self._withdraw(ticket)
            self.timeouts += 1
        for other in woken:
            other.wake()
        raise LockTimeout(
            f"{txn!r} waited {timeout}s for {mode.name} on {resource!r} without getting it"
        )

    def _abandon(self, ticket: int, waiter: _Waiter) -> None:
        """The waiter was interrupted: withdraw its request unless it was already granted."""
        with self._mutex:
            if waiter.granted or waiter.error is not None:
                return
            woken = self._withdraw(ticket)
        for other in woken:
            other.wake()
