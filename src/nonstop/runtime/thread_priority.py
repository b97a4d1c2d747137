"""Bulk work on helper threads yields the CPU to the event loop (issue 12).

A node's event loop answers keep-alives, votes and every client; its helper threads
do bulk work off the loop: a swap's prepared write set encoded and split for the
replicas (:func:`bulk_executor`, ``dataplane/participant.py``), a bounded swap applied
(``bulk/swap_apply.py``).  On a
machine with fewer cores than busy threads the kernel shares the CPU between them all
alike, so the loop thread of a node working on a large swap got a quarter of a core and
woke 0.3-0.6 s late: long enough for its peers to take it for dead
(``bench/results/spark-partitions.md``).  The helper threads therefore run at a lower
priority (a higher nice value, ``BULK_NICE``): they still get every cycle nobody else
wants, and lose to the loops when the CPU is short.  Linux keeps the nice value per
thread (``setpriority(2)``, NOTES), so the call lowers only the calling thread; on other
systems, or where it is refused, the thread stays as it was.  ``NONSTOP_BULK_NICE`` (an integer,
0 to keep the helpers' priority) overrides the default for a node process.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

BULK_NICE = 10
"""How much lower the helper threads run (nice steps; the kernel weighs 10 steps ~10x)."""


def bulk_nice() -> int:
    """The nice increment for helper threads: ``NONSTOP_BULK_NICE`` or :data:`BULK_NICE`."""
    raw = os.environ.get("NONSTOP_BULK_NICE")
    try:
        return max(0, min(19, int(raw))) if raw else BULK_NICE
    except ValueError:
        return BULK_NICE


def lower_this_thread(nice: int | None = None) -> bool:
    """Run the calling thread ``nice`` steps lower (default :func:`bulk_nice`); True if done."""
    step = bulk_nice() if nice is None else nice
    if step <= 0 or sys.platform != "linux":
        # Elsewhere PRIO_PROCESS with a thread's id names a process, maybe another one.
        return False
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + step))
    except OSError:
        return False
    return True


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def bulk_executor() -> ThreadPoolExecutor:
    """The process's pool for a swap's bulk steps: two threads, each run lower.

    Not the event loop's default executor: that one also serves the Spark reads' and
    loads' bulk handlers, which must not lose the CPU to Spark's own processes."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="nonstop-bulk", initializer=lower_this_thread
            )
        return _executor


__all__ = ["BULK_NICE", "bulk_executor", "bulk_nice", "lower_this_thread"]
