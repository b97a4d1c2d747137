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
