"""A large ended transaction's locks and entries freed a slice at a time (data-path.md §6.8).

Slices are made small here (monkeypatched) so that each test is a few milliseconds:
what is proved is the order of things -- the loop runs between slices, a waiter is
woken by the slice that frees its lock, every lock is free at the end, the lock
table's mutex is free between slices -- not the slice size.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

import nonstop
from nonstop import Managed
from nonstop.tx import gc_hold, transaction, waiting
from nonstop.tx.locks import LockManager, LockMode
from nonstop.tx.loop_slices import SliceRunner
from nonstop.tx.waiting import LockTable

W = LockMode.WRITE


# ------------------------------------------------------------------ the manager
def test_release_some_frees_a_slice_at_a_time_and_grants_each_waiter_with_its_lock() -> None:
    m = LockManager()
    for r in range(10):
        assert m.acquire("big", r, W)
    waits = {r: m.acquire(f"w{r}", r, W) for r in (0, 9)}
    granted: list[Any] = []
    slices = 0
    done = False
    while not done:
        before = len(m.held_by("big"))
        grants, done = m.release_some("big", 3)
        slices += 1
        after = len(m.held_by("big"))
        assert before - after == min(3, before)  # exactly one slice freed
        for g in grants:  # granted only once its lock left "big"
            assert m.mode_held("big", g.resource) is None
            assert m.mode_held(g.txn, g.resource) is W
        granted += grants
    assert slices == 4
    assert sorted((g.txn, g.resource) for g in granted) == [("w0", 0), ("w9", 9)]
    assert {g.ticket for g in granted} == {w.ticket for w in waits.values()}  # type: ignore[union-attr]
    assert m.held_by("big") == {}
    assert set(m.resources()) == {0, 9}  # only the waiters' locks are left
    m.release_all("w0")
    m.release_all("w9")
    assert m.resources() == []


def test_release_some_of_a_small_or_unknown_transaction_is_release_all() -> None:
    m = LockManager()
    m.acquire("t", "a", W)
    assert m.release_some("t", 3) == ([], True)
    assert m.release_some("nobody", 3) == ([], True)
    assert m.resources() == []


# ------------------------------------------------------------------ the table
def test_without_a_home_loop_release_all_frees_everything_before_returning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "RELEASE_SLICE", 2)
    manager = LockManager()
    table = LockTable(manager)
    for r in range(7):
        table.try_acquire("big", r, W)
    table.release_all("big")
    assert manager.resources() == [] and table.slices.pending() == 0


def test_on_the_home_loop_other_callbacks_run_between_slices_and_waiters_are_woken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "RELEASE_SLICE", 2)
    manager = LockManager()
    table = LockTable(manager)

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        table.slices.home(loop)
        for r in range(10):
            assert table.try_acquire("big", r, W)
        trace: list[str] = []

        async def waiter(r: int) -> None:
            await table.acquire_async(f"w{r}", r, W, timeout=5)
            trace.append(f"granted {r}")

        tasks = [asyncio.create_task(waiter(r)) for r in (0, 9)]
        await asyncio.sleep(0)  # both queued behind "big"
        assert table.waiting(0) == table.waiting(9) == 1

        def tick(n: int) -> None:  # another client's work: runs between slices
            trace.append(f"held {len(manager.held_by('big'))}")
            if n:
                loop.call_soon(tick, n - 1)

        table.release_all("big")
        assert len(manager.held_by("big")) == 8  # the first slice, at once
        loop.call_soon(tick, 6)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await asyncio.sleep(0)
        for r in (0, 9):
            table.release_all(f"w{r}")
        table.slices.home(None)
        return trace

    trace = asyncio.run(main())
    helds = [int(t.split()[1]) for t in trace if t.startswith("held")]
    assert helds[:4] == [6, 4, 2, 0]  # one slice per loop turn, the loop's own work between
    assert sorted(t for t in trace if t.startswith("granted")) == ["granted 0", "granted 9"]
    assert manager.resources() == [] and table.slices.pending() == 0


def test_another_thread_hands_the_release_to_the_home_loop_mutex_free_between_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "RELEASE_SLICE", 2)
    manager = LockManager()
    table = LockTable(manager)

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        table.slices.home(loop)
        for r in range(9):
            table.try_acquire("big", r, W)
        # The store's writer thread ends the transaction: one slice there, the rest here.
        writer = threading.Thread(target=table.release_all, args=("big",))
        writer.start()
        writer.join()  # (blocks this loop: nothing of the rest can run before the check)
        assert table.slices.pending() == 1
        seen: list[int] = []
        while manager.held_by("big"):
            # The mutex is free between slices: a lock of another transaction is granted.
            assert table.try_acquire("other", "x", W)
            table.release_all("other")
            seen.append(len(manager.held_by("big")))
            await asyncio.sleep(0)
        table.slices.home(None)
        return seen

    seen = asyncio.run(main())
    assert seen and seen[0] == 7 and seen == sorted(seen, reverse=True)
    assert manager.resources() == []


def test_homing_away_finishes_what_the_loop_had_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "RELEASE_SLICE", 2)
    manager = LockManager()
    table = LockTable(manager)

    async def main() -> None:
        table.slices.home(asyncio.get_running_loop())
        for r in range(9):
            table.try_acquire("big", r, W)
        table.release_all("big")
        assert table.slices.pending() == 1 and manager.held_by("big")
        table.slices.home(None)  # the node stops: the store is about to close
        assert table.slices.pending() == 0 and manager.resources() == []

    asyncio.run(main())


def test_a_closed_home_loop_makes_the_work_run_at_once() -> None:
    runner = SliceRunner()
    loop = asyncio.new_event_loop()
    runner.home(loop)
    loop.close()
    left = [3]

    def step() -> bool:
        left[0] -= 1
        return left[0] == 0

    runner.run(step)
    assert left == [0] and runner.pending() == 0


# ------------------------------------------------------------ a transaction's entries
class Sliced(Managed, name="test_sliced_release.Sliced"):
    n: int = 0


def test_a_large_finished_transaction_frees_its_entries_in_slices_gc_held_until_the_last(
    db: nonstop.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(transaction, "TEARDOWN_SLICE", 3)  # (its 11 locks: one step)
    with db.transaction() as tx:
        refs = [tx.ref(tx.create(Sliced, n=i)) for i in range(10)]

    async def main() -> list[tuple[int, bool]]:
        db.engine.slices.home(asyncio.get_running_loop())
        async with db.transaction() as atx:
            for ref in refs:
                obj = await atx.by_ref(ref, lock="write")
                obj.n += 1  # type: ignore[union-attr]
            assert len(atx.entry_map()) == 10
        # Committed: the entries go a slice per turn, the GC stays off meanwhile.
        seen: list[tuple[int, bool]] = []
        while db.engine.slices.pending():
            seen.append((gc_hold.holds(), gc.isenabled()))
            await asyncio.sleep(0)
        assert db.engine.locks.held_by(atx.id) == {} and atx.entry_map() == {}
        async with db.transaction() as other:  # every lock is free again, the commit landed
            for ref in refs:
                obj = await other.by_ref(ref, lock="write")
                assert obj is not None and obj.n >= 1  # type: ignore[attr-defined]
        db.engine.slices.home(None)
        return seen

    was_enabled = gc.isenabled()
    seen = asyncio.run(main())
    assert len(seen) >= 3  # 10 entries in slices of 3: several loop turns
    assert all(holds >= 1 and not enabled for holds, enabled in seen)
    assert gc_hold.holds() == 0 and gc.isenabled() == was_enabled
