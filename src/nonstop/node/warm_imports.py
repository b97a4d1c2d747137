"""Import pyarrow off the event loop before the first Arrow batch needs it.

A Spark write sends its rows as Arrow IPC streams; the node decodes them with
pyarrow, imported lazily (most nodes never see Arrow, and the import costs about
0.15 s of CPU).  Imported by the first batch, on the event loop, it held the loop
for 0.15-0.45 s on a loaded 2-core machine -- a loop that answers no keep-alive
meanwhile, long enough for the peers to see the node Down
(bench/results/spark-partitions.md, "The event loop").  So the first client op
that announces bulk work (:data:`BULK_OPS`: the schema and plan a Spark job asks
for first, a partition map, an upsert) starts the import on a thread of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import threading

BULK_OPS = frozenset(
    {
        "bulk.schema",
        "bulk.plan",
        "bulk.scan",
        "bulk.upsert",
        "bulk.overwrite.begin",
        "partition.objects",
        "tx.upsert",
        "tx.overwrite",
    }
)
"""Client ops after which Arrow batches are likely: the first one starts the import."""

_started = threading.Event()


def warm_arrow() -> threading.Thread | None:
    """Start importing ``pyarrow.ipc`` on a daemon thread (once; None if done or absent)."""
    if _started.is_set():
        return None
    _started.set()
    if importlib.util.find_spec("pyarrow") is None:
        return None

    def load() -> None:
        with contextlib.suppress(Exception):  # a broken install fails later, where it is used
            importlib.import_module("pyarrow.ipc")

    thread = threading.Thread(target=load, name="warm-arrow", daemon=True)
    thread.start()
    return thread


__all__ = ["BULK_OPS", "warm_arrow"]
