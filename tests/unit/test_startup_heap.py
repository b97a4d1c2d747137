"""The node's start-up objects are frozen out of the cyclic collector (issue 14)."""

from __future__ import annotations

import gc
import time

from nonstop.node.startup_heap import freeze_startup_objects


def test_freezing_keeps_start_up_objects_out_of_full_collections() -> None:
    keep = [[i] for i in range(200_000)]  # long-lived objects, as a node's start-up
    try:
        gc.collect()
        t = time.perf_counter()
        gc.collect()
        walked = time.perf_counter() - t
        assert freeze_startup_objects() >= len(keep)
        t = time.perf_counter()
        gc.collect()
        frozen = time.perf_counter() - t
        assert frozen < walked / 2, (walked, frozen)
        # Reference counting still frees frozen objects; only the collector skips them.
        assert keep[0] == [0]
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
