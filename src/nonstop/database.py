"""An embedded, single-node nonstop database: ``nonstop.open(path)``.

The database owns the pieces a transaction uses — the LMDB store, the group
committer (the single writer), the lock table and the asynchronous-method
dispatcher — and hands out transactions.  ``db.transaction()`` works with
``with`` (threads) and with ``async with`` (asyncio tasks).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from nonstop.errors import BadArgument, DatabaseClosed, StoreError, TypeVersionMismatch
from nonstop.model.codec import pack, unpack
from nonstop.model.managed import Managed, TypeInfo, lookup_type, type_info
from nonstop.store.group_commit import GroupCommitter, WriteSet
from nonstop.store.lmdb_store import DEFAULT_MAP_SIZE, Store
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.asyncmethods import AsyncDispatcher
from nonstop.tx.locks import LockMode
from nonstop.tx.transaction import Isolation, Transaction, _txn_ids
from nonstop.tx.waiting import LockTable

DURABILITY_MODES = ("fsync", "none")
DEFAULT_LOCK_TIMEOUT = 60.0


class TransactionContext:
    """What ``db.transaction()`` returns: enter it with ``with`` or ``async with``."""

    __slots__ = ("_db", "_isolation", "_lock_timeout", "_tx")

    def __init__(self, db: Database, isolation: Isolation, lock_timeout: float | None) -> None:
        self._db = db
        self._isolation = isolation
        self._lock_timeout = lock_timeout
        self._tx: Any = None

    def __enter__(self) -> Transaction:
        self._db._check_open()
        self._tx = Transaction(self._db, self._isolation, self._lock_timeout)
        return self._tx  # type: ignore[no-any-return]

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._tx.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> AsyncTransaction:
        self._db._check_open()
        self._tx = AsyncTransaction(self._db, self._isolation, self._lock_timeout)
        return self._tx  # type: ignore[no-any-return]

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self._tx.__aexit__(exc_type, exc, tb)


class Database:
    """An open nonstop store.  Thread-safe and usable from many asyncio tasks."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "fsync",
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        async_workers: int = 2,
        map_size: int = DEFAULT_MAP_SIZE,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise BadArgument(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if async_workers < 1:
            raise BadArgument("async_workers must be >= 1")
        self.path = os.fspath(path)
        self.durability = durability
        self.lock_timeout = lock_timeout
        self._closed = False
        self._store = Store(path, durable=durability == "fsync", map_size=map_size)
        self._types: dict[str, TypeInfo] = {}
        self._types_lock = threading.Lock()
        self._locks = LockTable()
        self._committer = GroupCommitter(self._store)
        # Prepared (phase-one) transactions awaiting their outcome, by global id.
        self._in_doubt: dict[bytes, Transaction | InDoubt] = {}
        # Prepared write sets computed but not yet durable, by global id, for a caller
        # that commits the prepared record together with its own keys
        # (nonstop.dataplane.participant): the transaction and its prepared record's write set.
        self._preparing: dict[bytes, tuple[Transaction, WriteSet]] = {}
        try:
            self._recover_prepared()
            self._dispatcher = AsyncDispatcher(self, workers=async_workers)
        except BaseException:
            # Do not keep the store (and its directory lock) open behind a failed open.
            self._committer.close()
            self._store.close()
            raise

    # ----------------------------------------------------------- public API
    def transaction(
        self, isolation: str = "serializable", *, lock_timeout: float | None = None
    ) -> TransactionContext:
        """A new transaction: ``with db.transaction() as tx`` or ``async with ...``.

        ``isolation``: ``"serializable"`` (default) or ``"snapshot"`` (read-committed
        snapshot).  ``lock_timeout``: seconds to wait for a lock before
        :class:`~nonstop.errors.LockTimeout` (default: the database's).
        """
        try:
            iso = Isolation(isolation)
        except ValueError:
            raise BadArgument(
                f"isolation must be 'serializable' or 'snapshot', not {isolation!r}"
            ) from None
        return TransactionContext(
            self, iso, self.lock_timeout if lock_timeout is None else lock_timeout
        )

    def wait_for_async(self, timeout: float = 30.0) -> bool:
        """Wait until every queued asynchronous method has run; False on timeout."""
        self._check_open()
        return self._dispatcher.wait_idle(timeout)

    def dead_letters(self) -> list[dict[str, Any]]:
        """Asynchronous calls that failed with a non-retryable error (newest last)."""
        self._check_open()
        out = []
        with self._store.read() as rtxn:
            for _, raw in rtxn.cursor(db=self._store.dead):
                target, (method, args, kwargs, _), error, when = unpack(raw)
                out.append(
                    {
                        "target": target,
                        "method": method,
                        "args": args,
                        "kwargs": kwargs,
                        "error": error,
                        "time": when,
                    }
                )
        return out

    def in_doubt(self) -> list[bytes]:
        """Global ids of prepared transactions still waiting for their outcome (B9)."""
        return sorted(self._in_doubt)

    def resolve(self, gtid: bytes, commit: bool) -> bool:
        """Apply a two-phase-commit outcome to the prepared transaction ``gtid``.

        Idempotent, as a participant must be: False when ``gtid`` is not in doubt
        here (already resolved, or never prepared), True when this call ended it.
        """
        self._check_open()
        tx = self._in_doubt.get(gtid)
        if tx is None:
            return False
        if commit:
            tx.commit_prepared()
        else:
            tx.abort_prepared()
        return True

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: group commit sizes, async method outcomes."""
        c = self._committer.stats
        d = self._dispatcher
        return {
            "commit_groups": c.groups,
            "commits": c.commits,
            "largest_group": c.largest_group,
            "async_pending": d.pending(),
            "async_executed": d.executed,
            "async_dropped": d.dropped,
            "async_failed": d.failed,
        }

    @property
    def location(self) -> int:
        """This store's location code (C1)."""
        return self._store.location

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Finish running async calls and queued commits, then close.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._dispatcher.close()
        self._committer.close()
        self._store.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nonstop.Database {self.path!r}{' closed' if self._closed else ''}>"

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise DatabaseClosed(f"database {self.path!r} is closed")

    def _ensure_type(self, cls: type[Managed]) -> TypeInfo:
        """Resolve a managed class and make sure the store knows it (indexes, schema)."""
        info = type_info(cls)
        if self._types.get(info.name) is info:
            return info
        with self._types_lock:
            if self._types.get(info.name) is not info:
                stored = self._store.register_type(info)
                if stored is not None and stored["version"] > info.version:
                    raise TypeVersionMismatch(
                        f"the store holds {info.name} version {stored['version']}; this process "
                        f"defines version {info.version}"
                    )
                if stored != info.schema():
                    self._store.save_schema(info)
                self._types[info.name] = info
        return info

    def _type_by_name(self, name: str) -> TypeInfo:
        info = self._types.get(name)
        if info is None:
            info = self._ensure_type(lookup_type(name).cls)
        return info

    def _index_get(self, key: Any, kb: bytes) -> bytes | None:
        db = self._store.index_db(key.db_name, unique=key.options.unique)
        with self._store.read() as rtxn:
            return rtxn.get(kb, db=db)  # type: ignore[no-any-return]

    def _prepared_record(self, ws: WriteSet, locks: dict[Any, Any]) -> bytes:
        """Encode a prepared write set and its locks by database *name*.

        Read locks are kept too (``rlocks``, absent when none, so older versions
        still read the record): a participant that restarts prepared must hold
        every lock it had until the outcome, or another transaction could slip in
        between its reads and the reads other participants are still making.
        """
        names = self._store.names()
        ops = [[is_put, names[id(db)], key, value] for is_put, db, key, value in ws.ops]
        index_names = {n for _, n, _, _ in ops if n.startswith(b"ix:")}
        uniques = {n: not self._store.is_dupsort(n) for n in index_names}
        held = [_lock_out(r) for r, mode in locks.items() if mode is LockMode.WRITE]
        record = {"ops": ops, "deltas": ws.count_deltas, "unique": uniques, "locks": held}
        read = [_lock_out(r) for r, mode in locks.items() if mode is LockMode.READ]
        if read:
            record["rlocks"] = read
        return pack(record)

    def _recover_prepared(self) -> None:
        """After a restart, prepared transactions come back in doubt, holding their locks."""
        store = self._store
        with store.read() as rtxn:
            records = list(rtxn.cursor(db=store.prepared))
        for gtid, raw in records:
            rec = unpack(raw)
            for name, unique in rec["unique"].items():
                store.index_db(name, unique=unique)
            ops = [(p, store.db_by_name(n), k, v) for p, n, k, v in rec["ops"]]
            doubt = InDoubt(self, bytes(gtid), WriteSet(ops, rec["deltas"]))
            wanted = [(lock, LockMode.WRITE) for lock in rec["locks"]]
            wanted += [(lock, LockMode.READ) for lock in rec.get("rlocks", ())]
            for lock, mode in wanted:
                if not self._locks.try_acquire(doubt.id, _lock_in(lock), mode):
                    raise StoreError(f"prepared transaction {gtid!r} conflicts with another")
            self._in_doubt[doubt.gtid] = doubt

    def _async_key(self, target: bytes, self_send: bool) -> bytes:
        return self._dispatcher.next_key(target, self_send)

    def _async_committed(self, keys: list[bytes]) -> None:
        self._dispatcher.committed(keys)


def _lock_out(resource: Any) -> list[Any]:
    """A lock's resource for a prepared record: an object ref, or a key tuple."""
    return ["o", resource] if isinstance(resource, bytes) else ["k", *resource]


def _lock_in(lock: list[Any]) -> Any:
    return lock[1] if lock[0] == "o" else tuple(lock[1:])


class InDoubt:
    """A prepared transaction recovered after a restart: its write set and write locks.

    It can only be ended, by the two-phase-commit outcome: :meth:`commit_prepared`
    applies the write set, :meth:`abort_prepared` drops it (``db.resolve`` calls them).
    """

    def __init__(self, db: Database, gtid: bytes, ws: WriteSet) -> None:
        self.db = db
        self.gtid = gtid
        self.ws = ws
        self.id = next(_txn_ids)

    def _phase_two(self, commit: bool) -> WriteSet:
        """What phase two commits: the write set applied (commit) and the record dropped."""
        drop = (False, self.db._store.prepared, self.gtid, None)
        if commit:
            return WriteSet([*self.ws.ops, drop], dict(self.ws.count_deltas))
        return WriteSet([drop])

    def _phase_two_durable(self, commit: bool) -> None:
        """Phase two's write set is durable: no longer in doubt, locks released."""
        self.db._in_doubt.pop(self.gtid, None)
        self.db._locks.release_all(self.id)

    def commit_prepared(self) -> None:
        self.db._committer.commit(self._phase_two(True))
        self._phase_two_durable(True)

    def abort_prepared(self) -> None:
        self.db._committer.commit(self._phase_two(False))
        self._phase_two_durable(False)


def open(path: str | os.PathLike[str], **options: Any) -> Database:
    """Open (creating if needed) the nonstop store in directory ``path``.

    Options: ``durability`` (``"fsync"`` default: a commit returns once on disk;
    ``"none"``: survives a process crash, not an OS crash), ``lock_timeout``
    (seconds, default 60), ``async_workers`` (threads running asynchronous
    methods, default 2), ``map_size`` (bytes of address space for the store).
    """
    return Database(path, **options)
