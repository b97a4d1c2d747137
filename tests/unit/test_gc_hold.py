"""The process-wide pause of the cyclic collector (``tx/gc_hold.py``): holds nest, and
a transaction's notifier releases its hold only at the next loop turn, once the finished
transaction has dropped its entries (``release_soon``)."""

from __future__ import annotations

import asyncio
import gc

from nonstop.tx import gc_hold


def test_holds_nest_and_the_collector_comes_back_after_the_last() -> None:
    assert gc.isenabled() and gc_hold.holds() == 0
    gc_hold.hold()
    with gc_hold.paused():
        assert not gc.isenabled()
    assert not gc.isenabled(), "one hold left"
    gc_hold.release()
    assert gc.isenabled()


def test_release_soon_waits_for_the_next_loop_turn() -> None:
    async def run() -> tuple[bool, bool]:
        gc_hold.hold()
        gc_hold.release_soon()  # as a notifier runs, before the entries are dropped
        during = gc.isenabled()
        await asyncio.sleep(0)
        return during, gc.isenabled()

    assert asyncio.run(run()) == (False, True)
    gc_hold.hold()
    gc_hold.release_soon()  # no running loop: at once
    assert gc.isenabled() and gc_hold.holds() == 0


def test_what_was_allocated_under_a_hold_is_not_left_to_one_young_collection() -> None:
    # Under a hold the youngest generation grows with every allocation; released as is,
    # the next collection would examine all of it in one step (0.5-0.6 s after a large
    # swap, data-path.md §6.8).  The release moves it to the oldest generation first.
    gc.collect()
    gc_hold.hold()
    kept = [[i] for i in range(200_000)]
    assert gc.get_count()[0] >= 200_000
    gc_hold.release()
    assert gc.isenabled()
    assert gc.get_count()[0] < 1000, "the young generation starts empty again"
    assert gc.get_freeze_count() == 0, "nothing left frozen: a full collection sees them"
    del kept


def test_a_short_hold_leaves_the_frozen_start_up_objects_frozen() -> None:
    # A replica store loading a small copy holds the collector for a moment: its release
    # must not unfreeze what the node froze at start (node/startup_heap.py, issue 14).
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        gc_hold.hold()
        kept = [[i] for i in range(1_000)]
        gc_hold.release()
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen
        del kept
    finally:
        gc.unfreeze()
