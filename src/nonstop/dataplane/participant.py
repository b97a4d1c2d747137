"""The two-phase-commit participant on the real store, and the decision protocol's persister.

:class:`StoreResourceManager` is the :class:`nonstop.dtx.protocol.ResourceManager`
of a node: a branch is an interactive :class:`~nonstop.tx.async_transaction.
AsyncTransaction` that the node's data service holds open (data-path.md §4);
at prepare its write set is applied under write locks, triggers and prepare
notifiers run, and the prepared write set is computed -- asynchronously, on the
running event loop -- and the result is fed back to the machine as a
``{"t": "dtx.rm", "p": [Ready | Refused | Working]}`` message from the node to itself.

:class:`DtxPersister` carries out the machine's ``Persist`` actions for its
``dtx/...`` keys in the object store's ``dtx`` database, through the store's
group committer, and makes the machine's state and the store's state move
**together** (dtx.md §8.2):

* ``dtx/p/<gtid>`` written (the machine records a prepared branch): the store's
  prepared record of that branch is in the same store commit; only once it is
  durable is the transaction in doubt (``db.in_doubt()``), locks kept;
* ``dtx/p/<gtid>`` deleted and/or ``dtx/t/<gtid>`` written (the outcome
  applied, its tombstone): the phase-two effect (the prepared write set
  applied and the prepared record dropped, or just dropped for an abort) is in
  the same store commit; once durable the locks are released.

So after any crash the store's in-doubt set equals the machine's ``dtx/p/``
keys, and an outcome tombstone exists exactly when its effect is applied.

The group committer applies a group's deletes before its puts.  That is safe
for the machine's keys because it deletes a key only after the ``Persisted`` of
the write that put it (a record after its transaction finished, a prepared key
after the prepare, a tombstone after it was acknowledged), so a put and a
later delete of one key never share a group; and for objects because locks are
held until the phase-two write set is durable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nonstop.dataplane.replicated_records import replicated_records
from nonstop.dtx.decisions import COMMIT
from nonstop.dtx.protocol import K_PREPARED, K_TOMB, Progress, Ready, Refused, Working
from nonstop.errors import (
    Conflict,
    Deadlock,
    FieldError,
    LockTimeout,
    NotActive,
    StoreError,
    Unavailable,
)
from nonstop.model.codec import pack, unpack
from nonstop.model.ref import Ref
from nonstop.runtime.thread_priority import bulk_executor
from nonstop.store.group_commit import Op, WriteSet
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.database import Database
from nonstop.tx.prepared import PreparedTransaction
from nonstop.tx.query import gc_paused
from nonstop.tx.transaction import Transaction

log = logging.getLogger("nonstop.dataplane.participant")

K_DTX = b"dtx/"

BRANCH = "b"
"""Op ``["b", branch id]``: the data service's open transaction this branch prepares."""
WRITE = "w"
"""Op ``["w", ref, type, version read, packed {field: value}]`` (``model.wire.write_out``)."""

# Reasons of a no vote the data service maps back to errors (data-path.md §5):
# the first three are worth replaying (B7), the others are not.
CONFLICT = "conflict"
LOCK_TIMEOUT = "lock timeout"
DEADLOCK = "deadlock"
BRANCH_GONE = "branch gone"
NOT_ACTIVE = "not active"
"""The prepared write set could not reach the partition's sync replicas (this node does not
act for it now): a no vote worth replaying (``NotActive``).  (The simulator's store votes
``"not replicated"``, which stays a plain ``Aborted`` there.)"""

RECORD = pack({"store": 1})
"""The machine's record of a prepared branch: the write set itself is the store's
(``prepared`` database, recovered by ``Database``), so this only names where it is."""

_MAX_OPS = 100_000


@dataclass(slots=True)
class _Branch:
    branch_id: str
    tx: AsyncTransaction | None
    """The data service's transaction; None for a branch recovered after a restart."""
    task: asyncio.Task[None] | None = None
    ready: bool = False
    """Its prepared write set is computed (staged in ``db.engine.prepared`` for the persister)."""


class StoreResourceManager:
    """The participant's store for :class:`~nonstop.dtx.protocol.DtxNode` (module doc).

    ``lookup_branch(branch_id)`` returns the data service's open transaction of
    that branch (None if there is none); ``feed(progress)`` hands results computed
    later to the machine (the runtime delivers them as
    ``Received(sender=<this node>, {"t": "dtx.rm", "p": progress})``).

    Once :meth:`open` accepted a branch, its transaction belongs to the
    two-phase commit: the data service must not commit or roll it back (its
    outcome, or the machine's ``branch_timeout``, ends it).
    """

    def __init__(
        self,
        db: Database,
        lookup_branch: Callable[[str], AsyncTransaction | None],
        feed: Callable[[list[Progress]], None],
        branch_lapsed: Callable[[str], bool] | None = None,
    ) -> None:
        self.db = db
        self.prepared = db.engine.prepared
        self.lookup_branch = lookup_branch
        self.feed = feed
        self.branch_lapsed = branch_lapsed
        """Whether ``lookup_branch`` refused a branch only because this node's lease lapsed
        (``DataPlane.vote_lapsed``): the prepare then waits for the lease (:meth:`open`)."""
        self._vote_waits: dict[str, asyncio.Task[None]] = {}
        """gtid → the prepare waiting out a lapse of the lease before it takes its branch."""
        self._branches: dict[str, _Branch] = {}
        self.replicator: Any = None
        """Sync replication of partitions (``nonstop.node.replicated.StoreSide``), or None:
        ``await prepare(gtid, records)`` before the yes vote, ``outcome(gtid, commit)`` at
        phase two (replication.md §10c)."""
        # Branches finished here whose phase two the persister may still be writing:
        # branch id -> gtid (for holds(); pruned as they leave the in-doubt set).
        self._ending: dict[str, bytes] = {}

    # ------------------------------------------------------------ protocol
    def check_ops(self, ops: Any) -> str | None:
        """Why ``ops`` is not ``[["b", id], ["w", ref, type, version, changes], ...]``."""
        if not isinstance(ops, list) or not ops or len(ops) > _MAX_OPS:
            return "ops must be a non-empty list"
        first = ops[0]
        if not (
            isinstance(first, list)
            and len(first) == 2
            and first[0] == BRANCH
            and isinstance(first[1], str)
            and first[1]
        ):
            return 'the first op must be ["b", branch id]'
        for op in ops[1:]:
            if not (
                isinstance(op, list)
                and len(op) == 5
                and op[0] == WRITE
                and isinstance(op[1], bytes)
                and len(op[1]) == 20
                and isinstance(op[2], str)
                and isinstance(op[3], int)
                and not isinstance(op[3], bool)
                and op[3] >= 0
                and isinstance(op[4], bytes)
            ):
                return f"bad write {op!r:.80}"
        return None

    def open(self, gtid: str, ops: list[Any]) -> list[Progress]:
        """Prepare the branch asynchronously; refuse at once when its transaction is gone.

        A branch refused only because this node's lease lapsed (the partitions its ops
        touched are still this node's, at the same epochs) is asked for again until the
        node acts (then prepared as if it had just come) or :data:`VOTE_LAPSE_WAIT` passes
        (then refused): the data plane's ops wait out a lapse alike (``lapse_waits.py``),
        and a no vote for a lapse aborted another client's transaction during a large
        swap although nothing moved.
        """
        branch_id = ops[0][1]
        if gtid in self._vote_waits:
            return []  # (a prepare sent again)
        tx = self.lookup_branch(branch_id)
        if tx is None and self.branch_lapsed is not None and self.branch_lapsed(branch_id):
            task = asyncio.get_running_loop().create_task(
                self._open_when_acting(gtid, ops), name=f"dtx-vote-wait-{gtid}"
            )
            self._vote_waits[gtid] = task
            return []
        return self._take(gtid, ops, tx)

    async def _open_when_acting(self, gtid: str, ops: list[Any]) -> None:
        branch_id = ops[0][1]
        loop = asyncio.get_running_loop()
        until = loop.time() + VOTE_LAPSE_WAIT
        tx = None
        try:
            while loop.time() < until:
                await asyncio.sleep(VOTE_LAPSE_POLL)
                tx = self.lookup_branch(branch_id)
                lapsed = self.branch_lapsed is not None and self.branch_lapsed(branch_id)
                if tx is not None or not lapsed:
                    break
        except asyncio.CancelledError:
            return  # finish() ended it (its coordinator aborted)
        if self._vote_waits.pop(gtid, None) is None:
            return
        progress = self._take(gtid, ops, tx)
        if progress:
            self.feed(progress)

    def _take(self, gtid: str, ops: list[Any], tx: AsyncTransaction | None) -> list[Progress]:
        """Prepare the branch whose transaction ``lookup_branch`` gave (or refuse)."""
        branch_id = ops[0][1]
        if tx is None or not tx.active:
            return [Refused(gtid, BRANCH_GONE)]
        if any(b.tx is tx for b in self._branches.values()):
            return [Refused(gtid, "branch already in another global transaction")]
        b = _Branch(branch_id, tx)
        self._branches[gtid] = b
        b.task = asyncio.get_running_loop().create_task(
            self._prepare(gtid, b, [op[1:] for op in ops[1:]]),
            name=f"dtx-prepare-{gtid}",
        )
        return []

    def finish(
        self, gtid: str, commit: bool
    ) -> tuple[list[tuple[bytes, bytes | None]], list[Progress]]:
        """End the branch in memory.

        A prepared branch's durable effect is written by :class:`DtxPersister`
        with the machine's tombstone, so nothing is returned here.  A branch not
        (durably) prepared yet can only be aborted: its preparation stops and its
        transaction rolls back now, releasing its locks.  Lock waiters resume on
        their own (they are asyncio tasks), so there is no progress to report.
        """
        if self.replicator is not None:
            self.replicator.outcome(gtid, commit)
        waiting = self._vote_waits.pop(gtid, None)
        if waiting is not None:
            waiting.cancel()  # (never voted: nothing was taken, its branch is the data plane's)
            return [], []
        b = self._branches.pop(gtid, None)
        if b is None or b.tx is None:
            return [], []
        key = gtid.encode()
        if key in self.prepared:
            # Durably prepared: the persister ends it with the outcome's write.
            for bid, g in list(self._ending.items()):  # keep it to the ones in flight
                if g not in self.prepared:
                    del self._ending[bid]
            self._ending[b.branch_id] = key
            return [], []
        if commit:
            raise AssertionError(f"{gtid}: commit of a branch that never prepared")
        if b.task is not None and not b.task.done():
            b.task.cancel()
        self.prepared.unstage(key)
        Transaction.rollback(b.tx)
        return [], []

    def recover(self, gtid: str, record: bytes) -> None:
        """Link a prepared branch the machine recovered to the store's transaction in doubt.

        ``Database`` recovered it at open (``db.in_doubt()``), holding its write
        locks; the two are written in one store commit, so it must be there.
        """
        if gtid.encode() not in self.prepared:
            raise StoreError(
                f"the decision protocol has {gtid} prepared but the store does not: "
                "the dtx state does not belong to this store"
            )
        self._branches[gtid] = _Branch("", None, ready=True)

    # ------------------------------------------------------------ inspection
    def holds(self, branch_id: str) -> bool:
        """Whether the branch's transaction belongs to a two-phase commit now.

        The data service must then neither commit nor roll it back (nor idle it out).
        True from :meth:`open` until the outcome is durable (also after :meth:`finish`,
        while the persister still commits the phase-two write set).
        """
        if any(b.branch_id == branch_id for b in self._branches.values()):
            return True
        gtid = self._ending.get(branch_id)
        if gtid is not None and gtid not in self.prepared:
            del self._ending[branch_id]  # phase two is durable: done
            gtid = None
        return gtid is not None

    def branches(self) -> dict[str, str]:
        """gtid -> "preparing" / "ready" / "recovered", for status pages and tests."""
        return {
            g: ("recovered" if b.tx is None else "ready" if b.ready else "preparing")
            for g, b in sorted(self._branches.items())
        }

    # ------------------------------------------------------------ internals
    async def _prepare(self, gtid: str, b: _Branch, writes: list[list[Any]]) -> None:
        tx = b.tx
        assert tx is not None
        reason: str | None = None
        record: WriteSet | None = None
        try:
            for ref, type_name, version, changes in writes:
                await _apply_write(tx, ref, type_name, version, changes)
            large = len(tx.entry_map()) + tx.raw_op_count() // 4 >= LARGE_PREPARE
            if not large:
                record = tx.prepare_write_set(gtid.encode(), keep_read_only=True)
            else:  # an overwrite's swap: seconds of encoding, off the event loop
                # (its ops are over, no lock wait is left: the machine lets it run past
                # branch_timeout, up to prepare_limit, and tells the coordinator: dtx.md §5)
                self.feed([Working(gtid)])
                loop = asyncio.get_running_loop()
                record = await loop.run_in_executor(
                    bulk_executor(), _prepare_large, tx, gtid.encode()
                )
            if self.replicator is not None and record is not None:
                try:  # on every in-sync copy of each partition before the yes vote
                    # (with the request records: a homed request's, requests.md)
                    # (and its queued calls, A6: ha.md "Queued calls and timers ...")
                    if large:  # (an overwrite by partition: its records off the loop too)
                        records = await asyncio.get_running_loop().run_in_executor(
                            bulk_executor(), _replica_records, tx
                        )
                    else:
                        records = _replica_records(tx)
                    await self.replicator.prepare(gtid, records)
                except (NotActive, Unavailable) as exc:
                    reason = NOT_ACTIVE
                    log.info("dtx %s refused: %s", gtid, exc)
        except asyncio.CancelledError:
            return  # finish() ended the branch (and rolls the transaction back)
        except LockTimeout:
            reason = LOCK_TIMEOUT
        except Deadlock:
            reason = DEADLOCK
        except Conflict as exc:
            reason = CONFLICT
            log.info("dtx %s refused: %s", gtid, exc)
        except Exception as exc:  # a trigger, a notifier, a bad value: vote no, say why
            reason = f"{type(exc).__name__}: {exc}"
        if self._branches.get(gtid) is not b:
            return  # ended meanwhile
        if reason is not None:
            del self._branches[gtid]
            Transaction.rollback(tx)
            self.feed([Refused(gtid, reason)])
            return
        assert record is not None
        b.ready = True
        self.prepared.stage(gtid.encode(), tx, record)
        self.feed([Ready(gtid, RECORD, {})])


def _replica_records(tx: Transaction) -> list[list[Any]]:
    """What the sync replicas get of a prepared branch (``replicated_records``: nothing
    else uses ``tx`` meanwhile, see :data:`LARGE_PREPARE`)."""
    return replicated_records(tx)


VOTE_LAPSE_WAIT = 2.0
"""Seconds a prepare waits out a lapse of this node's lease before it votes no (as the data
plane's ops, ``DataPlaneConfig.lapse_wait``; under the participant's ``branch_timeout``)."""
VOTE_LAPSE_POLL = 0.02
"""How often the waiting prepare asks again (the lease comes back with a renewal applied)."""

LARGE_PREPARE = 2000
"""Objects a branch touched (entries, or raw operations / 4: a bulk swap's) from
which its prepare (encoding its write set: about 30 µs an object) runs on a
worker thread rather than on the node's event loop.  Nothing else uses the
transaction meanwhile: its ops are over, and the lock table is only read (the
locks it holds)."""


def _prepare_large(tx: AsyncTransaction, gtid: bytes) -> WriteSet | None:
    with gc_paused():  # (its allocations would make the GC scan the whole transaction)
        return tx.prepare_write_set(gtid, keep_read_only=True)


async def _apply_write(
    tx: AsyncTransaction, ref: bytes, type_name: str, version: int, packed: bytes
) -> None:
    """Apply one write-set entry under a write lock; Conflict if it is not what the client read."""
    changes = unpack(packed)
    if not isinstance(changes, dict):
        raise FieldError("a write's changes must be a map of field -> value")
    obj = await tx.by_ref(Ref(ref), lock="write")
    if obj is None:
        raise Conflict(f"object {ref.hex()} no longer exists")
    e = tx.entry_of(obj)
    if e.info.name != type_name:
        raise FieldError(f"object {ref.hex()} is a {e.info.name}, not a {type_name}")
    if e.version != version:
        raise Conflict(
            f"{type_name} {ref.hex()} is at version {e.version}; the write was based on {version}"
        )
    for name, value in changes.items():
        if not (isinstance(name, str) and name in e.info.fields):
            raise FieldError(f"{type_name} has no field {name!r}")
        # A reference field takes the Ref as is: its object may live on another node.
        setattr(obj, name, value)


class DtxPersister:
    """Writes the machine's ``dtx/...`` keys atomically with the store's 2PC effects (module doc).

    ``persist`` is called on the event loop, once per ``Persist`` action, in
    order; ``done`` is called from the store's writer thread once the writes are
    durable (or failed), after the store's in-memory state (in doubt, locks)
    reflects them, so the machine never acts on a prepared branch the store
    does not yet hold in doubt.  Notifiers (``on_commit``/``on_rollback``) of a
    transaction ended here run in that writer thread too.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.engine = db.engine
        self._resolving: set[bytes] = set()

    def persist(
        self,
        writes: Sequence[tuple[bytes, bytes | None]],
        done: Callable[[BaseException | None], None],
    ) -> None:
        """Commit ``writes`` (and the 2PC effects they imply) as one store write set."""
        store = self.engine.store
        ops: list[Op] = []
        deltas: dict[bytes, int] = {}
        after: list[Callable[[], None]] = []
        undo: list[Callable[[], None]] = []
        tombs: dict[bytes, bytes] = {}
        ended: list[bytes] = []
        for key, value in writes:
            if not key.startswith(K_DTX):
                raise ValueError(f"not a dtx key: {key!r:.60}")
            ops.append((value is not None, store.dtx, key, value))
            if key.startswith(K_TOMB) and value is not None:
                tombs[key[len(K_TOMB) :]] = value
            elif key.startswith(K_PREPARED):
                gtid = key[len(K_PREPARED) :]
                if value is None:
                    ended.append(gtid)
                else:
                    ops.extend(self._prepared(gtid, after, undo))
        for gtid in dict.fromkeys([*ended, *tombs]):
            commit = tombs.get(gtid) == COMMIT.encode()
            ws = self._phase_two(gtid, commit, after, undo)
            if ws is not None:
                ops.extend(ws.ops)
                for name, delta in ws.count_deltas.items():
                    deltas[name] = deltas.get(name, 0) + delta

        def committed(exc: BaseException | None) -> None:
            for fn in after if exc is None else undo:
                try:
                    fn()
                except Exception:  # the commit's outcome stands; report and go on
                    log.exception("dtx persister: after-commit step failed")
            done(exc)

        try:
            self.engine.committer.submit(WriteSet(ops, deltas), committed)
        except BaseException:
            for fn in undo:
                fn()
            raise

    def _prepared(
        self, gtid: bytes, after: list[Callable[[], None]], undo: list[Callable[[], None]]
    ) -> list[Op]:
        """The store's prepared record of ``gtid``, committed with the machine's ``dtx/p/``."""
        pending = self.engine.prepared.unstage(gtid)
        if pending is None:
            # A bug: the machine records a branch only after the RM said Ready.
            raise StoreError(f"no prepared write set for {gtid!r} to persist")
        tx, record = pending

        def failed() -> None:
            Transaction.rollback(tx)  # not durable: vote-less, locks go

        journal = self.engine.commit_journal
        after.append(tx.prepared_durable)
        # Noted after the store commit, before the machine votes (snapshot_cut.py).
        after.append(lambda: journal.note_prepared(gtid.decode(), time.monotonic()))
        undo.append(failed)
        return record.ops

    def _phase_two(
        self,
        gtid: bytes,
        commit: bool,
        after: list[Callable[[], None]],
        undo: list[Callable[[], None]],
    ) -> WriteSet | None:
        """The outcome's effect on the store, if ``gtid`` is in doubt here (else just the keys)."""
        doubt: PreparedTransaction | None = self.engine.prepared.get(gtid)
        if doubt is None or gtid in self._resolving:
            return None
        self._resolving.add(gtid)

        journal = self.engine.commit_journal

        def ended() -> None:
            # Out of doubt before "not resolving": never both absent-from-resolving and
            # still in doubt, which would let a second outcome write apply it again.
            doubt.phase_two_durable(commit)
            self._resolving.discard(gtid)
            if commit:  # visible now; noted before the machine acknowledges phase two
                journal.note_applied(gtid.decode(), time.monotonic())

        after.append(ended)
        undo.append(lambda: self._resolving.discard(gtid))
        return doubt.phase_two(commit)


def recovered_dtx_state(db: Database) -> dict[bytes, bytes]:
    """The machine's durable keys (``recovered`` for ``DtxNode``): the ``dtx`` database."""
    store = db.engine.store
    with store.read() as rtxn:
        return {bytes(k): bytes(v) for k, v in rtxn.cursor(db=store.dtx)}


__all__ = [
    "BRANCH",
    "BRANCH_GONE",
    "CONFLICT",
    "DEADLOCK",
    "LOCK_TIMEOUT",
    "RECORD",
    "WRITE",
    "DtxPersister",
    "StoreResourceManager",
    "recovered_dtx_state",
]
