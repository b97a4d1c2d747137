"""Concurrent transfers from threads, asyncio tasks, and both at once (B1–B4 under load).

Every transfer records a ``Transfer`` object with a unique id in the same
transaction that moves the money, so at the end we check that the total is
conserved, each acknowledged transfer is present exactly once, and every
balance matches the transfer log.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from tests.bankmodel import (
    Account,
    Transfer,
    account_numbers,
    check_ledger,
    open_accounts,
    transfer,
    transfer_async,
)
from tests.conftest import run_threads

import nonstop

T = TypeVar("T")
N_ACCOUNTS = 6
READS_WHILE_WRITING = 3
"""A reader test needs this many reads made while the writers still run."""


@pytest.fixture
def bank_db(tmp_path: Path) -> nonstop.Database:
    db = nonstop.open(tmp_path / "bank", lock_timeout=30)
    open_accounts(db, account_numbers(N_ACCOUNTS))
    yield db  # type: ignore[misc]
    db.close()


def thread_worker(
    db: nonstop.Database, w: int, n: int, acked: set[str], lock: threading.Lock
) -> None:
    rng = random.Random(w)
    numbers = account_numbers(N_ACCOUNTS)
    for i in range(n):
        src, dst = rng.sample(numbers, 2)  # random lock order: real deadlocks happen
        tid = f"t{w}-{i}"
        transfer(db, tid, src, dst, rng.randint(1, 50))
        with lock:
            acked.add(tid)


def writer_until(
    db: nonstop.Database,
    w: int,
    n: int,
    acked: set[str],
    lock: threading.Lock,
    progress: Sequence[object],
    deadline: float,
) -> None:
    """``n`` transfers, then more until the reader has ``READS_WHILE_WRITING`` results
    (or ``deadline``): the reads the test checks are made while writers commit, on a
    fast machine and on a loaded one alike."""
    rng = random.Random(w)
    numbers = account_numbers(N_ACCOUNTS)
    i = 0
    while i < n or (len(progress) < READS_WHILE_WRITING and time.monotonic() < deadline):
        src, dst = rng.sample(numbers, 2)
        tid = f"t{w}-{i}"
        transfer(db, tid, src, dst, rng.randint(1, 50))
        with lock:
            acked.add(tid)
        i += 1


async def task_worker(db: nonstop.Database, w: int, n: int, acked: set[str]) -> None:
    rng = random.Random(1000 + w)
    numbers = account_numbers(N_ACCOUNTS)
    for i in range(n):
        src, dst = rng.sample(numbers, 2)
        tid = f"a{w}-{i}"
        await transfer_async(db, tid, src, dst, rng.randint(1, 50))
        acked.add(tid)


@pytest.mark.timeout(90)
def test_concurrent_transfers_from_threads(bank_db: nonstop.Database) -> None:
    acked: set[str] = set()
    lock = threading.Lock()
    run_threads(6, lambda w: thread_worker(bank_db, w, 40, acked, lock), timeout=80)
    assert len(acked) == 240
    assert check_ledger(bank_db, account_numbers(N_ACCOUNTS), acked) == 240
    assert bank_db.stats()["largest_group"] > 1  # commits were grouped


@pytest.mark.timeout(90)
async def test_concurrent_transfers_from_asyncio_tasks(bank_db: nonstop.Database) -> None:
    acked: set[str] = set()
    await asyncio.wait_for(
        asyncio.gather(*(task_worker(bank_db, w, 30, acked) for w in range(12))), 80
    )
    assert len(acked) == 360
    assert check_ledger(bank_db, account_numbers(N_ACCOUNTS), acked) == 360
    assert bank_db.stats()["largest_group"] > 1


@pytest.mark.timeout(120)
def test_concurrent_transfers_from_threads_and_tasks_at_once(bank_db: nonstop.Database) -> None:
    acked: set[str] = set()
    lock = threading.Lock()

    async def tasks() -> None:
        await asyncio.gather(*(task_worker(bank_db, w, 25, acked) for w in range(8)))

    def run(w: int) -> None:
        if w == 0:
            asyncio.run(asyncio.wait_for(tasks(), 100))
        else:
            thread_worker(bank_db, w, 30, acked, lock)

    run_threads(5, run, timeout=110)
    assert len(acked) == 8 * 25 + 4 * 30
    assert check_ledger(bank_db, account_numbers(N_ACCOUNTS), acked) == len(acked)


@pytest.mark.timeout(90)
def test_concurrent_snapshot_and_serializable_writers(bank_db: nonstop.Database) -> None:
    @nonstop.transactional(isolation="snapshot")
    def snapshot_transfer(tx: nonstop.Transaction, tid: str, src: str, dst: str, n: int) -> None:
        a = tx.get(Account, number=src)  # no lock: conflicts show up at the write
        b = tx.get(Account, number=dst)
        a.balance -= n
        b.balance += n
        tx.create(Transfer, tid=tid, src=src, dst=dst, amount=n)

    acked: set[str] = set()
    lock = threading.Lock()

    def run(w: int) -> None:
        if w % 2:
            thread_worker(bank_db, w, 30, acked, lock)
            return
        rng = random.Random(w)
        for i in range(30):
            src, dst = rng.sample(account_numbers(N_ACCOUNTS), 2)
            snapshot_transfer(bank_db, f"s{w}-{i}", src, dst, rng.randint(1, 9))
            with lock:
                acked.add(f"s{w}-{i}")

    run_threads(4, run, timeout=80)
    assert check_ledger(bank_db, account_numbers(N_ACCOUNTS), acked) == 120


def read_while_writing(
    db: nonstop.Database, read: Callable[[], T], transfers_each: int
) -> tuple[list[T], list[T], set[str]]:
    """One thread repeats ``read`` while three write transfers (``transfers_each`` each,
    more until ``READS_WHILE_WRITING`` reads were made while they all ran, at most 40 s).

    Returns every read, the reads finished while no writer had finished, and the
    acknowledged transfer ids."""
    stop = threading.Event()
    reads: list[T] = []
    writing: list[T] = []
    acked: set[str] = set()
    lock = threading.Lock()
    done: list[int] = []
    deadline = time.monotonic() + 40

    def run(w: int) -> None:
        if w == 0:
            while not stop.is_set():
                value = read()
                reads.append(value)
                if not done:
                    writing.append(value)
            return
        try:
            writer_until(db, w, transfers_each, acked, lock, writing, deadline)
        finally:
            with lock:
                done.append(w)
                if len(done) == 3:
                    stop.set()

    run_threads(4, run, timeout=55)
    return reads, writing, acked


@pytest.mark.timeout(60)
def test_readers_see_a_conserved_total_while_writers_run(bank_db: nonstop.Database) -> None:
    @nonstop.transactional
    def total(tx: nonstop.Transaction) -> int:
        # serializable: read locks on every account (deadlocks with writers are replayed)
        return sum(a.balance for a in tx.extent(Account))

    totals, writing, acked = read_while_writing(bank_db, lambda: total(bank_db), 30)
    # Not starved: a serializable scan, the deadlock victim by nature (it read-locks every
    # account), finished reads while the writers ran (an older transaction is not the
    # victim of a younger one, nonstop.tx.waiting); every one saw the conserved total.
    assert len(writing) >= READS_WHILE_WRITING
    assert set(totals) == {1000 * N_ACCOUNTS}
    assert check_ledger(bank_db, account_numbers(N_ACCOUNTS), acked) == len(acked) >= 90


@pytest.mark.timeout(60)
def test_snapshot_sums_are_never_torn_while_writers_run(bank_db: nonstop.Database) -> None:
    """The README's pattern: a ``snapshot`` transaction sums the accounts (by lookups, by
    the extent and by a paged query) while transfers commit; it takes no lock, blocks no
    writer, and every sum is the conserved total (issue 10)."""
    numbers = account_numbers(N_ACCOUNTS)

    def sums() -> tuple[int, int, int]:
        with bank_db.transaction(isolation="snapshot") as tx:
            by_key = sum(tx.get(Account, number=n).balance for n in numbers)
            by_extent = sum(a.balance for a in tx.extent(Account))
            by_pages = sum(a.balance for a in tx.query(Account).page_size(2))
        return by_key, by_extent, by_pages

    every, writing, acked = read_while_writing(bank_db, sums, 40)
    total = 1000 * N_ACCOUNTS
    assert len(writing) >= READS_WHILE_WRITING and set(every) == {(total, total, total)}
    assert check_ledger(bank_db, numbers, acked) == len(acked) >= 120
