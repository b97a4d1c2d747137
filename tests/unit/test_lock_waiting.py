"""LockTable: blocking on locks from threads and asyncio tasks, timeouts, cancellation, races."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import pytest

from nonstop.errors import Deadlock, LockTimeout, TransactionClosed
from nonstop.tx.locks import LockManager, LockMode
from nonstop.tx.waiting import LockTable

R = LockMode.READ
W = LockMode.WRITE


def table_with_manager() -> tuple[LockTable, LockManager]:
    manager = LockManager()
    return LockTable(manager), manager


def wait_until(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.001)


async def wait_until_async(predicate: Callable[[], bool], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.001)


class HookedMutex:
    """Wraps the table's mutex; runs ``hook`` just before the ``at``-th entry takes it.

    Lets a test slip a grant in between a timeout firing and the waiter
    looking at its outcome: the race a real timeout can lose.
    """

    def __init__(self, real: threading.Lock, at: int, hook: Callable[[], None]) -> None:
        self.real, self.at, self.hook, self.entries = real, at, hook, 0

    def __enter__(self) -> None:
        self.entries += 1
        if self.entries == self.at:
            self.hook()
        self.real.acquire()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.real.release()


def release_in_thread(table: LockTable, txn: Hashable) -> Callable[[], None]:
    def hook() -> None:
        thread = threading.Thread(target=table.release_all, args=(txn,))
        thread.start()
        thread.join()

    return hook


# ------------------------------------------------------------------ threads
@pytest.mark.timeout(10)
def test_thread_blocks_until_release_then_holds_the_lock() -> None:
    table, manager = table_with_manager()
    table.acquire("t1", "x", W)
    got = threading.Event()

    def second() -> None:
        table.acquire("t2", "x", R)
        got.set()

    thread = threading.Thread(target=second)
    thread.start()
    wait_until(lambda: bool(manager.waiters("x")))
    assert not got.is_set()
    table.release_all("t1")
    thread.join(5)
    assert got.is_set()
    assert table.mode_held("t2", "x") == R


@pytest.mark.timeout(10)
def test_deadlock_raises_for_the_requester_and_names_the_cycle() -> None:
    table, manager = table_with_manager()
    table.acquire("t1", "x", R)
    table.acquire("t2", "x", R)
    with ThreadPoolExecutor(1) as pool:
        promoted = pool.submit(table.acquire, "t1", "x", W)
        wait_until(lambda: bool(manager.waiters("x")))
        with pytest.raises(Deadlock, match="'t2' -> 't1' -> 't2'"):
            table.acquire("t2", "x", W)
        assert table.mode_held("t2", "x") == R  # kept until the victim rolls back
        table.release_all("t2")
        promoted.result(5)
    assert table.mode_held("t1", "x") == W


@pytest.mark.timeout(10)
def test_ranked_deadlock_kills_the_youngest_and_the_older_requester_waits_on() -> None:
    table, manager = table_with_manager()
    table.rank("old", 1.0)
    table.rank("young", 2.0)
    table.acquire("old", "a", R)
    table.acquire("young", "b", W)
    with ThreadPoolExecutor(2) as pool:
        young = pool.submit(table.acquire, "young", "a", W)  # waits for old's READ
        wait_until(lambda: bool(manager.waiters("a")))
        older = pool.submit(table.acquire, "old", "b", R)  # closes the cycle
        with pytest.raises(Deadlock, match="'young' is the victim, as the youngest"):
            young.result(5)
        assert not older.done()  # still queued behind young's WRITE on b
        assert manager.holders("b") == {"young": W}  # kept until the victim rolls back
        table.release_all("young")
        older.result(5)
    assert table.mode_held("old", "b") == R
    assert table.deadlocks == 1


@pytest.mark.timeout(10)
def test_ranked_requester_younger_than_the_cycle_is_its_own_victim() -> None:
    table, manager = table_with_manager()
    table.rank("old", 1.0)
    table.rank("young", 2.0)
    table.acquire("old", "a", W)
    table.acquire("young", "b", W)
    with ThreadPoolExecutor(1) as pool:
        older = pool.submit(table.acquire, "old", "b", W)
        wait_until(lambda: bool(manager.waiters("b")))
        with pytest.raises(Deadlock, match=r"'young' is the victim$"):
            table.acquire("young", "a", W)
        table.release_all("young")
        older.result(5)
    assert table.mode_held("old", "b") == W


@pytest.mark.timeout(10)
def test_an_unranked_member_is_never_picked_and_an_unranked_requester_is_the_victim() -> None:
    table, manager = table_with_manager()
    table.rank("ranked", 5.0)
    table.acquire("branch", "a", W)  # a node's branch: never ranked
    table.acquire("ranked", "b", W)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(table.acquire, "ranked", "a", W)
        wait_until(lambda: bool(manager.waiters("a")))
        with pytest.raises(Deadlock, match=r"'branch' is the victim$"):
            table.acquire("branch", "b", W)
        table.release_all("branch")
        waiting.result(5)


def test_release_all_forgets_the_rank() -> None:
    table, _ = table_with_manager()
    table.rank("t1", 1.0)
    table.release_all("t1")
    assert table._born == {}


@pytest.mark.timeout(10)
def test_async_ranked_deadlock_wounds_the_younger_task() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        table.rank("old", 1.0)
        table.rank("young", 2.0)
        await table.acquire_async("old", "a", W)
        await table.acquire_async("young", "b", W)
        young = asyncio.ensure_future(table.acquire_async("young", "a", W))
        await wait_until_async(lambda: bool(manager.waiters("a")))
        older = asyncio.ensure_future(table.acquire_async("old", "b", W))
        with pytest.raises(Deadlock, match="youngest"):
            await asyncio.wait_for(young, 5)
        await asyncio.sleep(0.01)
        assert not older.done()
        table.release_all("young")
        await asyncio.wait_for(older, 5)
        assert table.mode_held("old", "b") == W

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_timeout_withdraws_the_request_and_unblocks_those_behind() -> None:
    table, manager = table_with_manager()
    table.acquire("t1", "x", R)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        writer = pool.submit(table.acquire, "t2", "x", W, 0.2)
        wait_until(lambda: len(manager.waiters("x")) == 1)
        reader = pool.submit(table.acquire, "t3", "x", R)  # behind t2: no barging
        with pytest.raises(LockTimeout, match="'t2'"):
            writer.result(5)
        assert time.monotonic() - started >= 0.2
        reader.result(5)
    assert manager.holders("x") == {"t1": R, "t3": R}
    assert manager.waiters("x") == []
    assert manager.held_by("t2") == {}


@pytest.mark.timeout(10)
def test_grant_racing_the_timeout_wins_and_nothing_leaks() -> None:
    table, manager = table_with_manager()
    table.acquire("t1", "x", W)
    # Entry 1 queues t2; entry 2 is t2 looking at its outcome after the timeout:
    # release t1 (granting t2) just before that.
    table._mutex = HookedMutex(table._mutex, 2, release_in_thread(table, "t1"))  # type: ignore[assignment]
    table.acquire("t2", "x", W, timeout=0.05)  # no LockTimeout: the grant got there first
    assert table.mode_held("t2", "x") == W
    assert manager.waiters("x") == []
    table.release_all("t2")
    assert manager.resources() == []


@pytest.mark.timeout(10)
def test_release_of_a_waiting_txn_wakes_it_with_an_error() -> None:
    table, manager = table_with_manager()
    table.acquire("t1", "x", W)
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(table.acquire, "t2", "x", R)
        wait_until(lambda: bool(manager.waiters("x")))
        table.release_all("t2")  # e.g. the transaction was aborted from elsewhere
        with pytest.raises(TransactionClosed):
            stuck.result(5)
    assert manager.waiters("x") == []
    assert manager.holders("x") == {"t1": W}


def test_interrupt_ends_a_wait_but_keeps_the_locks_held() -> None:
    table, manager = table_with_manager()
    table.acquire("t1", "x", W)
    table.acquire("t2", "y", W)
    with ThreadPoolExecutor(1) as pool:
        stuck = pool.submit(table.acquire, "t2", "x", W)
        wait_until(lambda: bool(manager.waiters("x")))
        assert table.wait_for() == {"t2": {"t1"}}
        table.interrupt("t2", Deadlock("victim"))
        with pytest.raises(Deadlock):
            stuck.result(5)
    assert manager.waiters("x") == [] and table.wait_for() == {}
    assert manager.holders("y") == {"t2": W}  # released only by its rollback
    table.interrupt("t1", Deadlock("not waiting: nothing happens"))
    assert manager.holders("x") == {"t1": W}


def test_try_acquire_and_zero_timeout() -> None:
    table, manager = table_with_manager()
    assert table.try_acquire("t1", "x", R)
    assert not table.try_acquire("t2", "x", W)
    with pytest.raises(LockTimeout):
        table.acquire("t2", "x", W, timeout=0)
    assert manager.waiters("x") == []
    assert table.mode_held("t2", "x") is None


# ------------------------------------------------------------------ asyncio
@pytest.mark.timeout(10)
def test_async_waiter_woken_by_release_on_another_thread() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        table.acquire("t1", "x", W)
        task = asyncio.create_task(table.acquire_async("t2", "x", W))
        await wait_until_async(lambda: bool(manager.waiters("x")))
        assert not task.done()
        await asyncio.to_thread(table.release_all, "t1")
        await asyncio.wait_for(task, 5)
        assert table.mode_held("t2", "x") == W

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_async_deadlock_and_timeout() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        await table.acquire_async("t1", "a", W)
        await table.acquire_async("t2", "b", W)
        first = asyncio.create_task(table.acquire_async("t1", "b", R))
        await wait_until_async(lambda: bool(manager.waiters("b")))
        with pytest.raises(Deadlock):
            await table.acquire_async("t2", "a", R)
        with pytest.raises(LockTimeout):
            await table.acquire_async("t3", "a", R, timeout=0.05)
        assert manager.waiters("a") == []
        table.release_all("t2")
        await asyncio.wait_for(first, 5)
        assert manager.held_by("t1") == {"a": W, "b": R}

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_async_cancellation_withdraws_the_request() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        table.acquire("t1", "x", R)
        writer = asyncio.create_task(table.acquire_async("t2", "x", W))
        await wait_until_async(lambda: len(manager.waiters("x")) == 1)
        reader = asyncio.create_task(table.acquire_async("t3", "x", R))
        await wait_until_async(lambda: len(manager.waiters("x")) == 2)
        writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writer
        await asyncio.wait_for(reader, 5)  # no longer behind a writer
        assert manager.holders("x") == {"t1": R, "t3": R}
        assert manager.pending("t2") == []

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_async_cancel_after_grant_keeps_the_lock_for_release_all() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        table.acquire("t1", "x", W)
        task = asyncio.create_task(table.acquire_async("t2", "x", W))
        await wait_until_async(lambda: bool(manager.waiters("x")))
        table.release_all("t1")  # grant queued to the loop...
        task.cancel()  # ...but the task is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await task
        assert table.mode_held("t2", "x") == W  # known to the txn, freed when it ends
        table.release_all("t2")
        assert manager.resources() == []

    asyncio.run(main())


@pytest.mark.timeout(10)
def test_async_grant_racing_the_timeout_wins() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        table.acquire("t1", "x", W)
        table._mutex = HookedMutex(table._mutex, 2, release_in_thread(table, "t1"))  # type: ignore[assignment]
        await table.acquire_async("t2", "x", W, timeout=0.05)
        assert table.mode_held("t2", "x") == W
        assert manager.waiters("x") == []

    asyncio.run(main())


# ------------------------------------------------------------ stress: threads
RESOURCES = ("a", "b", "c", "d")


class Exclusion:
    """What the lock table must guarantee, checked independently of it."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.readers: dict[str, set[Hashable]] = {r: set() for r in RESOURCES}
        self.writer: dict[str, Hashable | None] = dict.fromkeys(RESOURCES)

    def enter(self, txn: Hashable, res: str, mode: LockMode) -> None:
        with self.mutex:
            assert self.writer[res] in (None, txn), (txn, res, self.writer[res])
            if mode is W:
                assert self.readers[res] <= {txn}, (txn, res, self.readers[res])
                self.writer[res] = txn
            else:
                self.readers[res].add(txn)

    def leave(self, txn: Hashable) -> None:
        with self.mutex:
            for res in RESOURCES:
                self.readers[res].discard(txn)
                if self.writer[res] == txn:
                    self.writer[res] = None


def plan(rng: random.Random) -> list[tuple[str, LockMode]]:
    """Read one object and lock another, sometimes promoting the first: deadlock-prone."""
    a, b = rng.sample(RESOURCES, 2)
    steps = [(a, R), (b, rng.choice((R, W)))]
    if rng.random() < 0.5:
        steps.append((a, W))
    return steps


def run_thread_txns(table: LockTable, ex: Exclusion, worker: int, count: int) -> int:
    rng = random.Random(worker)
    deadlocks = 0
    for n in range(count):
        txn = ("thread", worker, n)
        while True:
            try:
                for res, mode in plan(rng):
                    table.acquire(txn, res, mode)
                    ex.enter(txn, res, mode)
                    time.sleep(0)
            except Deadlock:
                deadlocks += 1
                continue
            finally:
                ex.leave(txn)
                table.release_all(txn)
            break
    return deadlocks


async def run_task_txns(table: LockTable, ex: Exclusion, worker: int, count: int) -> int:
    rng = random.Random(1000 + worker)
    deadlocks = 0
    for n in range(count):
        txn = ("task", worker, n)
        while True:
            try:
                for res, mode in plan(rng):
                    await table.acquire_async(txn, res, mode)
                    ex.enter(txn, res, mode)
                    await asyncio.sleep(0)
            except Deadlock:
                deadlocks += 1
                continue
            finally:
                ex.leave(txn)
                table.release_all(txn)
            break
    return deadlocks


def assert_all_free(table: LockTable, manager: LockManager) -> None:
    assert manager.resources() == []
    assert manager.wait_for() == {}
    assert table._waits == {}


@pytest.mark.timeout(30)
def test_threads_with_deadlock_victims_retrying_all_finish() -> None:
    table, manager = table_with_manager()
    ex = Exclusion()
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(run_thread_txns, table, ex, w, 60) for w in range(8)]
        deadlocks = sum(f.result(25) for f in futures)  # re-raises an Exclusion failure
    print(f"{deadlocks} deadlock victims retried")
    assert_all_free(table, manager)


@pytest.mark.timeout(30)
def test_asyncio_tasks_with_deadlock_victims_retrying_all_finish() -> None:
    async def main() -> int:
        table, manager = table_with_manager()
        ex = Exclusion()
        results = await asyncio.wait_for(
            asyncio.gather(*(run_task_txns(table, ex, w, 60) for w in range(12))), 25
        )
        assert_all_free(table, manager)
        return sum(results)

    # Tasks interleave only at awaits, so promotion deadlocks are certain here.
    assert asyncio.run(main()) > 0


@pytest.mark.timeout(30)
def test_threads_and_tasks_share_one_table() -> None:
    async def main() -> None:
        table, manager = table_with_manager()
        ex = Exclusion()
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(4) as pool:
            threads = [
                loop.run_in_executor(pool, run_thread_txns, table, ex, w, 40) for w in range(4)
            ]
            tasks = [run_task_txns(table, ex, w, 40) for w in range(8)]
            await asyncio.wait_for(asyncio.gather(*threads, *tasks), 25)
        assert_all_free(table, manager)

    asyncio.run(main())
