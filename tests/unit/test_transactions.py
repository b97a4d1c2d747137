"""Transactions (B1–B5): isolation, locking, deadlocks, retries, rollback, triggers, notifiers."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from tests.bankmodel import Account, Transfer
from tests.conftest import run_threads

import nonstop
from nonstop import Managed, key

EVENTS: list[tuple[str, str]] = []


class Audited(Managed, name="test_transactions.Audited"):
    code: str = key(unique=True)
    value: int = 0
    updates: int = 0
    partner: Audited | None = None
    fail_on_update: bool = False

    def on_update(self) -> None:
        EVENTS.append(("update", self.code))
        self.updates += 1  # a trigger may change the object itself...
        if self.partner is not None and self.value > 100:
            self.partner.value += 1  # ...and other objects (triggers run again for them)
        if self.fail_on_update:
            raise ValueError(f"{self.code} refuses the update")

    def on_delete(self) -> None:
        EVENTS.append(("delete", self.code))


def balance(db: nonstop.Database, number: str) -> int:
    with db.transaction() as tx:
        return tx.get(Account, number=number, lock="none").balance


def waiters_on(db: nonstop.Database, resource: Any) -> int:
    return db.engine.locks.waiting(resource)


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def body() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, box


# ------------------------------------------------------------- isolation (B2)
def test_serializable_reads_are_repeatable_because_writers_wait(bank: Any) -> None:
    db, _ = bank
    with db.transaction() as t1:
        a = t1.get(Account, number="A000")
        first = a.balance

        def writer() -> None:
            with db.transaction() as t2:
                t2.get(Account, number="A000").balance = 1

        t, box = in_thread(writer)
        ref = t1.ref(a).raw
        wait_until(lambda: waiters_on(db, ref) == 1)  # the writer queues behind our read lock
        assert a.balance == first
        assert not box
    t.join(5)
    assert box == [None]
    assert balance(db, "A000") == 1


def test_snapshot_reads_stay_the_same_while_others_commit(bank: Any) -> None:
    db, _ = bank
    with db.transaction("snapshot") as t1:
        a = t1.get(Account, number="A000")
        before = a.balance
        with db.transaction() as t2:  # not blocked: snapshot readers take no locks
            t2.get(Account, number="A000").balance = before + 5
        assert a.balance == before  # the object is read once, consistently
        # A fresh object read after the other commit sees the committed state.
        assert t1.get(Account, number="A001").balance == 1000
    assert balance(db, "A000") == before + 5


def test_snapshot_writer_on_a_changed_object_conflicts_and_is_doomed(bank: Any) -> None:
    db, _ = bank
    conflict = pytest.raises(nonstop.Conflict, match="changed since this snapshot")
    with conflict, db.transaction("snapshot") as t1:
        a = t1.get(Account, number="A000")
        _ = a.balance
        with db.transaction() as t2:
            t2.get(Account, number="A000").balance += 7
        try:
            a.balance = a.balance + 1
        finally:
            # doomed: anything else fails the same way, and the rollback releases locks
            with pytest.raises(nonstop.Conflict):
                t1.create(Transfer, tid="never")
    assert balance(db, "A000") == 1007
    with db.transaction() as tx:
        assert tx.find(Transfer, tid="never") is None


def test_snapshot_conflict_is_replayed_by_transactional(bank: Any) -> None:
    db, _ = bank
    attempts: list[int] = []

    @nonstop.transactional(isolation="snapshot")
    def add_ten(tx: nonstop.Transaction) -> None:
        a = tx.get(Account, number="A000")
        current = a.balance
        attempts.append(current)
        if len(attempts) == 1:
            with db.transaction() as other:  # a concurrent committed writer
                other.get(Account, number="A000").balance += 1
        a.balance = current + 10

    add_ten(db)
    assert attempts == [1000, 1001]
    assert balance(db, "A000") == 1011


# ---------------------------------------------------------------- locking (B3)
def test_readers_share_and_promotion_waits_for_the_other_reader(bank: Any) -> None:
    db, _ = bank
    t1 = db.transaction().__enter__()
    t2 = db.transaction().__enter__()
    a1 = t1.get(Account, number="A000")
    a2 = t2.get(Account, number="A000")
    assert a1.balance == a2.balance == 1000  # two readers at once

    def promote() -> None:
        a1.balance = 5  # read -> write promotion: waits for t2's read lock
        t1.commit()

    t, box = in_thread(promote)
    ref = t2.ref(a2).raw
    wait_until(lambda: waiters_on(db, ref) == 1)
    assert not box
    t2.commit()
    t.join(5)
    assert box == [None]
    assert balance(db, "A000") == 5


def promotion_race(db: nonstop.Database, explicit: bool, n: int) -> list[int]:
    attempts = [0] * n
    gate = threading.Barrier(n)

    @nonstop.transactional
    def bump(tx: nonstop.Transaction, i: int) -> None:
        attempts[i] += 1
        if explicit:
            a = tx.get(Account, number="A000", lock="write")
        else:
            a = tx.get(Account, number="A000")
        value = a.balance
        if attempts[i] == 1:
            gate.wait(5)  # everybody holds its first lock before anybody writes
        a.balance = value + 1

    run_threads(n, lambda i: bump(db, i))
    return attempts


def test_promotion_deadlock_victims_are_replayed(bank: Any) -> None:
    db, _ = bank
    n = 3
    attempts = promotion_race(db, explicit=False, n=n)
    assert balance(db, "A000") == 1000 + n  # no lost update
    assert sum(attempts) > n  # read locks held by all: promotion deadlocks, replays


def test_explicit_write_lock_avoids_promotion_deadlocks(bank: Any) -> None:
    db, _ = bank
    n = 3
    attempts = [0] * n
    gate = threading.Barrier(n)

    @nonstop.transactional
    def bump(tx: nonstop.Transaction, i: int) -> None:
        attempts[i] += 1
        if attempts[i] == 1:
            gate.wait(5)  # all ask at once (a read lock here would end in promotion deadlocks)
        a = tx.get(Account, number="A000", lock="write")
        time.sleep(0.01)
        a.balance += 1

    run_threads(n, lambda i: bump(db, i))
    assert attempts == [1] * n  # no deadlock, no replay
    assert balance(db, "A000") == 1000 + n


def test_explicit_lock_method_and_bad_mode(bank: Any) -> None:
    db, _ = bank
    with db.transaction() as t1:
        a = t1.get(Account, number="A000")
        t1.lock(a, "write")
        ref = t1.ref(a).raw
        assert db.engine.locks.mode_held(t1.id, ref) == nonstop.tx.locks.LockMode.WRITE
        with pytest.raises(nonstop.BadArgument, match="lock must be"):
            t1.lock(a, "exclusive")
    assert db.engine.locks.mode_held(t1.id, ref) is None  # released at commit


def test_waiters_are_served_in_fifo_order(bank: Any) -> None:
    db, _ = bank
    served: list[int] = []
    holder = db.transaction().__enter__()
    a = holder.get(Account, number="A000", lock="write")
    ref = holder.ref(a).raw
    threads = []
    for i in range(4):

        def take(i: int = i) -> None:
            with db.transaction() as tx:
                tx.get(Account, number="A000", lock="write").balance += 1
                served.append(i)

        t, _ = in_thread(take)
        threads.append(t)
        wait_until(lambda i=i: waiters_on(db, ref) == i + 1)
    holder.commit()
    for t in threads:
        t.join(5)
    assert served == [0, 1, 2, 3]
    assert balance(db, "A000") == 1004


# -------------------------------------------------------------- deadlocks (B4)
def test_a_real_deadlock_has_one_victim_with_a_clear_error(bank: Any) -> None:
    db, _ = bank
    gate = threading.Barrier(2)

    def cross(first: str, second: str) -> str:
        with db.transaction() as tx:
            tx.get(Account, number=first, lock="write").balance -= 1
            gate.wait(5)
            time.sleep(0.05 if first == "A001" else 0)  # make the second requester deterministic
            tx.get(Account, number=second, lock="write").balance += 1
        return "committed"

    outcomes: list[Any] = []

    def run(i: int) -> None:
        try:
            outcomes.append(cross(*(("A000", "A001") if i == 0 else ("A001", "A000"))))
        except nonstop.Deadlock as exc:
            outcomes.append(exc)

    run_threads(2, run)
    victims = [o for o in outcomes if isinstance(o, nonstop.Deadlock)]
    assert len(victims) == 1 and outcomes.count("committed") == 1
    assert "victim" in str(victims[0]) and "cycle" in str(victims[0])
    assert isinstance(victims[0], nonstop.Retryable)
    # The victim was rolled back completely; the survivor moved one unit.
    assert balance(db, "A000") + balance(db, "A001") == 2000


def test_deadlock_victim_is_replayed_transparently(bank: Any) -> None:
    db, _ = bank
    gate = threading.Barrier(2)
    runs: list[str] = []

    @nonstop.transactional
    def cross(tx: nonstop.Transaction, first: str, second: str, amount: int) -> None:
        runs.append(first)
        tx.get(Account, number=first, lock="write").balance -= amount
        if len(runs) <= 2:
            gate.wait(5)
        tx.get(Account, number=second, lock="write").balance += amount

    run_threads(2, lambda i: cross(db, *(("A000", "A001", 10) if i == 0 else ("A001", "A000", 3))))
    assert len(runs) == 3  # two first runs, exactly one replay of the victim
    assert balance(db, "A000") == 1000 - 10 + 3
    assert balance(db, "A001") == 1000 + 10 - 3


async def test_deadlock_between_asyncio_tasks_is_replayed(bank: Any) -> None:
    db, _ = bank
    runs: list[str] = []
    both = asyncio.Event()

    @nonstop.transactional
    async def cross(tx: nonstop.AsyncTransaction, first: str, second: str) -> None:
        runs.append(first)
        (await tx.get(Account, number=first, lock="write")).balance -= 1
        if len(runs) >= 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)
        (await tx.get(Account, number=second, lock="write")).balance += 1

    await asyncio.wait_for(asyncio.gather(cross(db, "A000", "A001"), cross(db, "A001", "A000")), 20)
    assert len(runs) == 3
    assert balance(db, "A000") == balance(db, "A001") == 1000


def test_bounded_retries_end_in_too_many_retries(tmp_path: Any) -> None:
    db = nonstop.open(tmp_path / "s", lock_timeout=0.05)
    try:
        with db.transaction() as tx:
            tx.create(Account, number="busy")
        attempts: list[int] = []

        @nonstop.transactional(max_retries=3)
        def touch(tx: nonstop.Transaction) -> None:
            attempts.append(1)
            tx.get(Account, number="busy", lock="write").balance += 1

        with db.transaction() as holder:
            holder.get(Account, number="busy", lock="write")
            t, box = in_thread(lambda: touch(db))
            t.join(10)
        assert len(attempts) == 4  # the first run and 3 retries
        (err,) = box
        assert isinstance(err, nonstop.TooManyRetries)
        assert not isinstance(err, nonstop.Retryable)
        assert "touch did not commit after 3 retries" in str(err)
        assert "LockTimeout" in str(err)
        assert isinstance(err.__cause__, nonstop.LockTimeout)
        assert balance(db, "busy") == 0
    finally:
        db.close()


def test_non_retryable_errors_reach_the_caller_without_replay(bank: Any) -> None:
    db, _ = bank
    runs: list[int] = []

    @nonstop.transactional
    def fail(tx: nonstop.Transaction) -> None:
        runs.append(1)
        tx.get(Account, number="A000").balance = 0
        raise nonstop.Abort("changed my mind")

    with pytest.raises(nonstop.Abort, match="changed my mind"):
        fail(db)
    assert runs == [1]
    assert balance(db, "A000") == 1000


def test_transactional_functions_compose_in_one_transaction(bank: Any) -> None:
    db, _ = bank

    @nonstop.transactional
    def inner(tx: nonstop.Transaction, n: str) -> None:
        tx.get(Account, number=n).balance += 1

    @nonstop.transactional
    def outer(tx: nonstop.Transaction) -> None:
        inner(tx, "A000")
        inner(tx, "A001")
        raise nonstop.Abort("all or nothing")

    with pytest.raises(nonstop.Abort):
        outer(db)
    assert balance(db, "A000") == balance(db, "A001") == 1000


# -------------------------------------------------------------- rollback (B5)
def dump(db: nonstop.Database) -> dict[str, Any]:
    with db.transaction() as tx:
        accounts = sorted((a.number, a.owner, a.balance) for a in tx.extent(Account))
        by_owner = [a.number for a in tx.query(Account).order_by("owner").all()]
        transfers = sorted(t.tid for t in tx.extent(Transfer))
        counts = (tx.count(Account), tx.count(Transfer))
        owners = {a.owner: a.number for a in tx.extent(Account)}
        lookups = {o: [a.number for a in tx.query(Account).where(owner=o).all()] for o in owners}
    return {"a": accounts, "o": by_owner, "t": transfers, "c": counts, "l": lookups}


@pytest.mark.parametrize("how", ["abort", "explicit", "error"])
def test_rollback_restores_everything(bank: Any, how: str) -> None:
    db, _ = bank
    with db.transaction() as tx:
        tx.create(Transfer, tid="keep")
    before = dump(db)

    def changes(tx: nonstop.Transaction) -> None:
        a = tx.get(Account, number="A000")
        a.balance = -5
        a.owner = "zzz"  # mutable ordered key
        tx.delete(tx.get(Account, number="A001"))
        tx.delete(tx.get(Transfer, tid="keep"))
        tx.create(Account, number="A001", owner="aaa")  # reuse the deleted unique key
        tx.create(Transfer, tid="new")
        assert tx.count(Account) == 6

    if how == "explicit":
        tx = db.transaction().__enter__()
        changes(tx)
        tx.rollback()
        tx.rollback()  # twice is fine
        assert not tx.active
    else:
        with pytest.raises((nonstop.Abort, KeyError)), db.transaction() as tx:
            changes(tx)
            raise nonstop.Abort("x") if how == "abort" else KeyError("y")
    assert dump(db) == before
    # and every lock was released: a writer gets through at once
    with db.transaction(lock_timeout=1) as tx:
        for a in tx.extent(Account, lock="write"):
            a.balance += 0


def test_closed_transactions_refuse_further_use(bank: Any) -> None:
    db, _ = bank
    with db.transaction() as tx:
        a = tx.get(Account, number="A000")
    with pytest.raises(nonstop.TransactionClosed, match="committed"):
        tx.create(Transfer, tid="late")
    with pytest.raises(nonstop.ObjectNotInTransaction, match="outside its transaction"):
        _ = a.balance
    with pytest.raises(nonstop.ObjectNotInTransaction):
        a.balance = 3
    tx.rollback()  # no effect after commit
    assert balance(db, "A000") == 1000


# --------------------------------------------------------------- triggers (A3)
def test_update_and_delete_triggers(db: nonstop.Database) -> None:
    EVENTS.clear()
    with db.transaction() as tx:
        a = tx.create(Audited, code="a")
        b = tx.create(Audited, code="b", partner=a)
        a.value = 1  # created in this transaction: no update trigger
        assert b.partner == a
    assert EVENTS == []
    with db.transaction() as tx:
        b = tx.get(Audited, code="b")
        b.value = 500  # b's trigger updates a, whose trigger then runs too
        b.value = 501  # several writes, one trigger call
    assert EVENTS == [("update", "b"), ("update", "a")]
    with db.transaction() as tx:
        a, b = tx.get(Audited, code="a"), tx.get(Audited, code="b")
        assert (a.value, a.updates, b.value, b.updates) == (2, 1, 501, 1)
        _ = a.value  # reading is not updating
    assert len(EVENTS) == 2
    with db.transaction() as tx:
        tx.delete(tx.get(Audited, code="b"))
    assert EVENTS[-1] == ("delete", "b")
    with db.transaction() as tx:
        assert tx.find(Audited, code="b") is None


def test_a_failing_update_trigger_rolls_back(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Audited, code="f", fail_on_update=True)
    with pytest.raises(ValueError, match="refuses"), db.transaction() as tx:
        tx.get(Audited, code="f").value = 9
    with db.transaction() as tx:
        f = tx.get(Audited, code="f")
        assert (f.value, f.updates) == (0, 0)


# ---------------------------------------------------------- notifiers (B6 local)
def test_notifiers_prepare_then_commit(bank: Any) -> None:
    db, _ = bank
    seen: list[str] = []
    with db.transaction() as tx:
        tx.get(Account, number="A000").balance = 1
        tx.on_prepare(lambda: seen.append("prepare"))
        tx.on_commit(lambda: seen.append(f"commit saw {balance(db, 'A000')}"))  # durable
        tx.on_rollback(lambda: seen.append("rollback"))
    assert seen == ["prepare", "commit saw 1"]


def test_prepare_notifier_raising_rolls_back(bank: Any) -> None:
    db, _ = bank
    seen: list[str] = []

    def veto() -> None:
        seen.append("prepare")
        raise nonstop.Abort("vetoed")

    with pytest.raises(nonstop.Abort, match="vetoed"), db.transaction() as tx:
        tx.get(Account, number="A000").balance = 1
        tx.on_prepare(veto)
        tx.on_commit(lambda: seen.append("commit"))
        tx.on_rollback(lambda: seen.append("rollback"))
    assert seen == ["prepare", "rollback"]
    assert balance(db, "A000") == 1000
    with db.transaction(lock_timeout=1) as tx:  # locks were released
        tx.get(Account, number="A000", lock="write")


def test_a_failing_commit_notifier_cannot_undo_the_commit(bank: Any) -> None:
    db, _ = bank
    seen: list[str] = []
    with db.transaction() as tx:
        tx.get(Account, number="A000").balance = 2
        tx.on_commit(lambda: 1 / 0)
        tx.on_commit(lambda: seen.append("second still runs"))
    assert seen == ["second still runs"]
    assert balance(db, "A000") == 2


def test_read_only_transactions_notify_commit_and_rollback(bank: Any) -> None:
    db, _ = bank
    seen: list[str] = []
    with db.transaction() as tx:
        tx.get(Account, number="A000")
        tx.on_prepare(lambda: seen.append("prepare"))
        tx.on_commit(lambda: seen.append("commit"))
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.on_rollback(lambda: seen.append("rollback"))
        raise RuntimeError
    assert seen == ["prepare", "commit", "rollback"]


async def test_async_transaction_commit_rollback_and_notifiers(bank: Any) -> None:
    db, _ = bank
    seen: list[str] = []
    async with db.transaction() as tx:
        a = await tx.get(Account, number="A000", lock="write")
        a.balance = 50
        tx.on_commit(lambda: seen.append("commit"))
    with pytest.raises(nonstop.Abort):
        async with db.transaction() as tx:
            (await tx.get(Account, number="A000", lock="write")).balance = 0
            tx.on_rollback(lambda: seen.append("rollback"))
            raise nonstop.Abort
    assert seen == ["commit", "rollback"]
    assert balance(db, "A000") == 50


async def test_async_attribute_access_never_blocks_the_loop(bank: Any) -> None:
    db, _ = bank
    holder = db.transaction().__enter__()
    holder.get(Account, number="A000", lock="write")
    try:
        with pytest.raises(nonstop.Conflict, match="take it up front"):
            async with db.transaction("snapshot") as tx:
                a = await tx.get(Account, number="A000")  # snapshot: no lock needed to read
                assert a.balance == 1000
                a.balance = 1  # the write lock is held elsewhere: fail, don't block
        assert not tx.active
    finally:
        holder.rollback()
    assert balance(db, "A000") == 1000


async def test_cancelled_tasks_commit_all_or_nothing_and_leak_no_lock(bank: Any) -> None:
    db, _ = bank
    rng = random.Random(5)

    async def deposit(i: int) -> None:
        async with db.transaction() as tx:
            a = await tx.get(Account, number="A000", lock="write")
            a.balance += 1
            await tx.create(Transfer, tid=f"c{i}", dst="A000", amount=1)

    tasks = [asyncio.create_task(deposit(i)) for i in range(40)]
    for t in tasks:  # cancel at random moments: waiting for the lock, mid-body, mid-commit
        await asyncio.sleep(rng.uniform(0, 0.004))
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
    async with db.transaction(lock_timeout=2) as tx:
        done = await tx.count(Transfer)
        a = await tx.get(Account, number="A000", lock="write")  # no lock was left behind
        assert a.balance == 1000 + done
    assert 0 <= done <= 40
