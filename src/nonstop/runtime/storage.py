"""The node's cluster state on disk: one LMDB environment in ``DATA/cluster``.

Two sub-databases:

* ``state`` — exactly the keys protocol machines write with ``Persist``; its
  whole content is handed back to the machine as ``recovered`` at start;
* ``meta``  — the node's identity (cluster id, name, location code, store
  timestamp) written once when the data directory is created, so a restart
  cannot silently become another node or join another cluster.

It is kept apart from the object store (``DATA/store``) so that the cluster log's
fsyncs (group committed here) never wait behind bulk object writes, and the
other way round.

:class:`StoreWriter` is the real runtime's default
:class:`~nonstop.runtime.persist.Persister`: it commits write sets to the
``state`` database on a writer thread, one LMDB write transaction (one fsync)
for everything that arrived since the previous one began (group commit).
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lmdb
import msgpack

from nonstop.runtime.interface import Persist
from nonstop.runtime.persist import Done

DEFAULT_MAP_SIZE = 1 << 30


class ClusterStore:
    """A thin, blocking wrapper; the runtime calls :meth:`commit` from an executor."""

    def __init__(self, path: str, *, map_size: int = DEFAULT_MAP_SIZE, sync: bool = True) -> None:
        os.makedirs(path, exist_ok=True)
        # sync=True: every write transaction's commit is an fsync (the group
        # commit makes that affordable); metasync too, so a crash never loses
        # the newest commit's meta page.
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=4,
            sync=sync,
            metasync=sync,
            subdir=True,
            lock=True,
        )
        self._state = self.env.open_db(b"state")
        self._meta = self.env.open_db(b"meta")

    # ----------------------------------------------------------- identity
    def read_meta(self) -> dict[str, Any]:
        with self.env.begin(db=self._meta) as txn:
            return {k.decode(): msgpack.unpackb(v, raw=False) for k, v in txn.cursor()}

    def write_meta(self, values: dict[str, Any]) -> None:
        with self.env.begin(write=True, db=self._meta) as txn:
            for k, v in values.items():
                txn.put(k.encode(), msgpack.packb(v, use_bin_type=True))

    # -------------------------------------------------------------- state
    def recovered(self) -> dict[bytes, bytes]:
        """Every durable key/value the machines persisted."""
        with self.env.begin(db=self._state) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}

    def commit(self, writes: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Apply ``writes`` in order in one write transaction (one fsync); return the count."""
        n = 0
        with self.env.begin(write=True, db=self._state) as txn:
            for key, value in writes:
                if value is None:
                    txn.delete(key)
                else:
                    txn.put(key, value)
                n += 1
        return n

    def close(self) -> None:
        self.env.close()


class StoreWriter:
    """Group commit of :class:`ClusterStore` write sets on one writer thread (a ``Persister``).

    :meth:`persist` queues a write set; the writer thread takes *every* queued
    write set into one :meth:`ClusterStore.commit`, so the write sets that
    arrive while an fsync is in flight share the next one.  Each write set's
    ``done`` is called on the writer thread once its commit is durable (with
    the error if it failed), in the order the write sets were queued.
    ``stats`` counts ``commits`` and ``commit_us`` (time in commit, fsync included).
    """

    def __init__(self, store: ClusterStore, stats: collections.Counter[str] | None = None) -> None:
        self.store = store
        self.stats = stats if stats is not None else collections.Counter[str]()
        # Created here, not by the writer thread: a key added while the event loop
        # copies the counters would change the dict's size under it.
        self.stats["commits"] += 0
        self.stats["commit_us"] += 0
        self._lock = threading.Lock()
        self._queue: list[tuple[Sequence[Persist], Done]] = []
        self._running = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmdb-commit")

    def persist(self, batch: Sequence[Persist], done: Done) -> None:
        with self._lock:
            self._queue.append((batch, done))
            if self._running:
                return  # the writer thread takes it with the next commit
            self._running = True
        self._executor.submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._running = False
                    return
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                self.store.commit(
                    itertools.chain.from_iterable(p.writes for b, _ in batch for p in b)
                )
            except BaseException as exc:  # reported to every write set of the commit
                error = exc
            else:
                self.stats["commits"] += 1
                self.stats["commit_us"] += int((time.perf_counter() - started) * 1e6)
            for _, done in batch:
                done(error)

    def close(self) -> None:
        """Wait until everything queued is written (blocking), then stop the thread."""
        self._executor.shutdown(wait=True)
