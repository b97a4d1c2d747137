"""The logical lock manager (SPEC B3, B4): a pure, sans-I/O state machine.

Transactions lock objects (any hashable *resource*) in READ or WRITE mode:
many readers or one writer, held until the transaction ends (strict
two-phase locking).  This module only decides *who holds what and who
waits*; it never blocks, sleeps or reads a clock, so the same code runs
under threads, asyncio and the deterministic simulator.  Blocking lives in
:mod:`nonstop.tx.waiting`.

Rules (seed ch. 5, "Locking" and "Deadlock detection"):

* **Re-entrant.** Asking for a mode already held, or READ while holding
  WRITE, is granted at once.
* **Promotion.** A READ holder asking WRITE is granted at once when it is the
  only holder; otherwise its *upgrade* waits at the head of the queue, ahead
  of ordinary waiters (an upgrader already holds the lock, so letting others
  in first would only lengthen everyone's wait).
* **FIFO, no barging.** A request compatible with the holders still waits if
  anybody is queued (readers cannot starve a queued writer).  When a lock
  frees, waiters are granted in queue order for as long as they are
  compatible, so a run of readers is granted together.
* **Deadlocks are detected at once**, on every request that has to wait, in
  the wait-for graph: a waiter waits for every incompatible holder and every
  incompatible waiter ahead of it.  If the new wait would close a cycle the
  *requester* is the victim: its request is not queued and
  :class:`DeadlockFound` names the cycle.  Its held locks stay until the
  caller rolls back and calls :meth:`LockManager.release_all`.

The common paths (uncontended acquire, re-entrant acquire, releasing a
handful of locks) are a few dict operations; the wait-for graph is only
walked when a request has to wait.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass

__all__ = [
    "DeadlockFound",
    "Grant",
    "Granted",
    "LockManager",
    "LockMode",
    "Request",
    "Waiting",
]


class LockMode(enum.IntEnum):
    """Lock strength; a stronger mode (higher value) implies the weaker one."""

    READ = 1
    WRITE = 2


READ = LockMode.READ
WRITE = LockMode.WRITE


@dataclass(frozen=True, slots=True)
class Granted:
    """Outcome of :meth:`LockManager.acquire`: the lock is held now."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """Outcome of :meth:`LockManager.acquire`: queued; a later :class:`Grant` names ``ticket``."""

    ticket: int


@dataclass(frozen=True, slots=True)
class DeadlockFound:
    """Outcome of :meth:`LockManager.acquire`: refused, the requester is the victim.

    ``cycle`` starts with the requester; each transaction would wait for the
    next one and the last waits for the first.
    """

    cycle: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class Grant:
    """A queued request (``ticket``) that has just been granted."""

    ticket: int
    txn: Hashable
    resource: Hashable
    mode: LockMode


@dataclass(frozen=True, slots=True)
class Request:
    """A queued request, as listed by :meth:`LockManager.waiters`.

    ``upgrade`` is true for a READ holder waiting to be promoted to WRITE.
    """

    ticket: int
    txn: Hashable
    resource: Hashable
    mode: LockMode
    upgrade: bool = False


_GRANTED = Granted()


class _Lock:
    """One resource's state: its holders and its FIFO queue (upgrade first)."""

    __slots__ = ("holders", "queue")

    def __init__(self) -> None:
        self.holders: dict[Hashable, LockMode] = {}
        self.queue: list[Request] = []


def _compatible(holders: dict[Hashable, LockMode], txn: Hashable, mode: LockMode) -> bool:
    """Could ``txn`` hold ``mode`` alongside the current holders (ignoring the queue)?

    A WRITE holder is always the only holder, so both checks are O(1).
    """
    n = len(holders)
    if n == 0:
        return True
    if mode is WRITE:
        return n == 1 and txn in holders
    if n > 1 or txn in holders:
        return True
    return next(iter(holders.values())) is READ


class LockManager:
    """Who holds which lock, who waits for it, and whether a wait would deadlock.

    Not thread-safe: callers serialise access (see :class:`nonstop.tx.waiting.LockTable`).
    """

    __slots__ = ("_held", "_locks", "_next_ticket", "_pending", "_tickets")

    def __init__(self) -> None:
        self._locks: dict[Hashable, _Lock] = {}
        # txn -> {resource: mode}: mirrors the holders, so release_all is O(locks held).
        self._held: dict[Hashable, dict[Hashable, LockMode]] = {}
        # txn -> {resource: request}: the txn's queued requests (the wait-for graph's edges).
        self._pending: dict[Hashable, dict[Hashable, Request]] = {}
        self._tickets: dict[int, Request] = {}
        self._next_ticket = 1

    # ---------------------------------------------------------------- requests
    def acquire(
        self, txn: Hashable, resource: Hashable, mode: LockMode
    ) -> Granted | Waiting | DeadlockFound:
        """Ask for ``resource`` in ``mode`` on behalf of ``txn``.

        Raises :class:`ValueError` if ``txn`` already has a request queued on
        ``resource`` that this one does not already satisfy (one wait per
        resource per transaction).
        """
        lock = self._locks.get(resource)
        if lock is None:  # uncontended: the common case
            lock = self._locks[resource] = _Lock()
            self._grant(lock, txn, resource, mode)
            return _GRANTED
        holders = lock.holders
        held = holders.get(txn)
        if held is not None and held >= mode:  # re-entrant
            return _GRANTED
        pending = self._pending.get(txn)
        if pending is not None and resource in pending:
            raise ValueError(f"{txn!r} already waits for {resource!r}")
        upgrade = held is not None
        if upgrade:
            # Promotion: granted if sole holder, whatever is queued (they wait for us anyway).
            if len(holders) == 1:
                self._grant(lock, txn, resource, mode)
                return _GRANTED
        elif not lock.queue and _compatible(holders, txn, mode):
            # A non-empty queue always blocks a newcomer: its head is blocked by a holder.
            self._grant(lock, txn, resource, mode)
            return _GRANTED
        return self._enqueue(lock, txn, resource, mode, upgrade)

    def try_acquire(self, txn: Hashable, resource: Hashable, mode: LockMode) -> bool:
        """Take the lock if :meth:`acquire` would grant it at once; else change nothing."""
        lock = self._locks.get(resource)
        if lock is None:
            lock = self._locks[resource] = _Lock()
            self._grant(lock, txn, resource, mode)
            return True
        holders = lock.holders
        held = holders.get(txn)
        if held is not None and held >= mode:
            return True
        if held is not None:
            ok = len(holders) == 1
        else:
            ok = not lock.queue and _compatible(holders, txn, mode)
        if ok:
            self._grant(lock, txn, resource, mode)
        return ok

    def try_acquire_many(
        self, txn: Hashable, resources: list[Hashable], mode: LockMode
    ) -> list[Hashable]:
        """:meth:`try_acquire` each resource; return those not granted (a bulk write's
        thousands of locks, most of them on resources nobody has locked: inlined)."""
        locks = self._locks
        held = self._held.get(txn)
        if held is None:
            held = self._held[txn] = {}
        busy = []
        for resource in resources:
            if resource not in locks:
                lock = locks[resource] = _Lock()
                lock.holders[txn] = mode
                held[resource] = mode
            elif not self.try_acquire(txn, resource, mode):
                busy.append(resource)
        if not held:
            del self._held[txn]
        return busy

    def cancel(self, ticket: int) -> list[Grant]:
        """Withdraw a queued request (its waiter gave up); return waiters this unblocks.

        A ticket that is unknown, already granted or already cancelled is
        ignored (returns ``[]``) so that a timeout racing a grant is harmless.
        A cancelled upgrade leaves the READ lock held.
        """
        req = self._tickets.pop(ticket, None)
        if req is None:
            return []
        self._forget_pending(req)
        lock = self._locks[req.resource]
        lock.queue.remove(req)
        granted: list[Grant] = []
        self._grant_waiters(req.resource, lock, granted)
        return granted

    def release_all(self, txn: Hashable) -> list[Grant]:
        """``txn`` ended: drop its locks and queued requests; return the waiters now granted."""
        affected = self._drop_pending(txn)
        held = self._held.pop(txn, None)
        if held:
            self._drop_holds(txn, held, affected)
        return self._grant_affected(affected)

    def release_some(self, txn: Hashable, limit: int) -> tuple[list[Grant], bool]:
        """:meth:`release_all` at most ``limit`` held locks at a time: the waiters now
        granted, and whether ``txn`` holds nothing more.

        For a transaction that ended holding hundreds of thousands of locks (an
        overwrite's swap), released a slice per turn of the node's loop rather than
        in one step (data-path.md §6.8).  Until its last slice, ``txn`` still holds
        the locks not yet released, exactly as if it had not ended yet: another
        transaction waits for them as it would have.  ``txn`` must take no lock
        meanwhile (it has ended).
        """
        affected = self._drop_pending(txn)
        held = self._held.get(txn)
        if held is None:
            return self._grant_affected(affected), True
        if len(held) <= limit:
            del self._held[txn]
            self._drop_holds(txn, held, affected)
            return self._grant_affected(affected), True
        popitem = held.popitem
        part = [popitem()[0] for _ in range(limit)]
        self._drop_holds(txn, part, affected)
        return self._grant_affected(affected), False

    # ------------------------------------------------------------- inspection
    def mode_held(self, txn: Hashable, resource: Hashable) -> LockMode | None:
        """The mode ``txn`` holds on ``resource``, or ``None``."""
        held = self._held.get(txn)
        return None if held is None else held.get(resource)

    def held_by(self, txn: Hashable) -> dict[Hashable, LockMode]:
        """A copy of every lock ``txn`` holds."""
        return dict(self._held.get(txn, {}))

    def holders(self, resource: Hashable) -> dict[Hashable, LockMode]:
        """A copy of ``resource``'s holders (diagnostics, tests)."""
        lock = self._locks.get(resource)
        return {} if lock is None else dict(lock.holders)

    def waiters(self, resource: Hashable) -> list[Request]:
        """``resource``'s queued requests in grant order (diagnostics, tests)."""
        lock = self._locks.get(resource)
        return [] if lock is None else list(lock.queue)

    def pending(self, txn: Hashable) -> list[Request]:
        """The requests ``txn`` has queued (so a facade can wake their waiters)."""
        return list(self._pending.get(txn, {}).values())

    def resources(self) -> list[Hashable]:
        """Every resource with a holder or a waiter (diagnostics, tests)."""
        return list(self._locks)

    def wait_for(self) -> dict[Hashable, set[Hashable]]:
        """The whole wait-for graph: waiting txn -> the txns it waits for."""
        return {txn: set(self._successors(txn)) for txn in self._pending}

    # --------------------------------------------------------------- internals
    def _grant(self, lock: _Lock, txn: Hashable, resource: Hashable, mode: LockMode) -> None:
        lock.holders[txn] = mode
        held = self._held.get(txn)
        if held is None:
            self._held[txn] = {resource: mode}
        else:
            held[resource] = mode

    def _enqueue(
        self, lock: _Lock, txn: Hashable, resource: Hashable, mode: LockMode, upgrade: bool
    ) -> Waiting | DeadlockFound:
        """Queue a request that must wait, unless the wait would close a cycle.

        The request is queued tentatively before the search: an upgrade goes to
        the head, which makes waiters behind it wait for the requester too.
        All new edges touch the requester and the graph was acyclic, so a new
        cycle exists iff the requester can reach itself.
        """
        req = Request(self._next_ticket, txn, resource, mode, upgrade)
        if upgrade:
            lock.queue.insert(0, req)  # at most one upgrade can wait: a second one deadlocks
        else:
            lock.queue.append(req)
        pending = self._pending.get(txn)
        if pending is None:
            pending = self._pending[txn] = {}
        pending[resource] = req
        cycle = self._cycle_through(txn)
        if cycle is not None:
            lock.queue.remove(req)
            self._forget_pending(req)
            return DeadlockFound(cycle)
        self._next_ticket += 1
        self._tickets[req.ticket] = req
        return Waiting(req.ticket)

    def _forget_pending(self, req: Request) -> None:
        pending = self._pending[req.txn]
        del pending[req.resource]
        if not pending:
            del self._pending[req.txn]

    def _blockers(self, req: Request) -> Iterator[Hashable]:
        """The txns ``req`` waits for: incompatible holders and incompatible waiters ahead."""
        lock = self._locks[req.resource]
        txn = req.txn
        write = req.mode is WRITE
        for holder, mode in lock.holders.items():
            if holder != txn and (write or mode is WRITE):
                yield holder
        for ahead in lock.queue:
            if ahead is req:
                break
            if ahead.txn != txn and (write or ahead.mode is WRITE):
                yield ahead.txn

    def _successors(self, txn: Hashable) -> Iterator[Hashable]:
        for req in self._pending.get(txn, {}).values():
            yield from self._blockers(req)

    def _cycle_through(self, start: Hashable) -> tuple[Hashable, ...] | None:
        """A wait-for path from ``start`` back to ``start``, or ``None`` (iterative DFS)."""
        parent: dict[Hashable, Hashable] = {start: start}
        stack = [start]
        while stack:
            node = stack.pop()
            for nxt in self._successors(node):
                if nxt == start:
                    path = [node]
                    while node != start:
                        node = parent[node]
                        path.append(node)
                    path.reverse()
                    return tuple(path)
                if nxt not in parent:
                    parent[nxt] = node
                    stack.append(nxt)
        return None

    def _drop_pending(self, txn: Hashable) -> dict[Hashable, None]:
        """Withdraw ``txn``'s queued requests; the resources whose queues changed."""
        affected: dict[Hashable, None] = {}
        pending = self._pending.pop(txn, None)
        if pending:
            for resource, req in pending.items():
                del self._tickets[req.ticket]
                self._locks[resource].queue.remove(req)
                affected[resource] = None
        return affected

    def _drop_holds(
        self, txn: Hashable, resources: Iterable[Hashable], affected: dict[Hashable, None]
    ) -> None:
        """``txn`` no longer holds ``resources`` (already out of ``_held``); add the
        locks that have waiters to ``affected``, drop the free ones."""
        locks = self._locks
        for resource in resources:
            lock = locks[resource]
            holders = lock.holders
            del holders[txn]
            # Only a lock with waiters needs the grant pass; a free one is dropped
            # here (a bulk swap releases hundreds of thousands).
            if lock.queue or resource in affected:
                affected[resource] = None
            elif not holders:
                del locks[resource]

    def _grant_affected(self, affected: dict[Hashable, None]) -> list[Grant]:
        granted: list[Grant] = []
        for resource in affected:
            self._grant_waiters(resource, self._locks[resource], granted)
        return granted

    def _grant_waiters(self, resource: Hashable, lock: _Lock, out: list[Grant]) -> None:
        """Grant the queue's head for as long as it is compatible; drop an idle lock."""
        queue = lock.queue
        holders = lock.holders
        while queue:
            req = queue[0]
            if not _compatible(holders, req.txn, req.mode):
                break
            del queue[0]
            del self._tickets[req.ticket]
            self._forget_pending(req)
            self._grant(lock, req.txn, resource, req.mode)
            out.append(Grant(req.ticket, req.txn, resource, req.mode))
        if not holders and not queue:
            del self._locks[resource]
