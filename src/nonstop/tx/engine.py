"""The transaction engine: what transactions run against, one per open database.

:class:`Engine` holds the pieces a transaction needs and nothing else:

* ``store`` — the LMDB store (:class:`~nonstop.store.lmdb_store.Store`): reads
  of committed state, named databases, new references (in the store's own
  location, or in a partition's at an epoch: ``store.new_ref(location, epoch)``);
* ``locks`` — the lock table (:class:`~nonstop.tx.waiting.LockTable`);
* ``slices`` — where a large ended transaction's cleanup runs, a slice at a time
  (:mod:`nonstop.tx.loop_slices`);
* ``committer`` — the group committer, the store's single writer;
* ``prepared`` — the prepared (two-phase-commit) transactions
  (:class:`~nonstop.tx.prepared.PreparedTable`), and ``commit_journal``, the
  recent ones prepared and applied (:mod:`nonstop.tx.commit_journal`);
* the managed types the store knows (:meth:`ensure_type`, :meth:`type_by_name`);
* ``dispatcher`` — the asynchronous-method dispatcher, which queued calls are
  handed to once their transaction commits;
* whether it is open (:meth:`check_open`, ``closed``).

:class:`~nonstop.tx.database.Database` makes one and hands it to every
transaction (``tx.engine``); bulk operations (:mod:`nonstop.bulk`) and the
store's two-phase-commit participant (:mod:`nonstop.dataplane.participant`)
use it through ``db.engine``.  It is the one seam between a transaction and
the store: nobody reaches into the database's or the transaction's privates.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import TYPE_CHECKING, Any, cast

from nonstop.errors import DatabaseClosed, StoreError, TypeVersionMismatch
from nonstop.model.managed import KeyInfo, Managed, TypeInfo, lookup_type, type_info
from nonstop.store.group_commit import GroupCommitter
from nonstop.store.lmdb_store import Store
from nonstop.tx.commit_journal import CommitJournal
from nonstop.tx.loop_slices import SliceRunner
from nonstop.tx.prepared import PreparedTable
from nonstop.tx.type_gate import Gate
from nonstop.tx.waiting import LockTable

if TYPE_CHECKING:
    from nonstop.tx.asyncmethods import AsyncDispatcher

# Transaction ids are unique in the process (not only per store): they name
# lock owners and show up in messages, and several stores may share a process.
_transaction_ids = itertools.count(1)


def next_transaction_id() -> int:
    """A new transaction id, unique in this process."""
    return next(_transaction_ids)


class Engine:
    """The store, locks, committer, types and in-doubt table of one open database (module doc)."""

    def __init__(self, path: str | os.PathLike[str], *, durable: bool, map_size: int) -> None:
        self.path = os.fspath(path)
        self.store = Store(path, durable=durable, map_size=map_size)
        self.slices = SliceRunner()
        """Cleanup of a large ended transaction (its locks, its entries), a slice per turn
        of the node's loop once the node homes it there (:mod:`nonstop.tx.loop_slices`)."""
        self.locks = LockTable(slices=self.slices)
        self.committer = GroupCommitter(self.store)
        self.prepared = PreparedTable()
        self.commit_journal = CommitJournal()
        """Recent two-phase branches prepared and applied here, for cluster snapshots
        (:mod:`nonstop.tx.commit_journal`)."""
        self.gates: dict[str, Gate] = {}
        """Types a bulk swap keeps closed while it applies (:mod:`nonstop.tx.type_gate`)."""
        self.closed = False
        """Set by :meth:`close`; transactions stop once the committer is closing too."""
        self._types: dict[str, TypeInfo] = {}
        self._types_lock = threading.Lock()
        self._dispatcher: AsyncDispatcher | None = None

    new_transaction_id = staticmethod(next_transaction_id)

    # --------------------------------------------------------------- types
    def ensure_type(self, cls: type[Managed]) -> TypeInfo:
        """Resolve a managed class and make sure the store knows it (indexes, schema)."""
        info = type_info(cls)
        if self._types.get(info.name) is info:
            return info
        with self._types_lock:
            if self._types.get(info.name) is not info:
                stored = self.store.register_type(info)
                if stored is not None and stored["version"] > info.version:
                    raise TypeVersionMismatch(
                        f"the store holds {info.name} version {stored['version']}; this process "
                        f"defines version {info.version}"
                    )
                if stored != info.schema():
                    self.store.save_schema(info)
                self._types[info.name] = info
        return info

    def type_by_name(self, name: str) -> TypeInfo:
        """The managed type stored under ``name`` (importing its module if needed)."""
        info = self._types.get(name)
        if info is None:
            info = self.ensure_type(lookup_type(name).cls)
        return info

    # ------------------------------------------------------ committed reads
    def index_get(self, key: KeyInfo, kb: bytes) -> bytes | None:
        """The committed reference under value ``kb`` of unique ``key`` (no lock taken)."""
        db = self.store.index_db(key.db_name, unique=key.options.unique)
        with self.store.read() as rtxn:  # (not a buffers read: values are bytes)
            return cast("bytes | None", rtxn.get(kb, db=db))

    def get_raw(self, db: Any, key: bytes) -> bytes | None:
        """A committed record of an engine database (``asyncq``, ``results``, ``bulk``...)."""
        with self.store.read() as rtxn:
            return cast("bytes | None", rtxn.get(key, db=db))

    # ------------------------------------------------- asynchronous methods
    @property
    def dispatcher(self) -> AsyncDispatcher:
        """Where committed asynchronous calls go (see :mod:`nonstop.tx.asyncmethods`)."""
        if self._dispatcher is None:
            raise StoreError(f"the store {self.path!r} runs no asynchronous methods yet")
        return self._dispatcher

    def attach_dispatcher(self, dispatcher: AsyncDispatcher) -> None:
        """Hand queued asynchronous calls to ``dispatcher`` (it runs transactions on this engine,
        so the database makes it after the engine)."""
        self._dispatcher = dispatcher

    # ------------------------------------------------------------ lifecycle
    def check_open(self) -> None:
        """DatabaseClosed once :meth:`close` began."""
        if self.closed:
            raise DatabaseClosed(f"database {self.path!r} is closed")

    def close(self) -> None:
        """Finish running asynchronous calls and queued commits, then close the store.

        Transactions already running may still commit while the dispatcher
        finishes (its calls are transactions); once the committer closes, they
        fail.  Idempotent.
        """
        if self.closed:
            return
        self.closed = True
        if self._dispatcher is not None:
            self._dispatcher.close()
        self.committer.close()
        self.store.close()


__all__ = ["Engine", "next_transaction_id"]
