"""Import pyarrow off the event loop, never on it.

A Spark write sends its rows as Arrow IPC streams; the node decodes them with
pyarrow, imported lazily (most nodes never see Arrow, and the import costs about
0.15 s of CPU).  Imported by the first batch, on the event loop, it held the loop
for 0.15-0.45 s on a loaded 2-core machine -- a loop that answers no keep-alive
meanwhile, long enough for the peers to see the node Down
(bench/results/spark-partitions.md, "The event loop").  So:

* the first client op that announces bulk work (:data:`BULK_OPS`: the schema and
  plan a Spark job asks for first, a partition map, an upsert) starts the import
  on a thread of its own (:func:`warm_arrow`, from ``node/router.py``);
* a client op carrying Arrow rows that arrives before the import is done waits
  for it, with every client op after it, in order (``dataplane/service.py``):
  the loop keeps answering everything else meanwhile.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
from typing import Any

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

ARROW_MODULE = "pyarrow.ipc"
_started = threading.Event()


def load_arrow() -> None:
    """Import :data:`ARROW_MODULE` (blocking: run it on a thread; errors are left to its use)."""
    with contextlib.suppress(Exception):
        importlib.import_module(ARROW_MODULE)


def needs_arrow_import(payload: Any) -> bool:
    """Does this client op carry Arrow rows while pyarrow is not imported yet?"""
    return (
        isinstance(payload, dict)
        and payload.get("format") == "arrow"
        and ARROW_MODULE not in sys.modules
    )


def warm_arrow() -> threading.Thread | None:
    """Start importing ``pyarrow.ipc`` on a daemon thread (once; None if done or absent)."""
    if _started.is_set():
        return None
    _started.set()
    if importlib.util.find_spec("pyarrow") is None:
        return None

    thread = threading.Thread(target=load_arrow, name="warm-arrow", daemon=True)
    thread.start()
    return thread


__all__ = ["ARROW_MODULE", "BULK_OPS", "load_arrow", "needs_arrow_import", "warm_arrow"]
