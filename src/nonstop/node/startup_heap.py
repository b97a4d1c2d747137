"""Keep the objects a node made while starting out of every later garbage collection.

CPython's cyclic collector walks every object it tracks in a full (generation 2)
collection.  A node's heap after start-up is mostly modules, classes, functions
and the admin API's and metrics' tables (≈ 60,000 objects that live as long as the
process): walking them cost 40-70 ms per full collection on the 2-core machine the
benchmarks run on, and 130-160 ms under load -- a pause of the node's event loop
that every transaction in flight waits for (issue 14: commit gaps).

:func:`freeze_startup_objects` collects once (the garbage of start-up is freed,
not kept) and then moves every surviving object to the permanent generation
(:func:`gc.freeze`): later collections walk only what was made after.  Reference
counting still frees a frozen object whose count drops to zero; only a *cycle* of
frozen objects that becomes garbage would stay, and start-up objects are not
dropped in cycles (they are the program itself).
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Collect, then freeze what survived; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


__all__ = ["freeze_startup_objects"]
