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
``counts``     type name + 0x00 + location (8 bytes)            8-byte count (A2 cardinality,
                                                                per location)
``seqs``       location (8 bytes) + epoch (4 bytes)             8-byte highest counter that
                                                                may have been handed out
``types``      type name                                        msgpack schema (E1/E2)
``ix:T:f``     order-preserving key value                       ref (dupsort when non-unique)
``asyncq``     target ref + priority byte + 8-byte sequence     msgpack call (A6) or timer (D20)
``dead``       8-byte sequence                                  msgpack failed async call
``prepared``   global transaction id                            msgpack prepared write set
                                                                and locks + crc32 (2PC)
``results``    client id + 0x00 + 8-byte sequence               msgpack request result (H1)
``dtx``        ``dtx/...`` (the decision protocol's own keys)   its values (opaque here):
                                                                committed together with the
                                                                prepared records (2PC)
=============  ===============================================  =========================

A reference's first 8 bytes are its location code (:mod:`nonstop.model.ref`): a
partition, or this store's own location by default.  So the objects of one
location are one key range of ``objects`` (:meth:`Store.scan_location`), and
counts are kept per (type, location) so that a count restricted to some
locations (the partitions this node is active for) reads a few keys.  New
references of a (location, epoch) take counters from ``seqs``, reserved in
blocks of :data:`COUNTER_BLOCK`.

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
from collections.abc import Collection, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lmdb

from nonstop.errors import BadArgument, CorruptStore, IncompatibleStore, StoreError, StoreLocked
from nonstop.model.codec import pack, unpack
from nonstop.model.managed import TypeInfo
from nonstop.model.ref import (
    COUNTER_BITS,
    LOCATION_BYTES,
    MAX_COUNTER,
    check_epoch,
    check_location,
    location_prefix,
)
from nonstop.store.records import CHECKSUM_BYTES, RESIDUE, corrupt, open_record

FORMAT_NAME = "nonstop-store"
FORMAT_VERSION = 3
"""2: object records carry a CRC-32 (store/records.py).  3: a reference's location names a
partition, its sequence is (epoch << 40) | counter with counters per (location, epoch)
in ``seqs``, and counts are per (type, location)."""
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
                    b"seqs",
                ):
                    self._dbs[name] = self.env.open_db(name, txn=txn)
                self._check_format(txn, location)
                self._open_existing(txn)
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
            self.seqs = self._dbs[b"seqs"]
            # Bumped by the group committer after every LMDB commit (before any lock
            # is released): a reader that saw the same value before a read and after
            # taking a lock knows its read is still current.
            self.commit_seq = 0
            self._counter_lock = threading.Lock()
            with self.env.begin() as txn:
                self._location = int(unpack(self._meta(txn, b"location")))
                self._timestamp = int(unpack(self._meta(txn, b"timestamp")))
            self._counters: dict[tuple[int, int], _Counter] = {}
            self._own = self._counter(self._location, 0)
            with self._counter_lock:
                self._reserve(self._own)  # fail at open, not at the first create
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

    def _open_existing(self, txn: lmdb.Transaction) -> None:
        """Open every database the file already has (indexes, ``bulk``) at once.

        LMDB lets a read transaction use only the handles opened before it began, so a
        snapshot transaction's pinned view (tx/transaction.py ``committed``) could not
        read an index whose handle a later first touch of its type opened. The names of
        a file's databases are the keys of its unnamed database; opening an existing one
        without flags adopts the flags it was created with."""
        with txn.cursor() as cursor:
            names = [bytes(key) for key in cursor.iternext(values=False)]
        for name in names:
            if name not in self._dbs:
                self._dbs[name] = self.env.open_db(name, txn=txn, create=False)

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
                raise IncompatibleStore(_old_format_message(self.path, version))
            # An empty older store is upgraded in place: its references so far (format 1
            # and 2 kept one counter in meta) continue as epoch 0 of its own location.
            raw_counter = txn.get(b"counter", db=meta)
            if raw_counter is not None:
                raw_location = txn.get(b"location", db=meta)
                if raw_location is None:
                    raise CorruptStore(f"{self.path}: the store's location is missing")
                own = int(unpack(bytes(raw_location)))
                counter = int(unpack(bytes(raw_counter)))
                txn.put(_seq_key(own, 0), _U64.pack(counter), db=self._dbs[b"seqs"])
                txn.delete(b"counter", db=meta)
            for old_key in list(txn.cursor(db=self._dbs[b"counts"]).iternext(values=False)):
                txn.delete(old_key, db=self._dbs[b"counts"])  # (all zero: no objects)
            txn.put(b"format", pack([FORMAT_NAME, FORMAT_VERSION]), db=meta)

    def _meta(self, txn: lmdb.Transaction, key: bytes) -> bytes:
        """A value of the store's ``meta`` table, which every opened store has."""
        raw = txn.get(key, db=self.meta)
        if raw is None:
            raise CorruptStore(f"{self.path}: the store's {key.decode()} is missing")
        return bytes(raw)

    @property
    def location(self) -> int:
        """This store's own location code (references of plain creates start with it)."""
        return self._location

    @property
    def timestamp(self) -> int:
        return self._timestamp

    # --------------------------------------------------------- references
    def _counter(self, location: int | None, epoch: int) -> _Counter:
        """The counter state of (location, epoch) (checked; this store's own if None)."""
        if location is None:
            if not epoch:
                return self._own
            location = self._location
        counter = self._counters.get((location, epoch))
        if counter is None:
            counter = _Counter(check_location(location), check_epoch(epoch), self._timestamp)
            with self._counter_lock:
                counter = self._counters.setdefault((location, epoch), counter)
        return counter

    def _reserve(self, c: _Counter) -> None:
        """Durably reserve the next block of counters of ``c`` (caller holds the counter lock).
        A crash skips the unused rest of the block; a counter is never handed out twice."""
        with self.env.begin(write=True) as txn:
            raw = txn.get(c.key, db=self.seqs)
            start = max(0 if raw is None else _U64.unpack(raw)[0], c.next - 1)
            if start >= MAX_COUNTER:
                raise StoreError(
                    f"location {c.location:016x} epoch {c.epoch} has used all 2**{COUNTER_BITS} "
                    "counters of its references (a failover starts a new epoch)"
                )
            until = min(start + COUNTER_BLOCK, MAX_COUNTER)
            txn.put(c.key, _U64.pack(until), db=self.seqs)
        c.next, c.until = start + 1, until

    def new_ref(self, location: int | None = None, epoch: int = 0) -> bytes:
        """A new reference of ``location`` at ``epoch``: sequence ``(epoch << 40) | counter``,
        never handed out before (module doc).  ``location`` None: this store's own, with
        its timestamp in the middle (a plain create, as before format 3); else the middle
        is zero, so a partition's references name no node and sort in creation order."""
        c = self._own if location is None and not epoch else self._counter(location, epoch)
        with self._counter_lock:
            if c.next > c.until:
                self._reserve(c)
            counter = c.next
            c.next += 1
        return (c.prefix if location is None else c.bare) + _U64.pack(c.base | counter)

    def new_refs(self, n: int, location: int | None = None, epoch: int = 0) -> list[bytes]:
        """``n`` new references at once (a bulk write's new objects): one lock, no call each."""
        c = self._own if location is None and not epoch else self._counter(location, epoch)
        out: list[bytes] = []
        with self._counter_lock:
            while len(out) < n:
                if c.next > c.until:
                    self._reserve(c)
                first = c.next
                last = min(c.until, first + n - len(out) - 1)
                prefix = c.prefix if location is None else c.bare
                u64, base = _U64.pack, c.base
                out.extend([prefix + u64(base | k) for k in range(first, last + 1)])
                c.next = last + 1
        return out

    def counter_floor(self, txn: lmdb.Transaction, location: int, epoch: int) -> int:
        """The highest counter of (location, epoch) that may have been handed out or applied,
        as ``txn`` (a read or the caller's write) and this process know it."""
        raw = txn.get(_seq_key(location, epoch), db=self.seqs)
        durable = 0 if raw is None else int(_U64.unpack(raw)[0])
        c = self._counters.get((location, epoch))
        return durable if c is None else max(durable, c.next - 1)

    def note_counter(self, location: int, epoch: int, counter: int) -> None:
        """A reference of (location, epoch) with ``counter`` exists (a replica applied it):
        never hand out that counter or a lower one from this process."""
        c = self._counters.get((location, epoch))
        if c is not None:
            with self._counter_lock:
                c.next = max(c.next, counter + 1)

    def seq_op(self, location: int, epoch: int, counter: int) -> tuple[bool, Any, bytes, bytes]:
        """The write-set put that records ``counter`` as used in ``seqs`` (for a replica apply,
        committed with the objects it creates)."""
        return (True, self.seqs, _seq_key(location, epoch), _U64.pack(counter))

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

    def get_object(self, ref: bytes, view: lmdb.Transaction | None = None) -> list[Any] | None:
        """The committed record of ``ref``: as of the read ``view`` if given, else the latest."""
        if view is not None:
            raw = view.get(ref, db=self.objects)
            return None if raw is None else self.record(raw, ref)
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

    def count(
        self,
        type_name: str,
        locations: Collection[bytes] | None = None,
        view: lmdb.Transaction | None = None,
    ) -> int:
        """The committed number of objects of exactly ``type_name`` (A2): all of them, or those
        of the given locations (8-byte prefixes: :func:`~nonstop.model.ref.location_prefix`);
        as of the read ``view`` if given (a snapshot transaction's), else the latest."""
        prefix = type_name.encode() + b"\x00"
        total = 0
        with self.env.begin() if view is None else nullcontext(view) as txn:
            if locations is not None:
                for loc in locations:
                    raw = txn.get(prefix + loc, db=self.counts)
                    if raw is not None:
                        total += _U64.unpack(raw)[0]
                return total
            cur: Any = txn.cursor(db=self.counts)
            if not cur.set_range(prefix):
                return 0
            for key, raw in cur.iternext():
                if not key.startswith(prefix):
                    break
                total += _U64.unpack(raw)[0]
        return total

    def scan_location(
        self, txn: lmdb.Transaction, location: int, after: bytes | None, limit: int
    ) -> tuple[list[tuple[bytes, Any]], bytes | None]:
        """Up to ``limit`` objects of ``location`` in reference order, after reference ``after``
        (None: from the first): ``([(ref, decoded record), ...], resume)``; ``resume`` is the
        last reference returned (pass it as ``after``), None once the location is exhausted."""
        prefix = location_prefix(location)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise BadArgument(f"a scan's batch size is a positive int, got {limit!r:.40}")
        if after is not None and (len(after) != 20 or not after.startswith(prefix)):
            raise BadArgument(
                f"a resume key of location {location:016x} is one of its references, "
                f"got {bytes(after).hex()[:48]}"
            )
        out: list[tuple[bytes, Any]] = []
        cur: Any = txn.cursor(db=self.objects)
        if not cur.set_range(prefix if after is None else after):
            return out, None
        for ref, raw in cur.iternext():
            if not ref.startswith(prefix):
                return out, None
            if ref == after:
                continue
            if len(out) >= limit:
                return out, out[-1][0] if out else None
            out.append((bytes(ref), self.record(raw, ref)))
        return out, None

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


def _seq_key(location: int, epoch: int) -> bytes:
    """The ``seqs`` key of (location, epoch): their counters sort together per location."""
    return location.to_bytes(LOCATION_BYTES, "big") + epoch.to_bytes(4, "big")


def count_key(type_name: bytes, ref: bytes) -> bytes:
    """The ``counts`` key (and count-delta key of a write set) of an object of ``type_name``
    at ``ref``: type name, 0x00, the reference's location."""
    return type_name + b"\x00" + ref[:LOCATION_BYTES]


class _Counter:
    """The counters of one (location, epoch) in this process: next to hand out, reserved
    durably up to ``until``; ``prefix`` + 8-byte ``base | counter`` is a plain create's
    reference (the store's timestamp in the middle), ``bare`` + the same a reference
    created into a given location (zero in the middle: no node in it)."""

    __slots__ = ("bare", "base", "epoch", "key", "location", "next", "prefix", "until")

    def __init__(self, location: int, epoch: int, timestamp: int) -> None:
        self.location = location
        self.epoch = epoch
        self.key = _seq_key(location, epoch)
        self.prefix = location.to_bytes(LOCATION_BYTES, "big") + timestamp.to_bytes(4, "big")
        self.bare = location.to_bytes(LOCATION_BYTES, "big") + bytes(4)
        self.base = epoch << COUNTER_BITS
        self.next = 1
        self.until = 0


def _old_format_message(path: Path, version: int) -> str:
    what = (
        "records without checksums"
        if version < 2
        else "references that name the creating node, not a partition"
    )
    return (
        f"{path} is store format {version} ({what}); this version reads format "
        f"{FORMAT_VERSION}: export its types with the nonstop that wrote it (nonstop pipeline "
        "export) and import them into a new store"
    )
