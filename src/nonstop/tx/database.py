"""An embedded, single-node nonstop database: ``nonstop.open(path)``.

The database makes the :class:`~nonstop.tx.engine.Engine` a transaction runs
against — the LMDB store, the group committer (the single writer), the lock
table, the prepared transactions — and the asynchronous-method dispatcher,
and hands out transactions.  ``db.transaction()`` works with ``with``
(threads) and with ``async with`` (asyncio tasks).

Also importable as ``nonstop.database`` (and ``nonstop.open``/``nonstop.Database``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from nonstop.errors import BadArgument
from nonstop.model.codec import unpack
from nonstop.store.lmdb_store import DEFAULT_MAP_SIZE
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.asyncmethods import AsyncDispatcher
from nonstop.tx.engine import Engine
from nonstop.tx.entries import Isolation
from nonstop.tx.prepared import InDoubt, recover_prepared
from nonstop.tx.transaction import Transaction

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
        self._db.engine.check_open()
        self._tx = Transaction(self._db, self._isolation, self._lock_timeout)
        self._tx.rank_from(time.monotonic())
        return self._tx  # type: ignore[no-any-return]

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._tx.__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> AsyncTransaction:
        self._db.engine.check_open()
        self._tx = AsyncTransaction(self._db, self._isolation, self._lock_timeout)
        self._tx.rank_from(time.monotonic())
        return self._tx  # type: ignore[no-any-return]

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self._tx.__aexit__(exc_type, exc, tb)


class Database:
    """An open nonstop store.  Thread-safe and usable from many asyncio tasks.

    ``engine`` is what its transactions run against (:mod:`nonstop.tx.engine`):
    for nonstop's own bulk operations and two-phase-commit participant, not
    needed by applications.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "fsync",
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
        async_workers: int = 2,
        map_size: int = DEFAULT_MAP_SIZE,
        hold_async: bool = False,
    ) -> None:
        if durability not in DURABILITY_MODES:
            raise BadArgument(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if async_workers < 1:
            raise BadArgument("async_workers must be >= 1")
        self.path = os.fspath(path)
        self.durability = durability
        self.lock_timeout = lock_timeout
        self.engine = Engine(path, durable=durability == "fsync", map_size=map_size)
        try:
            recover_prepared(self.engine)
            self.engine.attach_dispatcher(
                AsyncDispatcher(self, workers=async_workers, held=hold_async)
            )
        except BaseException:
            # Do not keep the store (and its directory lock) open behind a failed open.
            self.engine.close()
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
        self.engine.check_open()
        return self.engine.dispatcher.wait_idle(timeout)

    def dead_letters(self) -> list[dict[str, Any]]:
        """Asynchronous calls that failed with a non-retryable error (newest last)."""
        self.engine.check_open()
        store = self.engine.store
        out = []
        with store.read() as rtxn:
            for _, raw in rtxn.cursor(db=store.dead):
                target, (method, args, kwargs, _), error, when = unpack(bytes(raw))
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
        return self.engine.prepared.gtids()

    def resolve(self, gtid: bytes, commit: bool) -> bool:
        """Apply a two-phase-commit outcome to the prepared transaction ``gtid``.

        Idempotent, as a participant must be: False when ``gtid`` is not in doubt
        here (already resolved, or never prepared), True when this call ended it.
        """
        self.engine.check_open()
        tx = self.engine.prepared.get(gtid)
        if tx is None:
            return False
        if commit:
            tx.commit_prepared()
        else:
            tx.abort_prepared()
        return True

    def object_count(self) -> int:
        """How many objects the store holds, of every type (its ``objects`` table)."""
        store = self.engine.store
        with store.read() as txn:
            return int(txn.stat(store.objects)["entries"])

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: group commit sizes, async method outcomes."""
        c = self.engine.committer.stats
        d = self.engine.dispatcher
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
        return self.engine.store.location

    @property
    def closed(self) -> bool:
        return self.engine.closed

    def close(self) -> None:
        """Finish running async calls and queued commits, then close.  Idempotent."""
        if not self.engine.closed:
            self.engine.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nonstop.Database {self.path!r}{' closed' if self.closed else ''}>"

    # ------------------------------------------------------ during the move


def open(path: str | os.PathLike[str], **options: Any) -> Database:
    """Open (creating if needed) the nonstop store in directory ``path``.

    Options: ``durability`` (``"fsync"`` default: a commit returns once on disk;
    ``"none"``: survives a process crash, not an OS crash), ``lock_timeout``
    (seconds, default 60), ``async_workers`` (threads running asynchronous
    methods, default 2), ``map_size`` (bytes of address space for the store),
    ``hold_async`` (run no queued call until a gate is attached: a node whose
    partitions replicate, ``nonstop.node.replicated_calls``).
    """
    return Database(path, **options)


__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DURABILITY_MODES",
    "Database",
    "InDoubt",
    "TransactionContext",
    "open",
]
