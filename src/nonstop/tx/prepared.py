"""Prepared transactions (B6, B9): one store's side of two-phase commit.

A transaction prepared under a global id ``gtid`` has voted yes: its write set
is durable in the store's ``prepared`` database but not applied, and it keeps
every lock until the outcome.  This module holds what that takes, apart from
the transaction itself (whose ``prepare``/``commit_prepared``/``abort_prepared``
move it through the states):

* the prepared record: the write set and the locks, by database *name*
  (:func:`prepared_write_set`), and phase two's write set
  (:func:`phase_two_write_set`: the write set applied or not, the record dropped);
* :class:`PreparedTable`: the transactions in doubt, and those whose prepared
  record is computed but not yet durable (``nonstop.dataplane.participant``
  commits it with the decision protocol's own keys);
* recovery after a restart (:func:`recover_prepared`): each record comes back
  as an :class:`InDoubt` transaction holding its locks, until the outcome.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

from nonstop.errors import StoreError
from nonstop.model.codec import pack_sliced, unpack
from nonstop.store.group_commit import WriteSet
from nonstop.store.lmdb_store import Store
from nonstop.store.records import seal
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.tx.engine import Engine
    from nonstop.tx.transaction import Transaction


class PreparedTransaction(Protocol):
    """A transaction in doubt: a prepared :class:`Transaction`, or a recovered :class:`InDoubt`."""

    def phase_two(self, commit: bool) -> WriteSet:
        """What phase two commits: the write set applied (``commit``) or not, the record dropped."""
        ...

    def phase_two_durable(self, commit: bool) -> None:
        """Phase two's write set is durable: out of doubt, locks released."""
        ...

    def commit_prepared(self) -> Any:
        """Phase two, commit: apply the prepared write set durably, release the locks."""
        ...

    def abort_prepared(self) -> Any:
        """Phase two, abort: drop the prepared write set durably, release the locks."""
        ...


class PreparedTable:
    """One store's prepared transactions, by global id.

    *In doubt*: durably prepared, waiting for the outcome (``db.in_doubt()``).
    *Staged*: the prepared record is computed but not yet durable; the caller
    that commits it together with writes of its own picks it up
    (:meth:`unstage`) and marks the transaction prepared once durable.
    """

    __slots__ = ("_in_doubt", "_staged")

    def __init__(self) -> None:
        self._in_doubt: dict[bytes, PreparedTransaction] = {}
        self._staged: dict[bytes, tuple[Transaction, WriteSet]] = {}

    # ------------------------------------------------------------ in doubt
    def __contains__(self, gtid: object) -> bool:
        """Whether ``gtid`` is in doubt here."""
        return gtid in self._in_doubt

    def get(self, gtid: bytes) -> PreparedTransaction | None:
        return self._in_doubt.get(gtid)

    def gtids(self) -> list[bytes]:
        """The global ids in doubt, sorted."""
        return sorted(self._in_doubt)

    def add(self, gtid: bytes, tx: PreparedTransaction) -> None:
        self._in_doubt[gtid] = tx

    def discard(self, gtid: bytes) -> None:
        self._in_doubt.pop(gtid, None)

    # -------------------------------------------------------------- staged
    def stage(self, gtid: bytes, tx: Transaction, record: WriteSet) -> None:
        """Keep ``tx``'s prepared record (``tx.prepare_write_set``) until it is committed."""
        self._staged[gtid] = (tx, record)

    def unstage(self, gtid: bytes) -> tuple[Transaction, WriteSet] | None:
        """Take the staged transaction and prepared record of ``gtid`` (None: none staged)."""
        return self._staged.pop(gtid, None)

    def is_staged(self, gtid: bytes) -> bool:
        return gtid in self._staged

    def staged(self) -> list[bytes]:
        """The global ids staged (computed, not yet durable), sorted."""
        return sorted(self._staged)


def prepared_write_set(
    store: Store, gtid: bytes, ws: WriteSet, locks: dict[Hashable, LockMode]
) -> WriteSet:
    """The write set that records ``ws`` and ``locks`` as prepared under ``gtid``.

    Read locks are kept too (``rlocks``, absent when none, so older versions
    still read the record): a participant that restarts prepared must hold
    every lock it had until the outcome, or another transaction could slip in
    between its reads and the reads other participants are still making.
    """
    names = store.names()
    op_names = [names[id(db)] for _, db, _, _ in ws.ops]
    ops = [[op[0], name, op[2], op[3]] for op, name in zip(ws.ops, op_names, strict=True)]
    # Databases made on first use (indexes, the bulk operations' ``bulk``) must be
    # opened again before a restart can recover the record.
    index_names = {n for n in op_names if n.startswith(b"ix:") or n == b"bulk"}
    uniques = {n: not store.is_dupsort(n) for n in index_names}
    held = [_lock_out(r) for r, mode in locks.items() if mode is LockMode.WRITE]
    record: dict[str, Any] = {
        "ops": ops,
        "deltas": ws.count_deltas,
        "unique": uniques,
        "locks": held,
    }
    read = [_lock_out(r) for r, mode in locks.items() if mode is LockMode.READ]
    if read:
        record["rlocks"] = read
    # (pack_sliced: a large one is made on a worker thread, which must not hold the GIL
    # for the whole encoding: tx/prepared.py, data-path.md §6.8)
    return WriteSet([(True, store.prepared, gtid, seal(pack_sliced(record)))])  # checksummed


def phase_two_write_set(store: Store, gtid: bytes, ws: WriteSet, commit: bool) -> WriteSet:
    """Phase two of ``gtid``, prepared with ``ws``: ``ws`` applied if ``commit``; record dropped."""
    drop = (False, store.prepared, gtid, None)
    return WriteSet([*ws.ops, drop], dict(ws.count_deltas)) if commit else WriteSet([drop])


def recover_prepared(engine: Engine) -> None:
    """After a restart, prepared transactions come back in doubt, holding their locks."""
    store = engine.store
    with store.read() as rtxn:
        records = list(rtxn.cursor(db=store.prepared))
    for gtid, raw in records:
        rec = unpack(bytes(store.sealed_payload(raw, gtid, "prepared")))
        for name, unique in rec["unique"].items():
            store.index_db(name, unique=unique)
        ops = [(p, store.db_by_name(n), k, v) for p, n, k, v in rec["ops"]]
        doubt = InDoubt(engine, bytes(gtid), WriteSet(ops, rec["deltas"]))
        wanted = [(lock, LockMode.WRITE) for lock in rec["locks"]]
        wanted += [(lock, LockMode.READ) for lock in rec.get("rlocks", ())]
        for lock, mode in wanted:
            if not engine.locks.try_acquire(doubt.id, _lock_in(lock), mode):
                raise StoreError(f"prepared transaction {gtid!r} conflicts with another")
        engine.prepared.add(doubt.gtid, doubt)


class InDoubt:
    """A prepared transaction recovered after a restart: its write set and its locks.

    It can only be ended, by the two-phase-commit outcome: :meth:`commit_prepared`
    applies the write set, :meth:`abort_prepared` drops it (``db.resolve`` calls them).
    """

    def __init__(self, engine: Engine, gtid: bytes, ws: WriteSet) -> None:
        self.engine = engine
        self.gtid = gtid
        self.ws = ws
        self.id = engine.new_transaction_id()  # its locks' owner in the lock table

    def phase_two(self, commit: bool) -> WriteSet:
        return phase_two_write_set(self.engine.store, self.gtid, self.ws, commit)

    def phase_two_durable(self, commit: bool) -> None:
        self.engine.prepared.discard(self.gtid)
        self.engine.locks.release_all(self.id)

    def commit_prepared(self) -> None:
        self.engine.committer.commit(self.phase_two(True))
        self.phase_two_durable(True)

    def abort_prepared(self) -> None:
        self.engine.committer.commit(self.phase_two(False))
        self.phase_two_durable(False)


def _lock_out(resource: Hashable) -> list[Any]:
    """A lock's resource for a prepared record: an object ref, or a key tuple."""
    return ["o", resource] if isinstance(resource, bytes) else ["k", *resource]  # type: ignore[misc]


def _lock_in(lock: list[Any]) -> Hashable:
    return lock[1] if lock[0] == "o" else tuple(lock[1:])


__all__ = [
    "InDoubt",
    "PreparedTable",
    "PreparedTransaction",
    "phase_two_write_set",
    "prepared_write_set",
    "recover_prepared",
]
