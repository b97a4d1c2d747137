"""Group commit: one writer thread turns many transactions' write sets into one fsync.

Committing transactions hand their write sets to :meth:`GroupCommitter.submit`
and wait.  The writer drains everything queued, applies it in *one* LMDB write
transaction, commits (one fsync when the store is durable) and then wakes every
waiter.  While it fsyncs, the next group queues up — so the more concurrent
committers, the more commits per fsync.  A lone fsync costs 0.2–3 ms on the
disks we measured; batching is where the speed is.

If applying a group fails (a bug, or the disk is full), the group is retried one
write set at a time so that only the faulty transaction fails.
"""

from __future__ import annotations

import bisect
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import lmdb

from nonstop.errors import StoreError
from nonstop.store.lmdb_store import Store

log = logging.getLogger("nonstop.store")
_U64 = struct.Struct(">Q")

# An operation: (True, db, key, value) is a put; (False, db, key, value-or-None) a delete.
Op = tuple[bool, Any, bytes, bytes | None]


@dataclass(slots=True)
class WriteSet:
    """What one transaction writes, ready for the store."""

    ops: list[Op] = field(default_factory=list)
    count_deltas: dict[bytes, int] = field(default_factory=dict)


GROUP_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""Upper bounds of the group-size histogram (write sets per group); one more slot: larger."""
WRITE_SECONDS_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
"""Upper bounds (seconds) of the group write-and-fsync time histogram; one more slot: slower."""


@dataclass(slots=True)
class CommitStats:
    groups: int = 0
    commits: int = 0
    largest_group: int = 0
    # Histograms read by the node's metrics (nonstop.node.metrics): counts per bucket.
    group_sizes: list[int] = field(default_factory=lambda: [0] * (len(GROUP_SIZE_BUCKETS) + 1))
    write_seconds: list[int] = field(default_factory=lambda: [0] * (len(WRITE_SECONDS_BUCKETS) + 1))
    write_seconds_sum: float = 0.0


class GroupCommitter:
    """The store's single writer."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._queue: list[tuple[WriteSet, Callable[[BaseException | None], None]]] = []
        self._closing = False
        self.stats = CommitStats()
        self._thread = threading.Thread(target=self._run, name="nonstop-group-commit", daemon=True)
        self._thread.start()

    @property
    def closing(self) -> bool:
        """Whether :meth:`close` began: nothing submitted from now on is accepted."""
        return self._closing

    def submit(self, ws: WriteSet, done: Callable[[BaseException | None], None]) -> None:
        """Queue a write set; ``done(None)`` once it is durable, ``done(exc)`` on failure."""
        with self._cond:
            if self._closing:
                raise StoreError("the store is closing")
            self._queue.append((ws, done))
            self._cond.notify()

    def commit(self, ws: WriteSet) -> None:
        """Submit and wait until durable (for callers that are threads)."""
        event = threading.Event()
        box: list[BaseException | None] = [None]

        def done(exc: BaseException | None) -> None:
            box[0] = exc
            event.set()

        self.submit(ws, done)
        event.wait()
        if box[0] is not None:
            raise box[0]

    def close(self) -> None:
        """Finish everything queued, then stop the writer."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    # -------------------------------------------------------------- writer
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                batch, self._queue = self._queue, []
                if not batch and self._closing:
                    return
            started = time.perf_counter()
            try:
                self._apply([ws for ws, _ in batch])
                results: list[BaseException | None] = [None] * len(batch)
                self._store.commit_seq += 1
            except Exception as exc:  # retry alone so only the faulty write set fails
                log.warning(
                    "group commit of %d write sets failed (%s); retrying one by one",
                    len(batch),
                    exc,
                )
                results = []
                for ws, _ in batch:
                    try:
                        self._apply([ws])
                        results.append(None)
                        self._store.commit_seq += 1
                    except Exception as one:
                        results.append(_as_store_error(one))
            self.stats.groups += 1
            self.stats.commits += len(batch)
            self.stats.largest_group = max(self.stats.largest_group, len(batch))
            took = time.perf_counter() - started
            self.stats.group_sizes[bisect.bisect_left(GROUP_SIZE_BUCKETS, len(batch))] += 1
            self.stats.write_seconds[bisect.bisect_left(WRITE_SECONDS_BUCKETS, took)] += 1
            self.stats.write_seconds_sum += took
            for (_, done), result in zip(batch, results, strict=True):
                try:
                    done(result)
                except Exception:  # a waiter's callback must not kill the writer
                    log.exception("commit callback failed")

    def _apply(self, batch: list[WriteSet]) -> None:
        # No two write sets of one group touch the same key: a transaction holds its
        # object and unique-key-value locks until its group is durable, so a second
        # writer of the same key always lands in a later group.  That lets the writer
        # reorder freely: deletes first, then puts batched per database with
        # putmulti (one C call each, instead of a Python loop that ping-pongs the GIL
        # with the event loop).
        store = self._store
        deltas: dict[bytes, int] = {}
        puts: dict[Any, list[tuple[bytes, bytes]]] = {}
        deletes: list[tuple[Any, bytes, bytes | None]] = []
        for ws in batch:
            for is_put, db, key, value in ws.ops:
                if is_put:
                    bucket = puts.get(db)
                    if bucket is None:
                        bucket = puts[db] = []
                    bucket.append((key, value))  # type: ignore[arg-type]
                else:
                    deletes.append((db, key, value))
            for name, delta in ws.count_deltas.items():
                deltas[name] = deltas.get(name, 0) + delta
        with store.env.begin(write=True) as txn:
            for db, key, value in deletes:
                txn.delete(key, value or b"", db=db)
            for db, items in puts.items():
                txn.cursor(db=db).putmulti(items)
            for name, delta in deltas.items():
                if delta:
                    raw = txn.get(name, db=store.counts)
                    current = 0 if raw is None else _U64.unpack(raw)[0]
                    txn.put(name, _U64.pack(max(0, current + delta)), db=store.counts)


def _as_store_error(exc: Exception) -> BaseException:
    if isinstance(exc, lmdb.MapFullError):
        return StoreError("the store is full: open it with a larger map_size")
    if isinstance(exc, lmdb.Error):
        return StoreError(f"commit failed in the store: {exc}")
    return exc
