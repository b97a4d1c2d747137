"""The node's cluster state on disk: one LMDB environment in ``DATA/cluster``.

Three sub-databases:

* ``state`` — exactly the keys protocol machines write with ``Persist``; its
  whole content is handed back to the machine as ``recovered`` at start;
* ``meta``  — the node's identity (cluster id, name, location code, store
  timestamp) written once when the data directory is created, so a restart
  cannot silently become another node or join another cluster;
* ``format`` — ``format`` = ``nonstop-cluster 2``: every value of ``state`` and
  ``meta`` is stored as payload + CRC-32 (4 bytes, little-endian) and checked
  on every read (format 1, without checksums, is refused with one line).

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
import zlib
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import lmdb
import msgpack

from nonstop.errors import CorruptStore, IncompatibleStore, StoreError
from nonstop.runtime.interface import Persist
from nonstop.runtime.persist import Done

DEFAULT_MAP_SIZE = 1 << 30
FORMAT = b"nonstop-cluster 2"
"""The value of ``format``/``format``: 2 = every value carries a CRC-32 (format 1 had none)."""
_CRC = 4
_RESIDUE = 0x2144DF1C  # the CRC-32 of any sealed value: one call checks it


def seal(payload: bytes) -> bytes:
    """``payload`` followed by its CRC-32 (little-endian), as every value is stored."""
    return payload + zlib.crc32(payload).to_bytes(_CRC, "little")


def check_lmdb_file(path: str) -> None:
    """CorruptStore if ``path/data.mdb`` is too short for LMDB's two meta pages.

    LMDB maps the file: a read past its end is a SIGBUS that kills the process,
    so a truncated file is refused before LMDB touches it (the pages the meta
    pages announce are checked after opening: :func:`check_lmdb_pages`).
    """
    data = os.path.join(path, "data.mdb")
    try:
        size = os.stat(data).st_size
    except FileNotFoundError:
        return
    if 0 < size < 8192:
        raise CorruptStore(f"{data} is truncated ({size} bytes; LMDB needs at least 8192)")


def check_lmdb_pages(env: lmdb.Environment, path: str) -> None:
    """CorruptStore if ``path/data.mdb`` is shorter than the pages its meta page announces."""
    data = os.path.join(path, "data.mdb")
    size = os.stat(data).st_size
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if size < needed:
        raise CorruptStore(f"{data} is truncated ({size} bytes; its pages need {needed})")


class ClusterStore:
    """A thin, blocking wrapper; the runtime calls :meth:`commit` from an executor.

    Every value (``state`` and ``meta``) is stored sealed with a CRC-32 and
    checked when read; a damaged file or record is a :class:`CorruptStore` whose
    one-line message names the file and the key, never wrong content.
    """

    def __init__(self, path: str, *, map_size: int = DEFAULT_MAP_SIZE, sync: bool = True) -> None:
        self.path = path
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the cluster store {path}: {exc.strerror}") from exc
        check_lmdb_file(path)
        # sync=True: every write transaction's commit is an fsync (the group
        # commit makes that affordable); metasync too, so a crash never loses
        # the newest commit's meta page.
        try:
            self.env = lmdb.open(
                path,
                map_size=map_size,
                max_dbs=4,
                sync=sync,
                metasync=sync,
                subdir=True,
                lock=True,
            )
        except (lmdb.InvalidError, lmdb.CorruptedError) as exc:
            raise CorruptStore(f"{path}/data.mdb is damaged: {exc}") from exc
        except lmdb.Error as exc:
            raise StoreError(f"cannot open the cluster store {path}: {exc}") from exc
        try:
            check_lmdb_pages(self.env, path)
            with self.env.begin(write=True) as txn:
                self._state = self.env.open_db(b"state", txn=txn)
                self._meta = self.env.open_db(b"meta", txn=txn)
                self._format = self.env.open_db(b"format", txn=txn)
                self._check_format(txn)
        except lmdb.Error as exc:
            self.env.close()
            if isinstance(exc, lmdb.ReadonlyError | lmdb.DiskError):
                raise StoreError(f"cannot write the cluster store {path}: {exc}") from exc
            raise CorruptStore(f"{path}/data.mdb is damaged: {exc}") from exc
        except BaseException:
            self.env.close()
            raise

    def _check_format(self, txn: lmdb.Transaction) -> None:
        marker = txn.get(b"format", db=self._format)
        if marker == FORMAT:
            return
        if marker is not None:
            raise IncompatibleStore(
                f"{self.path} is a cluster store of format {bytes(marker)!r}, "
                f"this version reads {FORMAT!r}"
            )
        if txn.stat(self._meta)["entries"] or txn.stat(self._state)["entries"]:
            raise IncompatibleStore(
                f"{self.path} is a cluster store of format 1 (no checksums); this version "
                "reads format 2: start this node with a new data directory and let it join"
            )
        txn.put(b"format", FORMAT, db=self._format)

    def _open(self, db: str, key: bytes, raw: bytes | memoryview) -> bytes:
        if len(raw) < _CRC or zlib.crc32(raw) != _RESIDUE:
            raise CorruptStore(
                f"damaged record in {self.path}/data.mdb: database {db!r}, key {key!r} "
                "fails its checksum"
            )
        return bytes(raw[:-_CRC])

    def _items(self, db: Any, name: str) -> dict[bytes, bytes]:
        try:
            with self.env.begin(db=db) as txn:
                return {bytes(k): self._open(name, bytes(k), v) for k, v in txn.cursor()}
        except lmdb.Error as exc:
            raise CorruptStore(f"{self.path}/data.mdb is damaged ({name!r}): {exc}") from exc

    # ----------------------------------------------------------- identity
    def read_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self._items(self._meta, "meta").items():
            try:
                out[k.decode()] = msgpack.unpackb(v, raw=False)
            except (ValueError, msgpack.UnpackException) as exc:
                raise CorruptStore(f"{self.path}/data.mdb: meta {k!r} unreadable") from exc
        return out

    def write_meta(self, values: dict[str, Any]) -> None:
        with self.env.begin(write=True, db=self._meta) as txn:
            for k, v in values.items():
                txn.put(k.encode(), seal(msgpack.packb(v, use_bin_type=True)))

    # -------------------------------------------------------------- state
    def recovered(self) -> dict[bytes, bytes]:
        """Every durable key/value the machines persisted (checksums verified)."""
        return self._items(self._state, "state")

    def commit(self, writes: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Apply ``writes`` in order in one write transaction (one fsync); return the count."""
        n = 0
        with self.env.begin(write=True, db=self._state) as txn:
            for key, value in writes:
                if value is None:
                    txn.delete(key)
                else:
                    txn.put(key, seal(value))
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
