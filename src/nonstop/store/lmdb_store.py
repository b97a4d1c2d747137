"""The node store: one LMDB environment per database directory.

Layout (LMDB named databases):

=============  ===============================================  =========================
name           key                                              value
=============  ===============================================  =========================
``meta``       ``format``, ``location``, ``timestamp``, ...     msgpack
``objects``    ref (20 bytes)                                   msgpack [type, type version,
                                                                object version, {field:
                                                                value}] + crc32 (records.py)
``extents``    type name + 0x00 + ref                           empty
``counts``     type name                                        8-byte count (A2 cardinality)
``types``      type name                                        msgpack schema (E1/E2)
``ix:T:f``     order-preserving key value                       ref (dupsort when non-unique)
``asyncq``     target ref + priority byte + 8-byte sequence     msgpack call (A6)
``dead``       8-byte sequence                                  msgpack failed async call
``prepared``   global transaction id                            msgpack prepared write set
                                                                and locks + crc32 (2PC)
``results``    client id + 0x00 + 8-byte sequence               msgpack request result (H1)
``dtx``        ``dtx/...`` (the decision protocol's own keys)   its values (opaque here):
                                                                committed together with the
                                                                prepared records (2PC)
=============  ===============================================  =========================

The directory is locked with ``flock`` so that a second process cannot open it
(LMDB itself would allow that, and two nonstop nodes on one store would break
every guarantee).  Writes reach LMDB only through the group committer.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lmdb

from nonstop.errors import CorruptStore, IncompatibleStore, StoreError, StoreLocked
from nonstop.model.codec import pack, unpack
from nonstop.model.managed import TypeInfo
from nonstop.model.ref import Ref
from nonstop.store.records import CHECKSUM_BYTES, RESIDUE, corrupt, open_record

FORMAT_NAME = "nonstop-store"
FORMAT_VERSION = 2  # 2: object records carry a CRC-32 (store/records.py)
DEFAULT_MAP_SIZE = 1 << 38  # 256 GiB of address space; the file grows only as used
COUNTER_BLOCK = 1 << 16
_crc32 = zlib.crc32
_U64 = struct.Struct(">Q")


class Store:
    """An open store directory.  Thread-safe; one per process per directory."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durable: bool = True,
        map_size: int = DEFAULT_MAP_SIZE,
        location: int | None = None,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"{self.path} is not a directory (a store is a directory)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create store directory {self.path}: {exc.strerror}") from exc
        if not self.path.is_dir():
            raise StoreError(f"{self.path} is not a directory")
        self._lock_fd = self._lock_directory()
        try:
            self.env = self._open_env(durable, map_size)
            self.durable = durable
            self._db_lock = threading.Lock()
            self._dbs: dict[bytes, Any] = {}
            with self.env.begin(write=True) as txn:
                for name in (
                    b"meta",
                    b"objects",
                    b"extents",
                    b"counts",
                    b"types",
                    b"asyncq",
                    b"dead",
                    b"prepared",
                    b"results",
                    b"dtx",
                ):
                    self._dbs[name] = self.env.open_db(name, txn=txn)
                self._check_format(txn, location)
            self.meta = self._dbs[b"meta"]
            self.objects = self._dbs[b"objects"]
            self.extents = self._dbs[b"extents"]
            self.counts = self._dbs[b"counts"]
            self.types = self._dbs[b"types"]
            self.asyncq = self._dbs[b"asyncq"]
            self.dead = self._dbs[b"dead"]
            self.prepared = self._dbs[b"prepared"]
            self.results = self._dbs[b"results"]
            # Created on open when missing, so a store written before it existed opens too.
            self.dtx = self._dbs[b"dtx"]
            # Bumped by the group committer after every LMDB commit (before any lock
            # is released): a reader that saw the same value before a read and after
            # taking a lock knows its read is still current.
            self.commit_seq = 0
            self._counter_lock = threading.Lock()
            self._next_counter, self._reserved_until = self._reserve_counters(None)
        except BaseException:
            if getattr(self, "env", None) is not None:
                self.env.close()
            os.close(self._lock_fd)
            raise

    # ------------------------------------------------------------ opening
    def _lock_directory(self) -> int:
        lock_path = self.path / "LOCK"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = ""
            try:
                owner = os.pread(fd, 32, 0).decode().strip()
            finally:
                os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StoreLocked(
                    f"store {self.path} is already open in another process"
                    + (f" (pid {owner})" if owner else "")
                ) from None
            raise StoreError(f"cannot lock {lock_path}: {exc.strerror}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _open_env(self, durable: bool, map_size: int) -> lmdb.Environment:
        data = self.path / "data.mdb"
        if data.exists() and data.stat().st_size and data.stat().st_size < 8192:
            raise CorruptStore(f"{data} is truncated ({data.stat().st_size} bytes)")
        size = data.stat().st_size if data.exists() else 0
        try:
            env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=512,
                sync=durable,
                metasync=durable,
                readahead=False,
                max_readers=1024,
                lock=True,
            )
        except lmdb.InvalidError as exc:
            raise CorruptStore(
                f"{self.path} is not a valid nonstop store (damaged file): {exc}"
            ) from exc
        except lmdb.CorruptedError as exc:
            raise CorruptStore(f"{self.path} is corrupted: {exc}") from exc
        except lmdb.VersionMismatchError as exc:
            raise IncompatibleStore(
                f"{self.path} was written by another LMDB version: {exc}"
            ) from exc
        except lmdb.Error as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        # A file shorter than its own pages would crash the process (SIGBUS) on first read.
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        if size and size < needed:
            env.close()
            raise CorruptStore(f"{data} is truncated ({size} bytes; its pages need {needed})")
        return env

    def _check_format(self, txn: lmdb.Transaction, location: int | None) -> None:
        meta = self._dbs[b"meta"]
        raw = txn.get(b"format", db=meta)
        if raw is None:
            if txn.stat(self._dbs[b"objects"])["entries"]:
                raise IncompatibleStore(f"{self.path} holds data but no nonstop format marker")
            foreign = [k for k in txn.cursor().iternext(values=False) if k not in self._dbs]
            if foreign:
                raise IncompatibleStore(
                    f"{self.path} holds an LMDB database that is not a nonstop store "
                    f"(it has {bytes(foreign[0])!r} and no nonstop format marker)"
                )
            txn.put(b"format", pack([FORMAT_NAME, FORMAT_VERSION]), db=meta)
            txn.put(
                b"location",
                pack(location if location is not None else secrets.randbits(63)),
                db=meta,
            )
            txn.put(b"timestamp", pack(int(time.time())), db=meta)
            txn.put(b"counter", pack(0), db=meta)
            return
        try:
            name, version = unpack(bytes(raw))
        except Exception:
            raise CorruptStore(f"{self.path}: unreadable format marker") from None
        if name != FORMAT_NAME:
            raise IncompatibleStore(f"{self.path} is a {name!r} store, not a nonstop store")
        if version > FORMAT_VERSION:
            raise IncompatibleStore(
                f"{self.path} was written by a newer nonstop (store format {version}; "
                f"this version reads up to {FORMAT_VERSION})"
            )
        if version < FORMAT_VERSION:
            if any(txn.stat(self._dbs[n])["entries"] for n in (b"objects", b"prepared")):
                # Format 1 records carry no checksum: reading them as format 2 would
                # report every one as damaged, and reading them unchecked is what
                # format 2 exists to end.  (No release shipped format 1 data.)
                raise IncompatibleStore(
                    f"{self.path} is store format {version} (records without checksums); "
                    f"this version reads format {FORMAT_VERSION}: dump it with the nonstop "
                    "that wrote it and load it into a new store"
                )
            txn.put(b"format", pack([FORMAT_NAME, FORMAT_VERSION]), db=meta)

    def _meta(self, txn: lmdb.Transaction, key: bytes) -> bytes:
        """A value of the store's ``meta`` table, which every opened store has."""
        raw = txn.get(key, db=self.meta)
        if raw is None:
            raise CorruptStore(f"{self.path}: the store's {key.decode()} is missing")
        return bytes(raw)

    @property
    def location(self) -> int:
        with self.env.begin() as txn:
            return int(unpack(self._meta(txn, b"location")))

    @property
    def timestamp(self) -> int:
        with self.env.begin() as txn:
            return int(unpack(self._meta(txn, b"timestamp")))

    # --------------------------------------------------------- references
    def _reserve_counters(self, _: None) -> tuple[int, int]:
        """Durably reserve the next block of counters.  A crash skips the unused rest."""
        with self.env.begin(write=True) as txn:
            start = int(unpack(self._meta(txn, b"counter")))
            txn.put(b"counter", pack(start + COUNTER_BLOCK), db=self.meta)
            loc = int(unpack(self._meta(txn, b"location")))
            ts = int(unpack(self._meta(txn, b"timestamp")))
        self._ref_prefix = Ref.make(loc, ts, 0).raw[:12]
        return start + 1, start + COUNTER_BLOCK

    def new_ref(self) -> bytes:
        with self._counter_lock:
            if self._next_counter > self._reserved_until:
                self._next_counter, self._reserved_until = self._reserve_counters(None)
            counter = self._next_counter
            self._next_counter += 1
        return self._ref_prefix + _U64.pack(counter)

    def new_refs(self, n: int) -> list[bytes]:
        """``n`` new references at once (a bulk write's new objects): one lock, no call each."""
        out: list[bytes] = []
        with self._counter_lock:
            while len(out) < n:
                if self._next_counter > self._reserved_until:
                    self._next_counter, self._reserved_until = self._reserve_counters(None)
                first = self._next_counter
                last = min(self._reserved_until, first + n - len(out) - 1)
                prefix, u64 = self._ref_prefix, _U64.pack
                out.extend([prefix + u64(c) for c in range(first, last + 1)])
                self._next_counter = last + 1
        return out

    # ------------------------------------------------------------ indexes
    def db_by_name(self, name: bytes) -> Any:
        """An LMDB database by name (index databases must exist: see index_db)."""
        db = self._dbs.get(name)
        if db is None:
            raise KeyError(f"no database {name!r} in store {self.path}")
        return db

    def names(self) -> dict[int, bytes]:
        """id(database handle) -> name, to record operations durably by name."""
        return {id(handle): name for name, handle in self._dbs.items()}

    def is_dupsort(self, name: bytes) -> bool:
        """Whether the named database keeps several values per key (a non-unique index)."""
        with self.env.begin() as txn:
            return bool(self.db_by_name(name).flags(txn)["dupsort"])

    def index_db(self, name: bytes, *, unique: bool) -> Any:
        """The LMDB database of one index, created on first use."""
        db = self._dbs.get(name)
        if db is None:
            with self._db_lock:
                db = self._dbs.get(name)
                if db is None:
                    with self.env.begin(write=True) as txn:
                        db = self.env.open_db(
                            name, txn=txn, dupsort=not unique, dupfixed=not unique
                        )
                    self._dbs[name] = db
        return db

    def register_type(self, info: TypeInfo) -> dict[str, Any] | None:
        """Open the type's index databases and return its stored schema (None if new)."""
        for key in info.keys.values():
            self.index_db(key.db_name, unique=key.options.unique)
        with self.env.begin() as txn:
            raw = txn.get(info.name.encode(), db=self.types)
        return None if raw is None else unpack(raw)

    def save_schema(self, info: TypeInfo) -> None:
        with self.env.begin(write=True) as txn:
            txn.put(info.name.encode(), pack(info.schema()), db=self.types)

    # -------------------------------------------------------------- reads
    def read(self) -> lmdb.Transaction:
        """A read-only snapshot of everything committed (and durable) so far."""
        return self.env.begin(buffers=False)

    def read_buffers(self) -> lmdb.Transaction:
        """A read snapshot returning zero-copy buffers (valid only inside the transaction)."""
        return self.env.begin(buffers=True)

    def get_object(self, ref: bytes) -> list[Any] | None:
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(ref, db=self.objects)
            return None if raw is None else self.record(raw, ref)

    def record(self, raw: bytes | memoryview, ref: bytes | memoryview) -> Any:
        """The decoded object record ``raw`` read under ``ref``: CorruptRecord (naming this
        store's file, ``objects`` and the key) if it fails its checksum."""
        if _crc32(raw) != RESIDUE or len(raw) < CHECKSUM_BYTES:  # (read_record, inlined)
            raise corrupt(self.path, "objects", bytes(ref))
        return unpack(raw[:-CHECKSUM_BYTES])  # type: ignore[arg-type]  # msgpack takes buffers

    def record_payload(
        self, raw: bytes | memoryview, ref: bytes | memoryview
    ) -> bytes | memoryview:
        """The checked msgpack bytes of the object record ``raw`` (see :meth:`record`)."""
        return open_record(raw, path=self.path, key=ref)

    def sealed_payload(
        self, raw: bytes | memoryview, key: bytes | memoryview, database: str
    ) -> bytes | memoryview:
        """The checked payload of a sealed value of ``database`` (``prepared``): CorruptRecord
        naming this store's file, the database and the key if it fails its checksum."""
        return open_record(raw, path=self.path, database=database, key=key)

    def asyncq_get(self, key: bytes) -> bytes | None:
        with self.env.begin() as txn:
            return txn.get(key, db=self.asyncq)

    def count(self, type_name: str) -> int:
        with self.env.begin() as txn:
            raw = txn.get(type_name.encode(), db=self.counts)
        return 0 if raw is None else _U64.unpack(raw)[0]

    def iter_extent(self, txn: lmdb.Transaction, type_name: str) -> Iterator[bytes]:
        prefix = type_name.encode() + b"\x00"
        # Any: lmdb's stubs type reads as bytes | memoryview; our environments read bytes.
        cur: Any = txn.cursor(db=self.extents)
        if not cur.set_range(prefix):
            return
        plen = len(prefix)
        for key in cur.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            yield key[plen:]

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            os.close(self._lock_fd)
