"""Transactions over managed objects (B1–B5, A2, A4, A5 local scope, B6 notifiers).

How a transaction works:

* **Locks** (B3) come from the engine's :class:`~nonstop.tx.waiting.LockTable`:
  per object, many readers or one writer, read→write promotion, FIFO waiters,
  deadlocks found at once on a wait-for graph (B4) — the requester is the
  victim and gets :class:`~nonstop.errors.Deadlock`, which ``@transactional``
  replays.  Unique key *values* are locked too, so that ``get`` of an absent
  key, ``get_or_create`` and concurrent creators of one key are serialized and
  :class:`~nonstop.errors.DuplicateKey` is exact.
* **Isolation** (B2): ``serializable`` (default) takes a read lock before any
  read and holds every lock to the end.  ``snapshot`` (read-committed
  snapshot) takes no read locks; each object is read once from its last
  committed state and then stays the same for the transaction; writing an
  object takes the write lock and checks that nobody committed a newer version
  since it was read (else :class:`~nonstop.errors.Conflict`, replayed).
* **Write sets are buffered** until commit: rollback (B5) just drops them.  At
  commit, update triggers (A3) and prepare notifiers run, then the write set
  goes to the group committer, and the call returns once it is durable.  Locks
  are released only after that, so nobody ever reads something that could
  still be lost.
* Every internal operation is a generator that *yields* the locks it needs.
  The sync driver blocks the thread on each; the async driver awaits.  That is
  how one body of logic serves ``with db.transaction()`` and
  ``async with db.transaction()``.  In an async transaction, attribute access
  cannot await: a lock that attribute access would have to wait for aborts the
  transaction with a retryable ``Conflict`` instead (take locks up front with
  ``lock="write"`` or ``await tx.lock(obj, "write")``).

A transaction is used by one thread or task at a time.  It runs against its
database's :class:`~nonstop.tx.engine.Engine` (``tx.engine``: store, locks,
group committer, types); the methods under "engine-level API" are what
nonstop's bulk operations and data plane use besides the application API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import lmdb

from nonstop.errors import (
    BadArgument,
    Conflict,
    DatabaseClosed,
    Deleted,
    DuplicateKey,
    Error,
    FieldError,
    ImmutableKey,
    NotFound,
    ObjectNotInTransaction,
    TransactionClosed,
    TypeVersionMismatch,
)
from nonstop.model.codec import encode_key, pack
from nonstop.model.entry import CLEAN, CREATED, CREATED_DELETED, DELETED, DIRTY
from nonstop.model.managed import KeyInfo, Managed, TypeInfo, lookup_type, type_info
from nonstop.model.ref import Ref, check_epoch, check_location, location_prefix
from nonstop.store.group_commit import Op as StoreOp
from nonstop.store.group_commit import WriteSet
from nonstop.store.records import pack_record
from nonstop.tx import gc_hold
from nonstop.tx.engine import next_transaction_id
from nonstop.tx.entries import (
    NONE,
    READ,
    WRITE,
    Entry,
    Isolation,
    Op,
    TxState,
    describe_key,
    parse_lock,
    unique_lookup,
)
from nonstop.tx.locks import LockMode
from nonstop.tx.prepared import phase_two_write_set, prepared_write_set
from nonstop.tx.type_gate import enter as enter_gate

if TYPE_CHECKING:
    from nonstop.tx.database import Database
    from nonstop.tx.query import Query

log = logging.getLogger("nonstop.tx")

M = TypeVar("M", bound=Managed)


def _version(rec: list[Any] | None) -> int | None:
    """The version of a committed record (None: no object)."""
    return None if rec is None else int(rec[2])


class Transaction:
    """A synchronous transaction.  Obtain one with ``db.transaction()``.

    ``db``: its database; ``engine``: what it runs against (``db.engine``).
    """

    _is_async = False

    def __init__(self, db: Database, isolation: Isolation, lock_timeout: float | None) -> None:
        self.db = db
        self.engine = db.engine
        self.id = next_transaction_id()
        self.isolation = isolation
        self._serializable = isolation is Isolation.SERIALIZABLE
        self.default_lock = READ if self._serializable else NONE
        """The lock a read takes when none is named: READ (serializable) or NONE (snapshot)."""
        self._lock_timeout = lock_timeout
        self._state = TxState.ACTIVE
        self._doomed: BaseException | None = None
        self._entries: dict[bytes, Entry] = {}
        # Unique key values claimed by this transaction: (index db, key bytes) -> ref.
        self._claimed: dict[tuple[bytes, bytes], bytes] = {}
        self._async_calls: list[tuple[bytes, bytes]] = []
        self._raw_ops: list[StoreOp] = []
        # Extent count changes of the raw ops (a bulk write builds its ops itself).
        self._raw_counts: dict[bytes, int] = {}
        self._on_prepare: list[Callable[[], Any]] = []
        self._on_commit: list[Callable[[], Any]] = []
        self._on_rollback: list[Callable[[], Any]] = []
        self._prepared: tuple[bytes, WriteSet] = (b"", WriteSet())
        self._entered: set[str] = set()
        """Types whose gate this transaction holds in READ (:mod:`nonstop.tx.type_gate`)."""
        self.scope: frozenset[bytes] | None = None
        """The 8-byte location prefixes counts, queries and lookups see (None: all; see
        :meth:`restrict_to`)."""
        self._view: Any = None
        """Snapshot isolation: the LMDB read view every lock-free read of this transaction
        uses, opened at its first such read and closed when it ends (:meth:`committed`)."""
        self.view_marks: tuple[int, int] | None = None
        """The commit journal's counter just before and after the view opened (:meth:`pin_view`)."""

    # ------------------------------------------------------------- drivers
    def drive(self, op: Op) -> Any:
        """Run a generator operation (:data:`~nonstop.tx.entries.Op`), blocking this
        thread for each lock it yields; its return value.  A lock error (deadlock,
        timeout) dooms the transaction: it can then only roll back."""
        try:
            request = next(op)
            while True:
                self._lock_blocking(*request)
                request = op.send(None)
        except StopIteration as stop:
            return stop.value
        except lmdb.InvalidParameterError as exc:
            raise self._view_error(exc) from exc

    def rank_from(self, born: float) -> None:
        """Rank this transaction in deadlocks as begun at ``born`` (``time.monotonic()``;
        a replay passes its first attempt's): a cycle's youngest member is its victim
        (:mod:`nonstop.tx.waiting`), so a replayed transaction ages and is not starved."""
        self.engine.locks.rank(self.id, born)

    def _lock_blocking(self, resource: Hashable, mode: LockMode) -> None:
        try:
            self.engine.locks.acquire(self.id, resource, mode, self._lock_timeout)
        except Error as exc:
            self._doomed = exc
            raise

    def _lock_now(self, resource: Hashable, mode: LockMode) -> None:
        """Attribute access: block in sync transactions (overridden for async ones)."""
        self._lock_blocking(resource, mode)

    def need(self, resource: Hashable, mode: LockMode) -> Op:
        """Generator step: make sure ``resource`` is locked in ``mode`` (``yield from tx.need``).

        A resource is an object's reference or any hashable naming something
        else to serialize on (a unique key value, a request slot, a bulk tag).
        """
        if not self.engine.locks.try_acquire(self.id, resource, mode):
            yield resource, mode

    def need_all(self, resources: list[Hashable], mode: LockMode) -> Op:
        """Generator step: lock every one of ``resources`` in ``mode``.

        The free ones are taken in ONE lock-table call (a bulk write's thousands
        of locks); only the others are yielded, to wait for them one by one.
        """
        for resource in self.engine.locks.try_acquire_many(self.id, resources, mode):
            yield resource, mode

    # --------------------------------------------------------------- checks
    def enter_type(self, type_name: str) -> None:
        """Take ``type_name``'s gate in READ (once per transaction and type), or raise
        LockTimeout (retryable) while a bulk swap holds the type (data-path.md §6.3)."""
        if type_name not in self._entered:
            enter_gate(self.engine, self.id, type_name)
            self._entered.add(type_name)

    def enter_types(self, info: TypeInfo) -> None:
        """:meth:`enter_type` for every concrete type of ``info`` (what a query or count of
        ``info`` reads)."""
        entered = self._entered
        for t in info.concrete_types():
            if t.name not in entered:
                self.enter_type(t.name)

    def check_usable(self) -> None:
        """Raise unless the transaction can go on: TransactionClosed, DatabaseClosed, or
        the error that doomed it (a lost deadlock or conflict: only rollback is left)."""
        if self._state is not TxState.ACTIVE:
            raise TransactionClosed(f"transaction {self.id} is {self._state.value}")
        engine = self.engine
        if engine.closed and engine.committer.closing:
            # (While close() waits for running async calls, they may still finish.)
            raise DatabaseClosed(
                f"database {engine.path!r} was closed; transaction {self.id} cannot go on"
            )
        if self._doomed is not None:
            # The transaction lost a deadlock or a conflict: only rolling back is left.
            # Raising the same (retryable) error lets @transactional replay it.
            raise self._doomed

    def entry_of(self, obj: Managed) -> Entry:
        """The entry of a handle obtained in this transaction (ObjectNotInTransaction otherwise)."""
        if not isinstance(obj, Managed):
            raise BadArgument(f"expected a managed object, got {type(obj).__name__}")
        entry: Entry = obj._e
        if entry.tx is not self:
            raise ObjectNotInTransaction(
                f"{type(obj).__name__} object was obtained in transaction {entry.tx.id}, "
                f"not in this one ({self.id}); get it again in this transaction"
            )
        self.check_usable()
        self.adopt(entry)
        return entry

    def adopt(self, e: Entry) -> None:
        """Take back an entry a streaming query let go of (tx/query.py pages) before using it.

        A query streamed in pages forgets the unlocked, unchanged objects of the
        pages it has passed, so iterating millions of objects takes constant memory;
        a handle kept from such a page is still usable: it is registered again here.
        """
        held = self._entries.get(e.ref)
        if held is e:
            return
        if held is None:
            self._entries[e.ref] = e
            return
        raise ObjectNotInTransaction(
            f"{e.info.name} object from an earlier page of a streamed query was loaded again "
            "since; use the object loaded last"
        )

    # ---------------------------------------------------------- field access
    def read_field(self, e: Entry, name: str) -> Any:
        """``handle.name``: the field as this transaction sees it (taking the default lock)."""
        if self._state is not TxState.ACTIVE or e.tx is not self:
            raise ObjectNotInTransaction(
                f"{e.info.name} object used outside its transaction (which is {e.tx._state.value})"
            )
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object was deleted in this transaction")
        if e.lock < self.default_lock:
            self.adopt(e)
            self._upgrade_now(e, self.default_lock)
        value = e.state[name]
        if value is not None and name in e.info.ref_fields:
            return self._deref(value)
        return value

    def write_field(self, e: Entry, name: str, value: Any) -> None:
        """``handle.name = value``: check the value, lock, claim unique keys, buffer the change."""
        if self._state is not TxState.ACTIVE or e.tx is not self:
            raise ObjectNotInTransaction(
                f"{e.info.name} object used outside its transaction (which is {e.tx._state.value})"
            )
        self.check_usable()
        self.adopt(e)
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object was deleted in this transaction")
        f = e.info.fields[name]
        if not (f.kind == "ref" and isinstance(value, Ref)):
            # A Ref as such is taken as is: over the data path its object may live on
            # another node, so it cannot be an object of this transaction.
            value = f.check(e.info.name, value)
            if f.kind == "ref" and value is not None:
                value = Ref(self.entry_of(value).ref)  # as in create: only this tx's objects
        if f.key is not None and not f.key.mutable and e.status != CREATED:
            raise ImmutableKey(
                f"{e.info.name}.{name} is an immutable key; it cannot change after create"
            )
        if e.lock < WRITE:
            self._upgrade_now(e, WRITE)
        if f.key is not None and value != e.state[name]:
            key = e.info.keys[name]
            if key.options.unique:
                self._claim_now(key, value, e)
                if e.state[name] is not None:
                    old_slot = (key.db_name, encode_key(e.state[name]))
                    self._claimed.pop(old_slot, None)
                    # Hold the old value until commit: a creator of it must wait for us.
                    self._lock_now(old_slot, WRITE)
            if e.orig is None and e.status != CREATED:
                e.orig = {k: e.state[k] for k in e.info.keys if e.info.keys[k].options.mutable}
        if e.status == CLEAN:
            e.status = DIRTY
        e.state[name] = value

    def _drive_now(self, op: Op) -> Any:
        """Run a generator operation from attribute access, taking locks with ``_lock_now``."""
        try:
            request = next(op)
            while True:
                self._lock_now(*request)
                request = op.send(None)
        except StopIteration as stop:
            return stop.value
        except lmdb.InvalidParameterError as exc:
            raise self._view_error(exc) from exc

    def _upgrade_now(self, e: Entry, mode: int) -> None:
        self._drive_now(self._g_upgrade(e, mode))

    def _claim_now(self, key: KeyInfo, value: Any, e: Entry) -> None:
        self._drive_now(self._g_claim(key, value, e.ref))

    def _deref(self, ref: Ref) -> Managed | None:
        e = self._drive_now(self.g_load(ref.raw, self.default_lock))
        return None if e is None else e.handle

    # ------------------------------------------------------ committed reads
    def committed(self, mode: int) -> AbstractContextManager[Any]:
        """The LMDB read transaction a read in lock ``mode`` sees committed state through.

        A lock-free read of a ``snapshot`` transaction sees the transaction's one
        view, pinned at its first such read: every get, lookup, query page and
        count of the transaction then sees the same committed state (a commit is
        one LMDB write transaction, so it is in the view entirely or not at all).
        A read that takes a lock, and every read of a ``serializable``
        transaction, sees the latest committed state (its lock keeps it current).
        Not closed by the caller: the view lives until :meth:`_finish`.
        """
        if mode != NONE or self._serializable:
            return self.engine.store.read()
        if self._view is None:
            self._view = self.engine.store.read()
        return nullcontext(self._view)

    def pin_view(self, journal_counter: Callable[[], int] | None = None) -> None:
        """Open this snapshot transaction's view now (a cluster snapshot opens its views on
        every node in one round); with ``journal_counter``, remember its values just
        before and after the view opened (``view_marks``, nonstop.dataplane.snapshot_cut)."""
        if self._serializable:
            raise BadArgument("only a snapshot transaction has a read view")
        before = None if journal_counter is None else journal_counter()
        with self.committed(NONE):
            pass
        if journal_counter is not None and before is not None:
            self.view_marks = (before, journal_counter())

    def reset_view(self) -> None:
        """Drop the view so that the next read opens a new one: only before anything was
        read through it (a cluster snapshot whose views did not form a consistent cut)."""
        if any(e.status == CLEAN for e in self._entries.values()):
            raise BadArgument("a snapshot's view cannot move once it was read")
        self._close_view()
        self.view_marks = None

    def _view_error(self, exc: lmdb.InvalidParameterError) -> Exception:
        """What LMDB's "invalid argument" on a read means: with a pinned view, an index
        created after the view began (LMDB lets a read transaction use only the handles
        opened before it; the store opens every existing one at start, so only a type's
        first index can be newer). Retryable: the replay pins a view that has it."""
        if self._view is None:
            return exc
        self._doomed = Conflict(
            "a type's index was created after this snapshot's view was taken; retry"
        )
        return self._doomed

    def _close_view(self) -> None:
        view, self._view = self._view, None
        if view is not None:
            try:
                view.abort()
            except Exception:  # the store closed first: LMDB dropped the view with it
                log.debug("snapshot view already closed", exc_info=True)

    # ------------------------------------------------ generator operations
    def entry_from_record(self, ref: bytes, rec: list[Any], lock: int) -> Entry:
        """This transaction's entry for a committed record ``rec`` of ``ref``, held in ``lock``
        (the caller took it); the object's type changes transparently (E3)."""
        type_name, type_version, version, state = rec
        if type_name not in self._entered:
            self.enter_type(type_name)
        info = self.engine.type_by_name(type_name)
        if type_version > info.version:
            raise TypeVersionMismatch(
                f"the store holds {type_name} version {type_version}; this process defines "
                f"version {info.version}"
            )
        if len(state) != len(info.fields) or type_version != info.version:
            # Transparent type change (E3): new fields get defaults, removed ones go.
            state = {
                n: state[n] if n in state else f.make_default() for n, f in info.fields.items()
            }
        entry = Entry(self, ref, info, state, version, lock, CLEAN)
        self._entries[ref] = entry
        return entry

    def g_load(self, ref: bytes, mode: int, prefetched: tuple[int, Any] | None = None) -> Op:
        """Load an object by reference with at least ``mode`` locked; None if it doesn't exist.

        ``prefetched`` is (store commit_seq before the read, raw record) read before the
        lock was taken; it is used only if no commit landed since, else re-read.
        """
        e = self._entries.get(ref)
        if e is not None:
            if e.status >= DELETED:
                return None
            if mode > e.lock:
                yield from self._g_upgrade(e, mode)
            return e
        store = self.engine.store
        if mode:
            yield from self.need(ref, mode)  # type: ignore[arg-type]
        if not self._serializable:
            with self.committed(NONE) as view:  # the snapshot's view
                rec = store.get_object(ref, view)
            if mode != NONE and _version(store.get_object(ref)) != _version(rec):
                # Locked now, but changed since the snapshot: reading the latest would mix
                # two states (read skew), reading the view would lose the update.
                self._doomed = Conflict(
                    f"object {Ref(ref)} changed since this snapshot transaction began"
                )
                raise self._doomed
        elif prefetched is not None and prefetched[0] == store.commit_seq:
            raw = prefetched[1]
            rec = None if raw is None else store.record(raw, ref)
        else:
            rec = store.get_object(ref)
        if rec is None:
            return None
        return self.entry_from_record(ref, rec, mode)

    def _g_upgrade(self, e: Entry, mode: int) -> Op:
        yield from self.need(e.ref, mode)  # type: ignore[arg-type]
        if e.status in (CREATED, CREATED_DELETED):
            e.lock = max(e.lock, mode)
            return
        if self._serializable:
            if e.lock == NONE and e.status == CLEAN:
                # Read without a lock (lock="none"): re-read now that it is locked.
                rec = self.engine.store.get_object(e.ref)
                if rec is None:
                    self._doomed = Conflict(f"{e.info.name} object was deleted concurrently")
                    raise self._doomed
                fresh = self.entry_from_record(e.ref, rec, mode)
                e.state, e.version = fresh.state, fresh.version
                self._entries[e.ref] = e
        elif mode == WRITE:
            # Snapshot isolation: a write must not be based on a stale read.
            rec = self.engine.store.get_object(e.ref)
            if rec is None or rec[2] != e.version:
                self._doomed = Conflict(
                    f"{e.info.name} object changed since this snapshot transaction read it"
                )
                raise self._doomed
        e.lock = max(e.lock, mode)

    def _g_claim(self, key: KeyInfo, value: Any, ref: bytes) -> Op:
        """Take a unique key value for ``ref``; DuplicateKey if someone else holds it.

        ``None`` is not a value of a unique key (as NULL in SQL): any number of
        objects may leave an optional unique key unset, and it is not indexed.
        """
        if value is None:
            return
        kb = encode_key(value)
        slot = (key.db_name, kb)
        holder = self._claimed.get(slot)
        if holder is not None and holder != ref:
            raise DuplicateKey(f"{key.owner}.{key.field} = {value!r} is already taken")
        yield from self.need(slot, WRITE)
        committed = self.engine.index_get(key, kb)
        if committed is not None and committed != ref and not self._released(committed, key, kb):
            raise DuplicateKey(f"{key.owner}.{key.field} = {value!r} is already taken")
        self._claimed[slot] = ref

    def g_claim(self, key: KeyInfo, value: Any, ref: bytes) -> Op:
        """Generator op: take the unique value ``value`` of ``key`` for the object ``ref``
        (DuplicateKey if another object holds it); what a replica's apply claims with."""
        yield from self._g_claim(key, value, ref)

    def _released(self, ref: bytes, key: KeyInfo, kb: bytes) -> bool:
        """Did this transaction delete the object at ``ref`` or move it off key value ``kb``?"""
        e = self._entries.get(ref)
        if e is None:
            return False
        return e.status >= DELETED or encode_key(e.state[key.field]) != kb

    def _g_lookup(self, info: TypeInfo, key: KeyInfo, value: Any, mode: int) -> Op:
        """Unique lookup.  With a lock mode, an absent key stays absent until commit."""
        if value is None:
            return None  # unique keys do not index None (see _g_claim)
        kb = encode_key(value)
        slot = (key.db_name, kb)
        mine = self._claimed.get(slot)
        scope = self.scope
        if mine is not None:
            e = self._entries[mine]
            return None if e.status >= DELETED or not self.in_scope(mine) else e
        locked_slot = False
        store = self.engine.store
        index = store.index_db(key.db_name, unique=True)
        for _ in range(100):
            # One LMDB snapshot for the index entry and the object it points to.
            seq = store.commit_seq
            with self.committed(mode) if mode == NONE else store.read_buffers() as rtxn:
                ref = rtxn.get(kb, db=index)
                raw = None if ref is None else rtxn.get(ref, db=store.objects)
                if ref is not None:
                    ref = bytes(ref)
                    raw = None if raw is None else bytes(raw)
            if ref is not None and scope is not None and ref[:8] not in scope:
                return None  # another partition's object (held here as a replica)
            if ref is None:
                if mode == NONE or locked_slot:
                    return None
                yield from self.need(slot, mode)  # type: ignore[arg-type]
                locked_slot = True
                continue
            if self._released(ref, key, kb):
                return None
            e = yield from self.g_load(ref, mode, (seq, raw))
            if e is None:
                continue  # deleted between index read and lock: look again
            if mode != NONE and e.status == CLEAN and encode_key(e.state[key.field]) != kb:
                continue  # its mutable key moved before we locked it
            if not isinstance(e.handle, info.cls):
                return None
            return e
        raise Conflict(f"{info.name}.{key.field} = {value!r} kept changing under the lookup")

    def _new_state(self, info: TypeInfo, values: dict[str, Any]) -> dict[str, Any]:
        """The checked state of a new object of ``info`` from ``create``'s ``values``."""
        fields = info.fields
        unknown = [n for n in values if n not in fields]
        if unknown:
            raise FieldError(f"{info.name} has no field(s) {', '.join(map(repr, unknown))}")
        missing = [f.name for f in info.required if f.name not in values]
        if missing:
            raise FieldError(f"{info.name} needs a value for {', '.join(map(repr, missing))}")
        state: dict[str, Any] = {}
        for name, f in fields.items():
            if name in values:
                v = values[name]
                if f.kind == "ref" and isinstance(v, Ref):
                    state[name] = v  # a reference as such (see write_field)
                    continue
                v = f.check(info.name, v)
                if f.kind == "ref" and v is not None:
                    self.entry_of(v)
                    v = Ref(v._e.ref)
                state[name] = v
            else:
                state[name] = f.make_default()
        for name in info.keys:
            encode_key(state[name])  # KeyTooLong / bad key type before anything else
        return state

    def g_insert(
        self,
        info: TypeInfo,
        state: dict[str, Any],
        claimed: tuple[KeyInfo, bytes] | None = None,
        location: int | None = None,
        epoch: int = 0,
    ) -> Op:
        """Generator op: create an object of ``info`` from a complete, checked ``state``;
        returns its entry.

        Claims the object's unique key values (DuplicateKey: nothing is created),
        except ``claimed`` = (key, encoded value), which :meth:`g_claim_absent`
        already locked and found free.  ``create`` checks the values first; a
        bulk load that checked whole columns calls this directly.  The reference
        is new in ``location`` (a partition's location code; this store's own when
        None) at ``epoch`` (:meth:`~nonstop.store.lmdb_store.Store.new_ref`).
        """
        if info.name not in self._entered:
            self.enter_type(info.name)
        ref = self.engine.store.new_ref(location, epoch)
        claims = self._claimed
        skip = None
        if claimed is not None:
            key, kb = claimed
            claims[(key.db_name, kb)] = ref
            skip = key.field
        try:
            for name, key in info.keys.items():
                if key.options.unique and name != skip:
                    yield from self._g_claim(key, state[name], ref)
        except BaseException:
            # Nothing was created (DuplicateKey): give back the values claimed for it.
            for slot in [s for s, r in claims.items() if r == ref]:
                del claims[slot]
            raise
        self.engine.locks.try_acquire(self.id, ref, WRITE)  # a brand-new ref: always free
        e = Entry(self, ref, info, state, 0, WRITE, CREATED)
        self._entries[ref] = e
        return e

    def g_claim_absent(self, key: KeyInfo, kb: bytes, seen_at: int) -> Op:
        """Generator op: lock the value ``kb`` of unique ``key``, which a read made when the
        store's ``commit_seq`` was ``seen_at`` found free.

        Returns True if it is still free (create with ``g_insert(..., claimed=(key, kb))``),
        False if this transaction claimed it already or another one committed it since.
        Cheaper than a create's claim when nothing committed since the read: no index read.
        """
        slot = (key.db_name, kb)
        if slot in self._claimed:
            return False
        yield from self.need(slot, WRITE)
        # A creator of this value holds its lock until durable and bumps commit_seq before
        # releasing it: with the lock held and no commit since the read, it is still free.
        engine = self.engine
        return engine.store.commit_seq == seen_at or engine.index_get(key, kb) is None

    def _g_delete(self, e: Entry) -> Op:
        if e.lock < WRITE:
            yield from self._g_upgrade(e, WRITE)
        if e.info.has_on_delete:
            e.handle.on_delete()
        for name, key in e.info.keys.items():
            if key.options.unique:
                if e.state[name] is not None:
                    kb = encode_key(e.state[name])
                    yield from self.need((key.db_name, kb), WRITE)
                    self._claimed.pop((key.db_name, kb), None)
                if e.orig is not None and e.orig.get(name) is not None:
                    yield from self.need((key.db_name, encode_key(e.orig[name])), WRITE)
        e.status = CREATED_DELETED if e.status == CREATED else DELETED

    # ----------------------------------------------------- public: sync API
    def create(self, cls: type[M], /, **values: Any) -> M:
        """Create an object; DuplicateKey (nothing written) if a unique key is taken."""
        self.check_usable()
        info = self.engine.ensure_type(cls)
        e = self.drive(self.g_insert(info, self._new_state(info, values)))
        return e.handle  # type: ignore[no-any-return]

    def create_in(self, cls: type[M], location: int, epoch: int = 0, /, **values: Any) -> M:
        """Create an object in ``location`` (a partition's location code) at the partition's
        ``epoch``; otherwise as :meth:`create` (which creates in this store's own location).
        BadArgument (nothing created) for a location or epoch out of range."""
        self.check_usable()
        check_location(location)
        check_epoch(epoch)
        info = self.engine.ensure_type(cls)
        e = self.drive(self.g_insert(info, self._new_state(info, values), None, location, epoch))
        return e.handle  # type: ignore[no-any-return]

    def find(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M | None:
        """Unique lookup by one unique key: ``find(Account, number="A-1")``; None if absent."""
        self.check_usable()
        info, k, value, mode = self._lookup_args(cls, key, lock)
        e = self.drive(self._g_lookup(info, k, value, mode))
        return None if e is None else e.handle

    def get(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M:
        """Like :meth:`find` but raises NotFound when there is no such object."""
        obj = self.find(cls, lock=lock, **key)
        if obj is None:
            raise NotFound(f"no {cls.__name__} with {describe_key(key)}")
        return obj

    def get_or_create(
        self, cls: type[M], /, *, defaults: dict[str, Any] | None = None, **key: Any
    ) -> tuple[M, bool]:
        """Atomic select-or-create (A5): returns (object, created)."""
        self.check_usable()
        info, k, value, _ = self._lookup_args(cls, key, "write")
        e = self.drive(self._g_lookup(info, k, value, WRITE))
        if e is not None:
            return e.handle, False
        return self.create(cls, **{**(defaults or {}), **key}), True

    def by_ref(self, ref: Ref, /, *, lock: str | None = None) -> Managed | None:
        """The object with this reference, or None if it does not exist."""
        self.check_usable()
        if not self.in_scope(ref.raw):
            return None
        mode = parse_lock(lock)
        e = self.drive(self.g_load(ref.raw, self.default_lock if mode is None else mode))
        return None if e is None else e.handle

    def lock(self, obj: Managed, mode: str = "write") -> None:
        """Take a lock explicitly (an explicit write lock avoids promotion deadlocks, B3)."""
        e = self.entry_of(obj)
        m = parse_lock(mode) or NONE
        if m > e.lock:
            self.drive(self._g_upgrade(e, m))

    def delete(self, obj: Managed) -> None:
        """Delete the object (its delete trigger runs first)."""
        e = self.entry_of(obj)
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object is already deleted")
        self.drive(self._g_delete(e))

    def count(self, cls: type[Managed]) -> int:
        """Cardinality of the type's extent (A2): read committed plus this transaction's changes."""
        self.check_usable()
        total = 0
        scope = self.scope
        self.enter_types(self.engine.ensure_type(cls))
        with self.committed(NONE) as view:  # lock-free: the snapshot's view, if any
            for info in self.engine.ensure_type(cls).concrete_types():
                total += self.engine.store.count(info.name, scope, view)
        for e in self._entries.values():
            if isinstance(e.handle, cls) and (scope is None or e.ref[:8] in scope):
                if e.status == CREATED:
                    total += 1
                elif e.status == DELETED:
                    total -= 1
        return total

    def extent(self, cls: type[M], /, *, lock: str | None = None) -> list[M]:
        """Every object of the type and its subtypes on this node (A2)."""
        return self.query(cls).lock(lock).all()

    def query(self, cls: type[M], /) -> Query[M]:
        """Start a query (A5): ``tx.query(Account).range("owner", "a", "m").all()``."""
        from nonstop.tx.query import Query

        self.check_usable()
        return Query(self, self.engine.ensure_type(cls))

    def ref(self, obj: Managed) -> Ref:
        """The object's reference (C1)."""
        return Ref(self.entry_of(obj).ref)

    # Transaction notifiers (B6, local).
    def on_prepare(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` before commit; raising from it rolls the transaction back."""
        self._on_prepare.append(fn)

    def on_commit(self, fn: Callable[[], Any]) -> None:
        """Call ``fn()`` after the transaction is durable."""
        self._on_commit.append(fn)

    def on_rollback(self, fn: Callable[[], Any]) -> None:
        self._on_rollback.append(fn)

    @property
    def active(self) -> bool:
        return self._state is TxState.ACTIVE

    def commit(self) -> None:
        """Make every change durable, or raise and roll everything back."""
        ws = self._prepare_commit()
        if ws is None:
            self._finish(TxState.COMMITTED)
            return
        try:
            self.engine.committer.commit(ws)
        except BaseException:
            self._finish(TxState.ROLLED_BACK)
            raise
        self._finish(TxState.COMMITTED)

    def rollback(self) -> None:
        """Drop every change and release every lock (B5).  Safe to call twice."""
        if self._state is TxState.PREPARED:
            self.abort_prepared()
        elif self._state in (TxState.ACTIVE, TxState.COMMITTING):
            self._finish(TxState.ROLLED_BACK)

    # ------------------------------------------- two-phase commit (B6, B9)
    def prepare(self, gtid: bytes) -> bool:
        """Phase one of two-phase commit: vote yes, durably.

        Runs the update triggers and prepare notifiers, then makes the write set
        durable *without applying it*, under the global transaction id ``gtid``,
        and keeps every lock.  From then on only :meth:`commit_prepared` or
        :meth:`abort_prepared` (or ``db.resolve(gtid, ...)``) end the transaction —
        also after a crash: the prepared write set and its write locks are
        recovered when the database is reopened (``db.in_doubt()``).

        Returns False for a read-only transaction, which is then already finished
        (it has nothing to commit, so it need not take part in phase two).
        """
        record = self.prepare_write_set(gtid)
        if record is None:
            return False
        try:
            self.engine.committer.commit(record)
        except BaseException:
            self._finish(TxState.ROLLED_BACK)
            raise
        self.prepared_durable()
        return True

    def commit_prepared(self) -> None:
        """Phase two, commit: apply the prepared write set durably, then release the locks.

        If the store fails, the transaction stays prepared and this may be called again.
        """
        self.engine.committer.commit(self.phase_two(True))
        self.phase_two_durable(True)

    def abort_prepared(self) -> None:
        """Phase two, abort: forget the prepared write set durably, then release the locks."""
        self.engine.committer.commit(self.phase_two(False))
        self.phase_two_durable(False)

    # The halves of prepare and of phase two, for a caller that makes the write set
    # durable itself, atomically with writes of its own (``nonstop.dataplane.participant``
    # commits the decision protocol's keys in the same store commit).  The record
    # format and the in-doubt table are in nonstop.tx.prepared.
    def prepare_write_set(self, gtid: bytes, *, keep_read_only: bool = False) -> WriteSet | None:
        """First half of :meth:`prepare`: triggers, notifiers, the prepared write set.

        Returns the (not yet committed) write set that records the prepared
        transaction; the transaction is unusable from here on and keeps every
        lock.  A read-only transaction finishes and returns None, unless
        ``keep_read_only``: then it is prepared with an empty write set, so it
        holds its locks until phase two like any other participant.  If the
        triggers or notifiers raise, the transaction is rolled back and the error
        propagates.
        """
        ws = self._prepare_commit()
        if ws is None:
            if not keep_read_only:
                self._finish(TxState.COMMITTED)
                return None
            ws = WriteSet()
        self._prepared = (gtid, ws)
        engine = self.engine
        return prepared_write_set(engine.store, gtid, ws, engine.locks.held_by(self.id))

    def prepared_durable(self) -> None:
        """Second half of :meth:`prepare`: the record is durable, so the transaction is in doubt."""
        self._state = TxState.PREPARED
        self.engine.prepared.add(self._prepared[0], self)

    def phase_two(self, commit: bool) -> WriteSet:
        """First half of phase two: what to commit (the write set or nothing; record dropped)."""
        if self._state is not TxState.PREPARED:
            raise TransactionClosed(f"transaction {self.id} is {self._state.value}, not prepared")
        gtid, ws = self._prepared
        return phase_two_write_set(self.engine.store, gtid, ws, commit)

    def phase_two_durable(self, commit: bool) -> None:
        """Second half of phase two: its write set (:meth:`phase_two`) is durable; end."""
        self.engine.prepared.discard(self._prepared[0])
        self._finish(TxState.COMMITTED if commit else TxState.ROLLED_BACK)

    # ------------------------------------------- engine-level API (bulk, data plane)
    # What nonstop's own bulk operations, data plane and participant use besides
    # the application API; applications do not need it.
    def restrict_to(self, locations: Iterable[int] | None) -> None:
        """See only the objects of ``locations`` (location codes: the partitions this node is
        active for) in counts, queries, extents, unique lookups and ``by_ref``, so that a
        query asked of each partition once counts nothing twice; None: every object of the
        store (the default).  BadArgument (nothing changed) for a bad location code.

        Writes are not restricted: a unique value is unique in the whole store
        (a create in scope of a value an out-of-scope object holds is DuplicateKey).
        """
        self.scope = None if locations is None else frozenset(map(location_prefix, locations))

    def in_scope(self, ref: bytes) -> bool:
        """Whether the object ``ref`` is in this transaction's scope (:meth:`restrict_to`)."""
        scope = self.scope
        return scope is None or ref[:8] in scope

    @property
    def state(self) -> TxState:
        """Where the transaction is in its life (only an ACTIVE one can be used)."""
        return self._state

    def entry(self, ref: bytes) -> Entry | None:
        """This transaction's entry of the object ``ref``, if it touched it."""
        return self._entries.get(ref)

    def entries(self) -> Iterable[Entry]:
        """The entries of every object this transaction touched (a live view)."""
        return self._entries.values()

    def entry_map(self) -> dict[bytes, Entry]:
        """The live map ref -> entry, for a query materialising many objects in a
        tight loop (it adds the entries it makes)."""
        return self._entries

    def has_changes(self) -> bool:
        """Whether committing would write anything (False once the transaction ended)."""
        if self._state is not TxState.ACTIVE:
            return False
        if self._raw_ops or self._async_calls:
            return True
        return any(e.status != CLEAN for e in self._entries.values())

    def write_raw(
        self,
        ops: Iterable[StoreOp],
        *,
        counts: dict[bytes, int] | None = None,
        first: bool = False,
    ) -> None:
        """Add store operations to this transaction's commit, after its objects' writes.

        ``ops``: ``(is_put, database, key, value)`` on engine databases (``results``,
        ``asyncq``, ``bulk``...) or records a bulk write built itself; ``counts``:
        the extent count changes of such records, by ``store.count_key(type name,
        ref)`` (type and location); ``first``: before
        the raw operations added so far.  They commit with the transaction or not
        at all; nothing locks them: lock what they stand for with :meth:`need`.
        """
        if first:
            self._raw_ops[:0] = ops
        else:
            self._raw_ops.extend(ops)
        if counts:
            raw_counts = self._raw_counts
            for name, delta in counts.items():
                raw_counts[name] = raw_counts.get(name, 0) + delta

    def raw_op_count(self) -> int:
        """How many raw store operations :meth:`write_raw` added so far (a bulk swap's
        size, which has no entries)."""
        return len(self._raw_ops)

    def raw_ops(self) -> Sequence[StoreOp]:
        """The raw store operations :meth:`write_raw` added so far, in order."""
        return self._raw_ops

    def queued_calls(self) -> Sequence[tuple[bytes, bytes]]:
        """The asynchronous calls queued so far: (queue key, record), in order."""
        return self._async_calls

    def discard_changes(self) -> None:
        """Undo every change made so far but keep the locks (a savepoint at the start).

        Used to record the outcome of an aborted request in the same transaction
        (see ``nonstop.tx.requests``).  Objects are re-read from the store, which is
        safe: this transaction still holds the write lock of everything it changed.
        """
        store = self.engine.store
        for e in list(self._entries.values()):
            if e.status in (CREATED, CREATED_DELETED):
                e.status = CREATED_DELETED
            elif e.status in (DIRTY, DELETED):
                rec = store.get_object(e.ref)
                if rec is None:
                    e.status = CREATED_DELETED  # gone: nothing of ours to write
                    continue
                fresh = self.entry_from_record(e.ref, rec, e.lock)
                e.state, e.version, e.status = fresh.state, fresh.version, CLEAN
                e.orig, e.triggered = None, False
                fresh.handle = None
                self._entries[e.ref] = e
        self._claimed.clear()
        self._async_calls.clear()
        self._raw_ops.clear()
        self._raw_counts.clear()

    # ------------------------------------------------------------- commit
    def _lookup_args(
        self, cls: type[Managed], key: dict[str, Any], lock: str | None
    ) -> tuple[TypeInfo, KeyInfo, Any, int]:
        info = self.engine.ensure_type(cls)
        self.enter_types(info)
        k, value = unique_lookup(info, key)
        if isinstance(value, Managed):
            value = Ref(value._e.ref)
        mode = parse_lock(lock)
        return info, k, value, self.default_lock if mode is None else mode

    def _prepare_commit(self) -> WriteSet | None:
        self.check_usable()
        self._state = TxState.COMMITTING
        try:
            self._run_update_triggers()
            for fn in self._on_prepare:
                fn()
            return self._build_writeset()
        except BaseException:
            self._finish(TxState.ROLLED_BACK)
            raise

    def _run_update_triggers(self) -> None:
        # Triggers may change more objects; run until none is left untriggered.
        for _ in range(100):
            pending = [
                e
                for e in self._entries.values()
                if e.status == DIRTY and not e.triggered and e.info.has_on_update
            ]
            if not pending:
                return
            self._state = TxState.ACTIVE  # triggers use the transaction normally
            try:
                for e in pending:
                    e.triggered = True
                    e.handle.on_update()
            finally:
                self._state = TxState.COMMITTING
        raise Error("update triggers kept changing objects (more than 100 rounds)")

    def _build_writeset(self) -> WriteSet | None:
        store = self.engine.store
        ws = WriteSet()
        ops = ws.ops
        deltas = ws.count_deltas
        objects, extents = store.objects, store.extents
        # Index removals go first: a unique value one object gives up may be taken by
        # another object of this transaction, whose put must not be deleted after it.
        removals: list[Any] = []
        for e in self._entries.values():
            status = e.status
            if status in (CLEAN, CREATED_DELETED):
                continue
            info = e.info
            tname = info.name.encode()
            ref = e.ref
            if status == DELETED:
                ops.append((False, objects, ref, None))
                ops.append((False, extents, tname + b"\x00" + ref, None))
                ck = tname + b"\x00" + ref[:8]  # (store.count_key, inlined)
                deltas[ck] = deltas.get(ck, 0) - 1
                for name, key in info.keys.items():
                    value = e.orig[name] if e.orig and name in e.orig else e.state[name]
                    self._index_op(removals, key, value, ref, put=False)
                continue
            ops.append((True, objects, ref, pack_record(info, e.version + 1, e.state)))
            if status == CREATED:
                ops.append((True, extents, tname + b"\x00" + ref, b""))
                ck = tname + b"\x00" + ref[:8]
                deltas[ck] = deltas.get(ck, 0) + 1
                for name, key in info.keys.items():
                    self._index_op(ops, key, e.state[name], ref, put=True)
            elif e.orig:
                for name, old in e.orig.items():
                    if old != e.state[name]:
                        key = info.keys[name]
                        self._index_op(removals, key, old, ref, put=False)
                        self._index_op(ops, key, e.state[name], ref, put=True)
        for qkey, record in self._async_calls:
            ops.append((True, store.asyncq, qkey, record))
        ops.extend(self._raw_ops)
        for ck, delta in self._raw_counts.items():
            deltas[ck] = deltas.get(ck, 0) + delta
        ws.ops = removals + ops
        return ws if ws.ops else None

    def _index_op(self, ops: list[Any], key: KeyInfo, value: Any, ref: bytes, *, put: bool) -> None:
        db = self.engine.store.index_db(key.db_name, unique=key.options.unique)
        if key.options.unique:
            if value is None:
                return  # not indexed (see _g_claim)
            ops.append((put, db, encode_key(value), ref if put else None))
        else:
            ops.append((put, db, encode_key(value), ref))

    def _finish(self, outcome: TxState) -> None:
        self._state = outcome
        self._close_view()
        self.engine.locks.release_all(self.id)
        if outcome is TxState.COMMITTED:
            if self._async_calls:
                self.engine.dispatcher.committed(self._async_calls)
            callbacks = self._on_commit
        else:
            callbacks = self._on_rollback
        for fn in callbacks:
            try:
                fn()
            except Exception:  # the outcome is decided; a notifier cannot change it
                log.exception("transaction notifier failed after %s", outcome.value)
        # Break the entry <-> handle and transaction <-> entry cycles so plain
        # reference counting frees a finished transaction at once; handles the
        # application keeps still know their (finished) transaction and say so.
        entries, self._entries = self._entries, {}
        self._claimed = {}
        if len(entries) <= TEARDOWN_SLICE:
            for e in entries.values():
                e.handle = None
            return
        # An overwrite's swap: hundreds of thousands of entries (and as many write-set
        # ops), 0.1 s and more to free in one step: a slice per turn of the node's loop,
        # the cyclic GC held off until the last (it would walk all of them meanwhile).
        gtid, ws = self._prepared
        self._prepared = (gtid, WriteSet())  # (its gtid: asynchronous phase two reads it)
        raw, self._raw_ops = self._raw_ops, []
        gc_hold.hold()
        self.engine.slices.run(_Teardown(entries, [ws.ops, raw]).step)

    # --------------------------------------------------- async methods (A6)
    def queue_async_call(
        self,
        target: Entry,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        delay: float | None = None,
    ) -> None:
        """Queue ``target.method(*args, **kwargs)`` to run after this transaction commits
        (A6); with ``delay``, as a timer due ``delay`` seconds from now (D20)."""
        from nonstop.tx.asyncmethods import current_sender

        self.check_usable()
        if target.status >= DELETED:
            raise Deleted(f"{target.info.name} object was deleted in this transaction")
        sender = current_sender.get()
        fields = [method, _refs_out(args), _refs_out(kwargs), sender]
        if delay is not None:
            fields.append(time.time() + delay)  # wall clock: it moves with the partition
        try:
            record = pack(fields)
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadArgument(
                f"argument of asynchronous {target.info.name}.{method} cannot be stored: {exc}"
            ) from None
        key = self.engine.dispatcher.next_key(
            target.ref, sender == target.ref, timer=delay is not None
        )
        self._async_calls.append((key, record))

    # ---------------------------------------------------------- context
    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            if self._state is TxState.ACTIVE:
                self.commit()
            # A prepared transaction waits for phase two; leaving the block keeps it.
        else:
            self.rollback()

    def __repr__(self) -> str:
        return f"<Transaction {self.id} {self.isolation.value} {self._state.value}>"


def transaction_of(obj: Managed) -> Transaction:
    """The transaction a managed object was obtained in.

    Lets code that only has an object — a trigger, an asynchronous method, a
    helper — look up, create or delete other objects in the same transaction.
    """
    if not isinstance(obj, Managed):
        raise BadArgument(f"expected a managed object, got {type(obj).__name__}")
    tx: Transaction = obj._e.tx  # (or a remote transaction: both keep _state)
    if tx._state is not TxState.ACTIVE:
        raise ObjectNotInTransaction(
            f"{type(obj).__name__} object's transaction is {tx._state.value}"
        )
    return tx


def _refs_out(value: Any) -> Any:
    """Managed handles in async-call arguments travel as references."""
    if isinstance(value, Managed):
        return Ref(value._e.ref)
    if isinstance(value, tuple | list):
        return [_refs_out(v) for v in value]
    if isinstance(value, dict):
        return {k: _refs_out(v) for k, v in value.items()}
    return value


def resolve_type(cls: type[Managed] | str) -> TypeInfo:
    return lookup_type(cls) if isinstance(cls, str) else type_info(cls)


__all__ = [
    "CLEAN",
    "CREATED",
    "CREATED_DELETED",
    "DELETED",
    "DIRTY",
    "NONE",
    "READ",
    "WRITE",
    "Entry",
    "Isolation",
    "Op",
    "Transaction",
    "TxState",
    "describe_key",
    "parse_lock",
    "resolve_type",
    "transaction_of",
    "unique_lookup",
]


TEARDOWN_SLICE = 2000
"""Entries (or write-set ops) a finished transaction frees per step; one with no more
frees them at once, as any ordinary transaction."""


class _Teardown:
    """Frees a finished large transaction's entries and op lists a slice at a time
    (:mod:`nonstop.tx.loop_slices`); the GC hold taken for it ends with the last slice."""

    __slots__ = ("entries", "lists")

    def __init__(self, entries: dict[bytes, Entry], lists: list[list[Any]]) -> None:
        self.entries = entries
        self.lists = lists

    def step(self) -> bool:
        entries = self.entries
        if entries:
            popitem = entries.popitem
            for _ in range(min(TEARDOWN_SLICE, len(entries))):
                popitem()[1].handle = None  # (the entry, then its handle, freed here)
            return False
        lists = self.lists
        while lists and not lists[-1]:
            lists.pop()
        if lists:
            del lists[-1][-TEARDOWN_SLICE:]
            return False
        gc_hold.release()
        return True
