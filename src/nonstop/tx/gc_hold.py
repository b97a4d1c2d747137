"""A process-wide pause of the cyclic GC held by transactions that hold many objects.

An overwrite's swap adds an entry per object swapped to one transaction, which
lives until its two-phase commit ends.  With the collector on, each full
collection scans all of them again and, since it runs on whichever thread
allocates, holds the node's event loop for its duration (measured: 0.1 s
growing to over 0.5 s for a swap of 20,000 objects; seconds for millions) --
long enough for peers to declare the node Down.  So the collector stays off
from the swap's start until the transaction ends (its ``on_commit`` or
``on_rollback`` notifier); reference counting still frees everything (a
finished transaction breaks its own cycles).  Holds nest: the collector comes
back when the last one is released, if it was on before the first; the bulk
scans and upserts pause it with :func:`paused`, so that one ending does not
turn it back on under a swap; a large transaction's entries freed a slice per
loop turn after it ends hold it until the last slice (``tx/transaction.py``
``_Teardown``: why this lives in the transaction layer).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_LIMIT = 50_000
"""Objects allocated under a hold above which its release moves them to the oldest
generation (examining 50,000 takes ≈ 5-10 ms on the benchmark machine)."""

_lock = threading.Lock()
_holds = 0
_was_enabled = False


def hold() -> None:
    """Pause the collector until a matching :func:`release`."""
    global _holds, _was_enabled
    with _lock:
        if _holds == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holds += 1


def release() -> None:
    """End one :func:`hold`; the collector resumes after the last one.

    Every object allocated while it was off is still in the youngest generation: the
    first collection after it would examine them all at once -- a "generation 0"
    collection of 0.5-0.6 s after a 200,000-row swap, on every participant at the
    same moment (phase two ends together), found by the stack watchdog with every
    node seeing its peers Down (data-path.md §6.8, session 11).  So they are moved to
    the oldest generation first (``gc.freeze`` then ``gc.unfreeze``: two list splices,
    no object examined): most of them are freed by reference counting meanwhile (a
    finished transaction breaks its own cycles), and a cycle among them is collected
    by the next full collection, at the collector's usual pace."""
    global _holds
    with _lock:
        if _holds == 0:
            return
        _holds -= 1
        if _holds == 0 and _was_enabled:
            if gc.get_count()[0] > YOUNG_LIMIT:
                # Only then: ``gc.unfreeze`` also returns the node's frozen start-up
                # objects to the oldest generation (node/startup_heap.py), and a short
                # hold (a replica store loading a small copy) leaves a young generation
                # that one collection examines in a few milliseconds.
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def release_soon() -> None:
    """:func:`release` at the next turn of the running event loop (now if there is none):
    for a transaction's ``on_commit``/``on_rollback`` notifier, which runs before the
    transaction drops its entries -- released at once, the collector's next full pass
    would walk every entry of the swap that is about to be freed (0.5-1.1 s, found by the
    stack watchdog in a 400,000-entry rollback)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        release()
        return
    loop.call_soon(release)


@contextmanager
def paused() -> Iterator[None]:
    """A :func:`hold` for the duration of a block (a scan, a bulk upsert)."""
    hold()
    try:
        yield
    finally:
        release()


def holds() -> int:
    """How many holds are in force (tests)."""
    return _holds


__all__ = ["hold", "holds", "paused", "release", "release_soon"]
