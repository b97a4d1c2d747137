"""A simulated object store for the data-plane machine, faithful where the data path cares.

The data-plane machine (:class:`nonstop.dataplane.machine.DataPlane`) never
touches a store: it emits ``Exec`` (run a branch op), ``EndBranch`` (roll a
branch back) and hears ``BranchDone``.  In production an ``AsyncTransaction``
of the LMDB store runs them; in the simulator this module does, sans-I/O:

* **Objects** -- ``[ref, type, version, state]`` as on the wire, in memory (the
  committed state) and durable through ``Persist`` under ``st/o/<ref>`` (all a
  crash keeps).  Types are declared here (:data:`BANK_TYPES`): fields with
  defaults and unique keys, a per-node unique index rebuilt from the objects.
* **Branches** keyed by branch id, as the real node's branches are: strict
  two-phase locking through the real :class:`nonstop.tx.locks.LockManager`
  (objects, a unique key's absent slot, a request id), so lock waits, deadlock
  victims (``Deadlock``) and lock-wait deadlines (``LockTimeout``, a timer per
  wait) happen as in the store; reads cached per branch, writes buffered in the
  branch until it commits.  A branch's ops run one at a time in the order they
  were emitted (a generator per op that yields each lock it needs: the same
  shape as the real transaction's ``_need``).  A ``Retryable`` error dooms the
  branch (its later ops fail the same way) until it is ended, as
  ``AsyncTransaction`` does.
* **Local commit** (``branch.commit``): the after-images go out in one
  ``Persist``; the branch keeps its locks, and the new state becomes visible,
  only once it is durable (LMDB's group commit: visible at the durable commit).
* **Snapshot branches** read (lock-free) from a view of the committed objects
  and unique index copied at their first such read, as the real transaction
  pins an LMDB read view; a locked read of an object changed since is a
  ``Conflict``.  The cut of a cluster snapshot (``branch.cut_*``,
  :mod:`nonstop.dataplane.snapshot_cut`) is answered from counters of the
  prepares and commits made visible here (``prepared_at``, ``applied_at``).
* **Request results (H1)** -- ``(client, seq) → (ok, value)``, written with
  the branch that records them (``st/r/...``).
* **The participant of two-phase commit** (:class:`SimStoreResourceManager`,
  the :class:`nonstop.dtx.protocol.ResourceManager` of the node): a prepare's
  ops ``[["b", bid], ["w", ...], ...]`` take the data plane's branch over
  (``DataPlane.take_branch(bid)``), apply the write set under write locks and
  prepare the branch's after-images (the prepared record, durable in the
  machine's ``dtx/p/`` key before the yes vote); commit installs them (their
  ``Persist`` is the machine's, atomic with its tombstone), abort releases;
  after a crash :meth:`SimStoreResourceManager.recover` reinstalls a prepared
  branch with its locks.

What the model leaves out versus LMDB (see docs/design/simulation.md): no
on-disk indexes (the unique index is rebuilt from the objects), no ordered or
mutable keys, no range queries, no triggers, methods (``branch.call``) or bulk
overwrites, no result window (every request result is kept), one fixed schema.

The composition (:mod:`nonstop.sim.scenarios.dataplane_node`) drains what the
store produced after each call: :meth:`SimDataStore.take_actions` (``Persist``,
timers, logs), :meth:`SimDataStore.take_done` (``BranchDone`` for the machine)
and :meth:`SimDataStore.take_progress` (prepare results for the dtx machine).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Generator, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nonstop import errors
from nonstop.dataplane.events import BranchDone, Exec
from nonstop.dataplane.results import NOT_COMMITTED_RESULT
from nonstop.dtx.decisions import COMMIT
from nonstop.dtx.protocol import K_PREPARED, K_TOMB, Progress, Ready, Refused
from nonstop.model import codec
from nonstop.model.fields import MISSING
from nonstop.model.managed import Managed, type_info
from nonstop.model.ref import REF_SIZE, Ref
from nonstop.model.wire import error_out, obj_out, write_in
from nonstop.net import plain
from nonstop.runtime.interface import Action, CancelTimer, Log, Persist, SetTimer
from nonstop.sim.scenarios.bank_types import ACCOUNT, TRANSFER, SimAccount, SimTransfer
from nonstop.tx.locks import DeadlockFound, Grant, Granted, LockManager, LockMode

K_OBJ = b"st/o/"
"""+ ref -> codec.pack([type, version, state]): a committed object."""
K_RESULT = b"st/r/"
"""+ client + 0x00 + seq (8 bytes) -> plain.pack([ok, value]): a request's result (H1)."""

TIMER_PREFIX = "st."
"""The store's timers (lock-wait deadlines) all start with this."""
_WAIT = "st.wait."
_VOTE = "st.vote."
"""A prepare waiting out a lapse of the lease asks for its branch again (``VOTE_POLL``)."""
VOTE_LAPSE_WAIT = 0.2
"""Seconds a prepare waits out a lapse of the node's lease before it votes no (the real
participant's ``VOTE_LAPSE_WAIT``, scaled under the simulator's ``branch_timeout``)."""
VOTE_POLL = 0.02

NONE, READ, WRITE = 0, 1, 2
_LOCKS = {"none": NONE, "read": READ, "write": WRITE}
_MODE = {READ: LockMode.READ, WRITE: LockMode.WRITE}

CLEAN, DIRTY, CREATED, DELETED = "clean", "dirty", "created", "deleted"

# No-vote reasons (the same words as dataplane.participant: the data plane maps them).
CONFLICT = "conflict"
LOCK_TIMEOUT = "lock timeout"
DEADLOCK = "deadlock"
BRANCH_GONE = "branch gone"
NOT_REPLICATED = "not replicated"
"""A no vote: the prepared record could not reach the partition's sync replicas (this node
stopped acting for it)."""

_REASONS = {
    "Conflict": CONFLICT,
    "LockTimeout": LOCK_TIMEOUT,
    "Deadlock": DEADLOCK,
    "BranchRolledBack": BRANCH_GONE,
}
"""An error that ended a prepare -> the reason its no vote gives."""

_SEQ = struct.Struct(">Q")
_REPLICATED = "rep:"
"""Lock owner prefix of a prepared record taken over at promotion."""


# ------------------------------------------------------------------ schema
@dataclass(frozen=True, slots=True)
class SimType:
    """A managed type as the simulated store knows it: fields with defaults, unique keys."""

    name: str
    version: int
    defaults: Mapping[str, Any]
    """Every field; a required one (no default) maps to :data:`REQUIRED`."""
    unique: tuple[str, ...] = ()

    @classmethod
    def of(cls, managed: type[Managed]) -> SimType:
        info = type_info(managed)
        defaults: dict[str, Any] = {}
        for name, f in info.fields.items():
            if f.default_factory is not None:
                defaults[name] = f.default_factory()
            else:
                defaults[name] = REQUIRED if f.default is MISSING else f.default
        unique = tuple(k for k, ki in info.keys.items() if ki.options.unique)
        return cls(info.name, info.version, defaults, unique)


REQUIRED: Any = MISSING

BANK_TYPES: Mapping[str, SimType] = {t.name: t for t in map(SimType.of, (SimAccount, SimTransfer))}
"""The bank workload's types (:mod:`nonstop.sim.scenarios.bank_types`)."""


@dataclass(slots=True)
class StoreConfig:
    lock_wait: float = 0.3
    """Lock-wait deadline of every branch (``LockTimeout``; how distributed deadlocks end)."""


# ------------------------------------------------------------------ state
@dataclass(slots=True)
class Obj:
    """A committed object."""

    type: str
    version: int
    state: dict[str, Any]


@dataclass(slots=True)
class Entry:
    """An object as one branch sees it (``version``: the committed version read, 0 if new)."""

    type: str
    version: int
    state: dict[str, Any]
    lock: int
    status: str


Op = Generator[tuple[Hashable, int], None, Any]
"""A branch op: yields ``(resource, mode)`` for each lock it needs, returns its reply."""


@dataclass(slots=True)
class _Job:
    corr: int
    op: str
    fields: dict[str, Any]
    writes: list[Any] | None
    gen: Op | None = None


@dataclass(slots=True)
class _Deferred:
    """A reply that waits until ``writes`` are durable (a local commit)."""

    writes: list[tuple[bytes, bytes | None]]
    reply: dict[str, Any]


@dataclass(slots=True)
class Branch:
    """One branch: the data plane's (``gtid`` None) or, once taken over, two-phase commit's."""

    bid: str
    serializable: bool
    entries: dict[bytes, Entry] = field(default_factory=dict)
    created_keys: dict[tuple[str, str, Any], bytes] = field(default_factory=dict)
    results: dict[tuple[str, int], tuple[bool, Any]] = field(default_factory=dict)
    queue: deque[_Job] = field(default_factory=deque)
    job: _Job | None = None
    ticket: int | None = None
    doomed: errors.Error | None = None
    gtid: str | None = None
    prepared: bool = False
    after: list[list[Any]] = field(default_factory=list)
    """Prepared after-images ``[ref, type, version, state or None]`` (None: deleted)."""
    committing: bool = False
    view: tuple[dict[bytes, Obj], dict[tuple[str, str, Any], bytes]] | None = None
    """A snapshot branch's read view (objects, unique index), pinned at its first lock-free
    read as ``Transaction.committed`` pins an LMDB read view."""
    cut_mark: int | None = None
    """The store's commit counter when the view was pinned for a cluster snapshot's cut."""
    cut_doubt: frozenset[str] = frozenset()
    """The gtids in doubt here when the view was pinned (``dtx/p/`` keys in an LMDB view)."""


class Replicator(Protocol):
    """Where a store's commits and prepares go before they are acknowledged (the composition).

    ``commit``/``prepare`` return an error reply at once when nothing was sent (this node
    does not act for a partition written), else None and call ``done`` later with None
    (every sync replica holds it) or an error reply: with ``"unknown": True`` when the
    outcome is not known here (it may be on a promoted copy), else a definite abort.
    """

    def commit(
        self, after: list[list[Any]], done: Callable[[dict[str, Any] | None], None]
    ) -> dict[str, Any] | None: ...

    def prepare(
        self, gtid: str, after: list[list[Any]], done: Callable[[dict[str, Any] | None], None]
    ) -> dict[str, Any] | None: ...

    def outcome(self, gtid: str, commit: bool, after: list[list[Any]]) -> None:
        """The participant applies ``gtid``'s outcome; ``after``: its prepared after-images."""
        ...

    def lookup(self, client: str, seq: int) -> tuple[tuple[bool, Any] | None, bool]:
        """A request's result in the replicated copies here, and whether a commit that may
        record it is still undecided here."""
        ...


# ------------------------------------------------------------------ the store
class SimDataStore:
    """One node's simulated store (module doc)."""

    def __init__(
        self,
        name: str,
        location: int,
        timestamp: int,
        recovered: Mapping[bytes, bytes],
        config: StoreConfig | None = None,
        types: Mapping[str, SimType] = BANK_TYPES,
    ) -> None:
        self.name = name
        self.location = location
        self.timestamp = timestamp
        self.config = config or StoreConfig()
        self.types = types
        self.now = 0.0
        self.objects: dict[bytes, Obj] = {}
        self.index: dict[tuple[str, str, Any], bytes] = {}
        self.results: dict[tuple[str, int], tuple[bool, Any]] = {}
        self.locks = LockManager()
        self.branches: dict[str, Branch] = {}
        self.rm_branches: dict[str, Branch] = {}
        """gtid -> branch owned by two-phase commit (preparing or prepared)."""
        self.load_waiting: dict[bytes, list[Any]] = {}
        """Images of a partition's copy (:meth:`load`) whose objects a prepared branch here
        writes: installed once that branch ended, if newer (the real node's load waits for
        the branch's write lock, then applies a record only over an older version)."""
        self._waiting: dict[int, Branch] = {}
        self._counter = 0
        self._token = 0
        self._on_durable: dict[int, Callable[[], None]] = {}
        self._internal = 0
        self._actions: list[Action] = []
        self._done: list[BranchDone] = []
        self._progress: list[Progress] = []
        self._rm_call: list[Progress] | None = None
        self.stats: dict[str, int] = {"deadlocks": 0, "lock_timeouts": 0, "conflicts": 0}
        self.replicator: Replicator | None = None
        """Sync replication of partitions (:mod:`.dataplane_replication`); None: none."""
        self.read_latest = False
        """The mutant ``snapshot-reads-latest``: snapshot branches pin no view."""
        self.cut_blind = False
        """The mutant ``blind-snapshot-cut``: ``branch.cut_unsure`` names nothing."""
        self.commits = 0
        """Counter of two-phase notes (the real store's ``CommitJournal.counter``)."""
        self.prepared_at: dict[str, int] = {}
        self.applied_at: dict[str, int] = {}
        """gtid -> counter when its prepare / commit became visible here (never dropped: the
        real store keeps the commit's ``dtx/t/`` tombstone while a participant is in doubt,
        and journals the rest; a crash keeps what the tombstones say)."""
        self.replicate_results = True
        """False only in the mutant ``record-not-replicated``: request records stay out of
        the replicated records (a retry on a promoted copy must catch it)."""
        self.fence_records = True
        """False only in the mutant ``fence-not-recorded``: a fence answers "not committed"
        without recording it (a late attempt of the request may then commit)."""
        self.replicated_prepared: dict[str, list[list[Any]]] = {}
        """gtid -> after-images of a prepared record this node took over at promotion
        (its write locks held under ``rep:<gtid>`` until the outcome is applied)."""
        for key, raw in recovered.items():
            if key.startswith(K_OBJ):
                type_name, version, state = codec.unpack(raw)
                self._put(key[len(K_OBJ) :], Obj(type_name, version, state))
            elif key.startswith(K_TOMB) and raw == COMMIT.encode():
                self.applied_at[key[len(K_TOMB) :].decode()] = 0
            elif key.startswith(K_RESULT):
                rest = key[len(K_RESULT) :]
                client, seq = rest[:-9].decode(), _SEQ.unpack(rest[-8:])[0]
                ok, value = plain.unpack(raw)
                self.results[(client, seq)] = (bool(ok), value)
        self.rm = SimStoreResourceManager(self)

    # ------------------------------------------------------------ outputs
    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def take_done(self) -> list[BranchDone]:
        out, self._done = self._done, []
        return out

    def take_progress(self) -> list[Progress]:
        out, self._progress = self._progress, []
        return out

    def idle(self) -> bool:
        return not (self._actions or self._done or self._progress)

    # ------------------------------------------------------------ the machine's actions
    def execute(self, now: float, action: Exec) -> None:
        """Queue an ``Exec`` on its branch (opening it when ``iso`` says so) and run it."""
        self.now = now
        job = _Job(action.corr, action.op, dict(action.fields), action.writes)
        bid = action.bid
        if bid is None:
            self._outside(job)
            return
        b = self.branches.get(bid)
        if b is None:
            if action.iso is None:
                self._reply(job, _error(errors.BranchRolledBack(f"branch {bid} is over here")))
                return
            if action.iso not in ("serializable", "snapshot"):
                self._reply(job, _error(errors.BadArgument(f"bad isolation {action.iso!r:.40}")))
                return
            if any(r.bid == bid for r in self.rm_branches.values()):
                # The branch went to two-phase commit: it cannot be opened again.
                self._reply(job, _error(errors.BranchRolledBack(f"branch {bid} is committing")))
                return
            b = self.branches[bid] = Branch(bid, action.iso == "serializable")
        b.queue.append(job)
        self._run(b)

    def end(self, now: float, bid: str) -> None:
        """``EndBranch``: roll the branch back (locks released); unanswered ops fail."""
        self.now = now
        b = self.branches.get(bid)
        if b is None or b.committing:
            return
        del self.branches[bid]
        self._abandon(b, errors.BranchRolledBack(f"branch {bid} was rolled back"))
        self._release(b)

    def timer(self, now: float, name: str) -> None:
        """A lock wait passed its deadline: ``LockTimeout`` for that branch (or a prepare
        waiting out a lapse asks again: :meth:`SimStoreResourceManager.vote_timer`)."""
        self.now = now
        if name.startswith(_VOTE):
            self.rm.vote_timer(name[len(_VOTE) :])
            return
        if not name.startswith(_WAIT):
            return
        ticket = int(name[len(_WAIT) :])
        b = self._waiting.pop(ticket, None)
        if b is None or b.ticket != ticket:
            return
        b.ticket = None
        grants = self.locks.cancel(ticket)
        self.stats["lock_timeouts"] += 1
        self._step(b, errors.LockTimeout(f"lock wait over {self.config.lock_wait}s in {b.bid}"))
        self._granted(grants)

    def persisted(self, now: float, token: int) -> None:
        self.now = now
        then = self._on_durable.pop(token, None)
        if then is not None:
            then()

    def in_doubt(self) -> int:
        """Branches prepared here whose outcome is not applied yet."""
        return len(self.in_doubt_names())

    def in_doubt_names(self) -> list[str]:
        """The gtids of :meth:`in_doubt`'s branches, then the taken-over records' names."""
        prepared = sorted(g for g, b in self.rm_branches.items() if b.prepared)
        return prepared + sorted(self.replicated_prepared)

    # ------------------------------------------------------------ running ops
    def _run(self, b: Branch) -> None:
        """Run the branch's ops until one waits for a lock or none is left."""
        while b.job is None and b.queue:
            job = b.job = b.queue.popleft()
            if b.doomed is not None:
                b.job = None
                self._reply(job, _error(b.doomed))
                continue
            job.gen = self._op(b, job)
            self._step(b, None)

    def _step(self, b: Branch, error: errors.Error | None) -> None:
        """Advance the branch's current op (throwing ``error`` into it) until it waits or ends."""
        job = b.job
        assert job is not None and job.gen is not None
        gen = job.gen
        try:
            while True:
                resource, mode = gen.throw(error) if error is not None else next(gen)
                error = None
                result = self.locks.acquire(b.bid, resource, _MODE[mode])
                if isinstance(result, Granted):
                    continue
                if isinstance(result, DeadlockFound):
                    self.stats["deadlocks"] += 1
                    error = errors.Deadlock(f"{b.bid} is the victim of a deadlock")
                    continue
                b.ticket = result.ticket
                self._waiting[result.ticket] = b
                self._actions.append(SetTimer(f"{_WAIT}{result.ticket}", self.config.lock_wait))
                return
        except StopIteration as stop:
            outcome: Any = stop.value
        except errors.Error as exc:
            if isinstance(exc, errors.Retryable):
                b.doomed = exc  # as AsyncTransaction: only rolling back is left
                if isinstance(exc, errors.Conflict):
                    self.stats["conflicts"] += 1
            outcome = _error(exc)
        b.job = None
        if b.gtid is not None:
            self.rm.prepared_or_refused(b, outcome)
            return
        if isinstance(outcome, _Deferred):
            self._commit_local(b, job, outcome)
            return
        self._reply(job, outcome)
        self._run(b)

    def _granted(self, grants: list[Grant]) -> None:
        """Resume the branches whose lock waits ``grants`` ended (and what they release)."""
        work = list(grants)
        while work:
            grant = work.pop(0)
            b = self._waiting.pop(grant.ticket, None)
            if b is None or b.ticket != grant.ticket:
                continue
            b.ticket = None
            self._actions.append(CancelTimer(f"{_WAIT}{grant.ticket}"))
            self._step(b, None)

    def _reply(self, job: _Job, reply: dict[str, Any]) -> None:
        self._done.append(BranchDone(self.now, job.corr, reply))

    def _abandon(self, b: Branch, why: errors.Error) -> None:
        """Stop the branch's ops: the one running (its lock wait withdrawn) and the queued ones."""
        grants: list[Grant] = []
        if b.ticket is not None:
            self._waiting.pop(b.ticket, None)
            self._actions.append(CancelTimer(f"{_WAIT}{b.ticket}"))
            grants = self.locks.cancel(b.ticket)
            b.ticket = None
        jobs = ([b.job] if b.job is not None else []) + list(b.queue)
        b.job = None
        b.queue.clear()
        if b.gtid is None:
            for job in jobs:
                self._reply(job, _error(why))
        self._granted(grants)

    def _release(self, b: Branch) -> None:
        self._granted(self.locks.release_all(b.bid))

    # ------------------------------------------------------------ ops outside a branch
    def _outside(self, job: _Job) -> None:
        op = job.op
        try:
            if op == "request.lookup":
                self._reply(job, self._lookup(_req(job.fields.get("req"))))
            elif op == "request.abort":
                # The outcome of an aborted commit, in a transaction of its own.
                self._internal += 1
                b = self.branches[f"~{self.name}.{self._internal}"] = Branch(
                    f"~{self.name}.{self._internal}", True
                )
                b.queue.append(job)
                self._run(b)
            else:
                raise errors.BadArgument(f"op {op!r:.40} needs a branch")
        except errors.Error as exc:
            self._reply(job, _error(exc))

    def lookup_result(self, key: tuple[str, int]) -> tuple[bool, Any] | None:
        """The request's recorded result in this store or its replicated copies (checks)."""
        found = self.results.get(key)
        if found is None and self.replicator is not None:
            found = self.replicator.lookup(*key)[0]
        return None if found is None else (bool(found[0]), found[1])

    def _lookup(self, key: tuple[str, int]) -> dict[str, Any]:
        """``request.lookup``: the request's recorded result here, or whether it is in doubt."""
        found = self.results.get(key)
        in_doubt = self.in_doubt() > 0
        if self.replicator is not None and found is None:
            # The replicated copies are the commit's record (this store's copy may
            # lag them after a restart): ask them, and what is still undecided.
            found, pending = self.replicator.lookup(*key)
            in_doubt = in_doubt or pending
        if found is not None:
            return {"found": list(found), "in_doubt": False}
        return {"found": None, "in_doubt": in_doubt}

    # ------------------------------------------------------------ branch ops
    def _op(self, b: Branch, job: _Job) -> Op:
        if job.writes:
            yield from self._g_writes(b, job.writes)
        handler = _OPS.get(job.op)
        if handler is None:
            raise errors.BadArgument(f"unknown branch op {job.op!r:.40}")
        reply = yield from handler(self, b, job.fields)
        if job.op == "request.abort":
            # Its own transaction: commit it now (locks held until durable).
            b.committing = True
            return _Deferred(self._after_images(b)[1], reply)
        return reply

    def _g_get(self, b: Branch, f: dict[str, Any]) -> Op:
        t = self._type(f)
        key = _unpacked(f.get("key"), "key")
        if not isinstance(key, dict) or len(key) != 1:
            raise errors.BadArgument("key must be one unique key {field: value}")
        ((fname, value),) = key.items()
        if fname not in t.unique:
            raise errors.BadArgument(f"{t.name}.{fname} is not a unique key")
        mode = self._mode(b, f.get("lock"))
        # A probe of a cluster-scope lookup: no lock on an absent key's slot.
        probe = bool(f.get("if_found")) and f.get("lock") != "none"
        parts = _parts(f)
        for _ in range(8):  # the object may move under our feet while we wait: look again
            ref = self._find(b, t.name, fname, value, latest=bool(mode))
            if ref is not None and parts is not None and ref[:8] not in parts:
                ref = None  # not a partition this node answers for here
            if ref is None:
                if probe:
                    return {"o": None}
                if mode:
                    yield (("k", t.name, fname, value), mode)
                ref = self._find(b, t.name, fname, value)
                if ref is None:
                    return {"o": None}
            e = yield from self._g_load(b, ref, mode)
            if e is not None and e.state.get(fname) == value:
                return {"o": obj_out(ref, e.type, e.version, e.state)}
        raise errors.Conflict(f"{t.name} {fname}={value!r:.40} kept moving")

    def _g_ref(self, b: Branch, f: dict[str, Any]) -> Op:
        ref = _ref(f.get("ref"))
        e = yield from self._g_load(b, ref, self._mode(b, f.get("lock")))
        return {"o": None if e is None else obj_out(ref, e.type, e.version, e.state)}

    def _g_create(self, b: Branch, f: dict[str, Any]) -> Op:
        t = self._type(f)
        st = _unpacked(f.get("st"), "st")
        if not isinstance(st, dict):
            raise errors.BadArgument("st must be a packed {field: value}")
        unknown = sorted(str(k) for k in st if k not in t.defaults)
        if unknown:
            raise errors.FieldError(f"{t.name} has no field {unknown[0]!r}")
        state = {**t.defaults, **st}
        missing = sorted(k for k, v in state.items() if v is REQUIRED)
        if missing:
            raise errors.FieldError(f"{t.name}.{missing[0]} is required")
        for fname in t.unique:
            value = state[fname]
            yield (("k", t.name, fname, value), WRITE)
            if self._find(b, t.name, fname, value) is not None:
                raise errors.DuplicateKey(f"{t.name}.{fname} = {value!r:.40} exists")
        self._counter += 1
        placed = f.get("pl")
        if placed is not None:  # routing by partition: named by the partition at its epoch
            ref = Ref.make(placed[0], placed[1], self._counter).raw
        else:
            ref = Ref.make(self.location, self.timestamp, self._counter).raw
        yield (("o", ref), WRITE)
        b.entries[ref] = Entry(t.name, 0, state, WRITE, CREATED)
        for fname in t.unique:
            b.created_keys[(t.name, fname, state[fname])] = ref
        return {"o": obj_out(ref, t.name, 0, state)}

    def _g_delete(self, b: Branch, f: dict[str, Any]) -> Op:
        ref = _ref(f.get("ref"))
        e = yield from self._g_load(b, ref, WRITE)
        if e is None:
            raise errors.NotFound("no object with this reference")
        t = self.types[e.type]
        for fname in t.unique:
            b.created_keys.pop((t.name, fname, e.state.get(fname)), None)
        if e.status == CREATED:
            del b.entries[ref]
        else:
            e.status = DELETED
        return {}

    def _g_query(self, b: Branch, f: dict[str, Any]) -> Op:
        t = self._type(f)
        where = _unpacked(f["where"], "where") if f.get("where") is not None else {}
        if not isinstance(where, dict):
            raise errors.BadArgument("where must be a packed {field: value}")
        if f.get("range") is not None:
            raise errors.BadArgument("range queries are not simulated")
        mode = self._mode(b, f.get("lock"))
        found: list[tuple[bytes, Entry]] = []
        for ref in self._extent(b, t.name, _parts(f), latest=bool(mode)):
            e = yield from self._g_load(b, ref, mode)
            if e is not None and all(e.state.get(k) == v for k, v in where.items()):
                found.append((ref, e))
        order = f.get("order")
        reply: dict[str, Any] = {}
        if order is not None:
            if not isinstance(order, list) or not order or order[0] not in t.defaults:
                raise errors.BadArgument("order must be [field, descending]")
            desc = bool(order[1]) if len(order) > 1 else False
            found.sort(key=lambda re: (codec.encode_key(re[1].state[order[0]]), re[0]))
            if desc:
                found.reverse()
        limit = f.get("limit")
        if limit is not None:
            if not isinstance(limit, int) or limit < 0:
                raise errors.BadArgument("limit must be an int >= 0")
            found = found[:limit]
        if order is not None:
            reply["k"] = [codec.encode_key(e.state[order[0]]) for _, e in found]
        reply["os"] = [obj_out(ref, e.type, e.version, e.state) for ref, e in found]
        return reply

    def _g_count(self, b: Branch, f: dict[str, Any]) -> Op:
        t = self._type(f)
        return {"n": len(self._extent(b, t.name, _parts(f), latest=False))}
        yield  # a generator, like every op

    # The cut of a cluster snapshot (nonstop.dataplane.snapshot_cut, the real store's
    # run_cut_op): the same answers, from the counters above instead of LMDB keys.
    def _g_cut_open(self, b: Branch, f: dict[str, Any]) -> Op:
        if b.serializable:
            raise errors.BadArgument("only a snapshot branch has a read view")
        if f.get("reset"):
            if any(e.status == CLEAN for e in b.entries.values()):
                raise errors.BadArgument("a snapshot's view cannot move once it was read")
            b.view, b.cut_mark = None, None
        if b.cut_mark is None:
            self._view(b)
            b.cut_mark = self.commits
            b.cut_doubt = frozenset(g for g, rb in self.rm_branches.items() if rb.prepared) | {
                taken_parts(taken)[1] for taken in self.replicated_prepared
            }
        return {}
        yield

    def _g_cut_unsure(self, b: Branch, f: dict[str, Any]) -> Op:
        mark = self._mark(b)
        if self.cut_blind:
            return {"g": []}
        since = {g for g, at in self.prepared_at.items() if at > mark}
        missing = {g for g in since if self.applied_at.get(g, mark + 1) > mark}
        return {"g": sorted(b.cut_doubt | missing)}
        yield

    def _g_cut_seen(self, b: Branch, f: dict[str, Any]) -> Op:
        mark = self._mark(b)
        asked = f.get("g")
        if not isinstance(asked, list):
            raise errors.BadArgument("g must be a list of gtids")
        return {"g": [g for g in asked if self.applied_at.get(g, mark + 1) <= mark]}
        yield

    def _mark(self, b: Branch) -> int:
        if b.cut_mark is None:
            raise errors.BadArgument("a cut op before branch.cut_open")
        return b.cut_mark

    def note_prepared(self, gtid: str) -> None:
        self.commits += 1
        self.prepared_at[gtid] = self.commits

    def note_applied(self, gtid: str) -> None:
        self.commits += 1
        self.applied_at[gtid] = self.commits

    def _g_nothing(self, b: Branch, f: dict[str, Any]) -> Op:
        return {}
        yield

    def _g_unsupported(self, b: Branch, f: dict[str, Any]) -> Op:
        raise errors.BadArgument("methods and overwrites are not simulated")
        yield

    def _g_claim(self, b: Branch, key: tuple[str, int]) -> Generator[Any, None, Any]:
        """Lock the request's slot, then look its result up (two retries cannot both run)."""
        yield (("q", *key), WRITE)
        return b.results.get(key) or self.results.get(key)

    def _g_record(self, b: Branch, f: dict[str, Any]) -> Op:
        """The commit's result, in the branch that commits it (H1); ``done`` if it ran before."""
        key = _req(f.get("req"))
        if key in b.results:
            # This branch recorded it already: the same op again (a peer's data.req
            # duplicated or resent), not a second attempt of the request.
            return {}
        found = yield from self._g_claim(b, key)
        if found is not None:
            return {"done": list(found)}
        b.results[key] = (True, None)
        return {}

    def _g_lookup(self, b: Branch, f: dict[str, Any]) -> Op:
        """``request.lookup`` on the home node's branch (a homed request, requests.md): the
        slot read-locked first, so an attempt that claimed it (running, or prepared) is
        waited for instead of being answered "unknown"."""
        key = _req(f.get("req"))
        if f.get("fence") is not True:
            yield (("q", *key), READ)
            return self._lookup(key)
        # With ``fence`` (requests.md section 3): the slot write-locked, then -- nothing
        # recorded and nothing in doubt here -- "not committed" recorded in this branch,
        # which the asking node commits: no attempt of the request can commit after it.
        yield from self._g_claim(b, key)
        answer = self._lookup(key)
        if answer["found"] is not None or answer["in_doubt"]:
            return answer
        if self.fence_records:
            b.results[key] = (False, list(NOT_COMMITTED_RESULT))
        return {"found": None, "in_doubt": False, "fenced": True}

    def _g_abort(self, b: Branch, f: dict[str, Any]) -> Op:
        """An aborted commit's outcome, in a transaction of its own (unless one is recorded)."""
        key = _req(f.get("req"))
        found = yield from self._g_claim(b, key)
        if found is None:
            b.results[key] = (False, [f.get("error"), f.get("message")])
        return {}

    def _g_commit(self, b: Branch, f: dict[str, Any]) -> Op:
        """One local group commit of the branch, with the request's result (data-path.md §5)."""
        if f.get("req") is not None:
            reply = yield from self._g_record(b, f)
            if "done" in reply:
                return reply  # it committed (or aborted) before: this attempt commits nothing
        b.committing = True
        return _Deferred(self._after_images(b)[1], {})

    # ------------------------------------------------------------ reading
    def _g_load(self, b: Branch, ref: bytes, mode: int) -> Generator[Any, None, Entry | None]:
        """The branch's entry for ``ref`` with at least ``mode`` locked; None if there is none."""
        e = b.entries.get(ref)
        if e is not None:
            if e.status == DELETED:
                return None
            if mode > e.lock:
                yield (("o", ref), mode)
                if e.status == CLEAN:
                    obj = self.objects.get(ref)
                    if b.serializable and e.lock == NONE:
                        # Read without a lock before: read again now that it is locked.
                        if obj is None:
                            raise errors.Conflict(f"{e.type} object was deleted concurrently")
                        e.version, e.state = obj.version, dict(obj.state)
                    elif mode == WRITE and (obj is None or obj.version != e.version):
                        raise errors.Conflict(f"{e.type} object changed since this branch read it")
                e.lock = mode
            return e
        if mode:
            yield (("o", ref), mode)
            if not b.serializable and self._version(b, ref, self._view(b)[0]) != self._version(
                b, ref, self.objects
            ):
                # Snapshot: locked now, but changed since the view (Transaction.g_load).
                raise errors.Conflict(f"object {Ref(ref)} changed since this snapshot began")
        elif self._taken_over(ref):
            # A prepared record this node took over at promotion holds it: its commit may have
            # been acknowledged already (the participant that applied it is the one the reply
            # names as not applied, not this node), so the state before it must not be read
            # without a lock (read your writes, seed 135).  Until its outcome: retry.
            raise errors.Unavailable(
                f"{Ref(ref)} is in doubt here (a prepared record taken over at promotion is "
                "being resolved): retry"
            )
        objects = self.objects if mode or b.serializable else self._view(b)[0]
        obj = objects.get(ref)
        if obj is None:
            return None
        e = b.entries[ref] = Entry(obj.type, obj.version, dict(obj.state), mode, CLEAN)
        return e

    def _view(self, b: Branch) -> tuple[dict[bytes, Obj], dict[tuple[str, str, Any], bytes]]:
        """What a lock-free read of branch ``b`` sees: its snapshot view, or the latest."""
        if b.serializable or self.read_latest:
            return self.objects, self.index
        if b.view is None:
            b.view = (dict(self.objects), dict(self.index))
        return b.view

    @staticmethod
    def _version(b: Branch, ref: bytes, objects: dict[bytes, Obj]) -> int | None:
        obj = objects.get(ref)
        return None if obj is None else obj.version

    def _taken_over(self, ref: bytes) -> bool:
        """Is ``ref`` written by a prepared record taken over at promotion (outcome pending)?"""
        return any(
            image[0] == ref for after in self.replicated_prepared.values() for image in after
        )

    def _g_writes(self, b: Branch, writes: Any) -> Op:
        """Apply a write set (data-path.md §2): lock, version check, set the changed fields."""
        if not isinstance(writes, list):
            raise errors.BadArgument("a write set is a list of writes")
        for w in writes:
            try:
                ref, type_name, version, changes = write_in(w)
            except errors.ProtocolError as exc:
                raise errors.BadArgument(str(exc)) from None
            e = yield from self._g_load(b, ref, WRITE)
            if e is None:
                raise errors.Conflict(f"{type_name} object {Ref(ref)} was deleted")
            if e.type != type_name:
                raise errors.BadArgument(f"object {Ref(ref)} is a {e.type}, not a {type_name}")
            if e.version != version:
                raise errors.Conflict(
                    f"{type_name} object {Ref(ref)} changed: written on version {version}, "
                    f"it is at version {e.version}"
                )
            t = self.types[e.type]
            for name, value in changes.items():
                if name not in t.defaults:
                    raise errors.FieldError(f"{type_name} has no field {name!r}")
                if name in t.unique and value != e.state.get(name):
                    raise errors.BadArgument(f"{type_name}.{name} is an immutable key")
                e.state[name] = value
            if e.status == CLEAN:
                e.status = DIRTY
        return None

    def _find(
        self, b: Branch, type_name: str, fname: str, value: Any, latest: bool = True
    ) -> bytes | None:
        """The object with this unique key as the branch sees it (its creates and deletes);
        ``latest`` False: a lock-free lookup (a snapshot branch's view)."""
        index = self.index if latest else self._view(b)[1]
        try:
            key = (type_name, fname, value)
            ref = b.created_keys.get(key) or index.get(key)
        except TypeError:  # an unhashable key value matches nothing
            return None
        if ref is not None:
            e = b.entries.get(ref)
            if e is not None and e.status == DELETED:
                return None
        return ref

    def _extent(
        self,
        b: Branch,
        type_name: str,
        parts: frozenset[bytes] | None = None,
        latest: bool = True,
    ) -> list[bytes]:
        objects = self.objects if latest else self._view(b)[0]
        refs = {r for r, o in objects.items() if o.type == type_name}
        for ref, e in b.entries.items():
            if e.type != type_name:
                continue
            if e.status == DELETED:
                refs.discard(ref)
            elif e.status == CREATED:
                refs.add(ref)
        if parts is not None:  # routing by partition: only those this node answers for
            refs = {r for r in refs if r[:8] in parts}
        return sorted(refs)

    def _type(self, f: dict[str, Any]) -> SimType:
        name = f.get("type")
        t = self.types.get(name) if isinstance(name, str) else None
        if t is None:
            raise errors.UnknownType(f"managed type {name!r:.40} is not defined on this node")
        tv = f.get("tv")
        if tv is not None and tv != t.version:
            raise errors.TypeVersionMismatch(
                f"{t.name}: the client has version {tv!r}, this node version {t.version}"
            )
        return t

    def _mode(self, b: Branch, lock: Any) -> int:
        if lock is None:
            return READ if b.serializable else NONE
        mode = _LOCKS.get(lock) if isinstance(lock, str) else None
        if mode is None:
            raise errors.BadArgument(f"lock must be 'none', 'read' or 'write', not {lock!r:.40}")
        return mode

    # ------------------------------------------------------------ committing
    def _after_images(self, b: Branch) -> tuple[list[list[Any]], list[tuple[bytes, bytes | None]]]:
        """The branch's effect: after-images (for a prepared record) and the durable writes."""
        after: list[list[Any]] = []
        for ref, e in sorted(b.entries.items()):
            if e.status == DIRTY:
                after.append([ref, e.type, e.version + 1, e.state])
            elif e.status == CREATED:
                after.append([ref, e.type, 1, e.state])
            elif e.status == DELETED:
                after.append([ref, e.type, e.version + 1, None])
        for (client, seq), (ok, value) in sorted(b.results.items()):
            after.append([client, seq, ok, value])
        return after, self._durable(after)

    @staticmethod
    def _durable(after: list[list[Any]]) -> list[tuple[bytes, bytes | None]]:
        writes: list[tuple[bytes, bytes | None]] = []
        for image in after:
            if isinstance(image[0], bytes):
                ref, type_name, version, state = image
                raw = None if state is None else codec.pack([type_name, version, state])
                writes.append((K_OBJ + ref, raw))
            else:
                client, seq, ok, value = image
                writes.append((_result_key(client, seq), plain.pack([ok, value])))
        return writes

    def install(self, after: list[list[Any]]) -> None:
        """Make after-images the committed state (in memory; their durable writes are separate)."""
        for image in after:
            if isinstance(image[0], bytes):
                ref, type_name, version, state = image
                if state is None:
                    self._drop(ref)
                else:
                    self._drop(ref)
                    self._put(ref, Obj(type_name, version, dict(state)))
            else:
                client, seq, ok, value = image
                self.results[(client, seq)] = (bool(ok), value)

    def _put(self, ref: bytes, obj: Obj) -> None:
        self.objects[ref] = obj
        t = self.types.get(obj.type)
        for fname in t.unique if t is not None else ():
            self.index[(obj.type, fname, obj.state.get(fname))] = ref
        self._counter = max(self._counter, Ref(ref).counter)

    def _drop(self, ref: bytes) -> None:
        obj = self.objects.pop(ref, None)
        t = None if obj is None else self.types.get(obj.type)
        if obj is not None and t is not None:
            for fname in t.unique:
                self.index.pop((obj.type, fname, obj.state.get(fname)), None)

    def _commit_local(self, b: Branch, job: _Job, deferred: _Deferred) -> None:
        """Persist the branch's writes; once durable, install them, release, answer.

        With a :attr:`replicator` (sync replication of partitions) the replication
        machine's record is the commit: once it completed (durable here and on every
        in-sync sync replica) the writes are installed and persisted here too (this
        store's copy) and the commit answered.  A refusal before anything was written
        answers the replicator's error; a failure after answers it too (outcome unknown)
        and installs nothing here (the partition's active node has it or not).
        """
        after, writes = self._after_images(b)

        def durable() -> None:
            self.install(after)
            self._finish_local(b, job, deferred.reply)

        if self.replicator is not None and after:

            def replicated(error: dict[str, Any] | None) -> None:
                if error is None:
                    self.load(after)
                    reply = deferred.reply
                elif error.get("unknown"):
                    # Outcome unknown: the data plane records no abort (OutcomeUnknown).
                    reply = {"unknown": {k: v for k, v in error.items() if k != "unknown"}}
                else:
                    reply = error
                self._finish_local(b, job, reply)

            refused = self.replicator.commit(self.to_replicate(after), replicated)
            if refused is not None:
                self._finish_local(b, job, refused)
            return
        if not writes:
            durable()
            return
        self._token += 1
        self._on_durable[self._token] = durable
        self._actions.append(Persist(self._token, tuple(writes)))

    def to_replicate(self, after: list[list[Any]]) -> list[list[Any]]:
        """The after-images a commit or prepare hands the replicator (all, but for a mutant)."""
        if self.replicate_results:
            return after
        return [image for image in after if isinstance(image[0], bytes)]

    def _finish_local(self, b: Branch, job: _Job, reply: dict[str, Any]) -> None:
        self.branches.pop(b.bid, None)
        self._reply(job, reply)
        self._abandon(b, errors.TransactionClosed(f"branch {b.bid} committed"))
        self._release(b)

    # ------------------------------------------------------------ replication (promotion)
    def load(self, after: list[list[Any]]) -> None:
        """Install after-images that came from elsewhere (a partition's replicated copy, at
        promotion), durable in this store's keys too; answered by nobody.  An object a
        prepared branch here writes waits for that branch (``load_waiting``): seed 3800267
        loaded a copy over a branch recovered in doubt, whose commit then installed its
        older after-image over the copy (a lost update); on a real node the load's
        transaction waits for the branch's write lock."""
        changed = [image for image in after if not self._holds(image)]
        if not changed:
            return
        locked = {
            image[0]
            for b in self.rm_branches.values()
            if b.prepared
            for image in b.after
            if isinstance(image[0], bytes)
        }
        now = []
        for image in changed:
            if isinstance(image[0], bytes) and image[0] in locked:
                self.load_waiting[image[0]] = image
            else:
                now.append(image)
        if now:
            self.install(now)
            self._token += 1
            self._actions.append(Persist(self._token, tuple(self._durable(now))))

    def load_after(self, b: Branch) -> list[tuple[bytes, bytes | None]]:
        """``b`` ended: the copy's images that waited for it, installed where newer than what
        the store holds now (after the branch's own outcome).  Returns their durable writes,
        to go in the branch's outcome write after its own (one write: the same keys, the
        newer last)."""
        images = []
        for image in b.after:
            waiting = self.load_waiting.pop(image[0], None) if isinstance(image[0], bytes) else None
            if waiting is None or self._holds(waiting):
                continue
            obj = self.objects.get(waiting[0])
            if waiting[3] is None or obj is None or obj.version < waiting[2]:
                images.append(waiting)
        if not images:
            return []
        self.install(images)
        return self._durable(images)

    def _holds(self, image: list[Any]) -> bool:
        if isinstance(image[0], bytes):
            ref, type_name, version, state = image
            obj = self.objects.get(ref)
            if state is None:
                return obj is None
            return obj is not None and (obj.type, obj.version, obj.state) == (
                type_name,
                version,
                state,
            )
        client, seq, ok, value = image
        return self.results.get((client, seq)) == (ok, value)

    def take_prepared(self, gtid: str, after: list[list[Any]]) -> None:
        """A replicated prepared record, taken over at promotion: its objects write-locked
        (``rep:<gtid>``) until :meth:`end_prepared`."""
        if gtid in self.replicated_prepared:
            return
        self.replicated_prepared[gtid] = after
        # In doubt here like a prepared branch of this node's own: a snapshot's cut names
        # it (and its commit, once applied, is seen: end_prepared).
        self.note_prepared(taken_parts(gtid)[1])
        owner = _REPLICATED + gtid
        for image in after:
            if isinstance(image[0], bytes):
                self._counter = max(self._counter, Ref(image[0]).counter)
                # The active node's own branches on these objects ended with its epoch:
                # nothing here holds them (a failed grant is a bug the checks see).
                self.locks.acquire(owner, ("o", image[0]), LockMode.WRITE)
            else:
                # A request's record in doubt: a retry's claim (or a lookup) waits for
                # the outcome instead of running the request a second time.
                self.locks.acquire(owner, ("q", image[0], image[1]), LockMode.WRITE)

    def end_prepared(self, gtid: str, commit: bool) -> bool:
        """The outcome of a prepared record taken over at promotion: install or drop it
        (False: no such record here)."""
        after = self.replicated_prepared.pop(gtid, None)
        if after is None:
            return False
        if commit:
            self.load(after)
            self.note_applied(taken_parts(gtid)[1])
        self._granted(self.locks.release_all(_REPLICATED + gtid))
        return True

    # ------------------------------------------------------------ inspection
    def balances(self) -> dict[int, int]:
        """Account number -> committed balance (tests, the final checks)."""
        return {
            o.state["number"]: o.state["balance"]
            for o in self.objects.values()
            if o.type == ACCOUNT
        }

    def snapshot(self) -> dict[bytes, tuple[str, int, dict[str, Any]]]:
        """Every committed object (compare with a store rebuilt from the disk)."""
        return {r: (o.type, o.version, o.state) for r, o in sorted(self.objects.items())}


_OPS: dict[str, Callable[[SimDataStore, Branch, dict[str, Any]], Op]] = {
    "branch.get": SimDataStore._g_get,
    "branch.ref": SimDataStore._g_ref,
    "branch.create": SimDataStore._g_create,
    "branch.delete": SimDataStore._g_delete,
    "branch.query": SimDataStore._g_query,
    "branch.count": SimDataStore._g_count,
    "branch.write": SimDataStore._g_nothing,
    "branch.call": SimDataStore._g_unsupported,
    "branch.overwrite": SimDataStore._g_unsupported,
    "branch.upsert": SimDataStore._g_unsupported,
    "branch.stream.commit": SimDataStore._g_unsupported,
    "branch.commit": SimDataStore._g_commit,
    "branch.cut_open": SimDataStore._g_cut_open,
    "branch.cut_unsure": SimDataStore._g_cut_unsure,
    "branch.cut_seen": SimDataStore._g_cut_seen,
    "request.record": SimDataStore._g_record,
    "request.abort": SimDataStore._g_abort,
    "request.lookup": SimDataStore._g_lookup,
}


# ------------------------------------------------------------------ two-phase commit
class SimStoreResourceManager:
    """The node's :class:`~nonstop.dtx.protocol.ResourceManager` over :class:`SimDataStore`.

    ``take_branch(bid)`` is the data plane's :meth:`DataPlane.take_branch` (set by
    the composition): the branch stops being the data plane's, so it can neither
    run ops nor be ended by it; its outcome ends it.
    """

    def __init__(self, store: SimDataStore) -> None:
        self.store = store
        self.take_branch: Callable[[str], bool] = lambda bid: False
        self.branch_lapsed: Callable[[str], bool] = lambda bid: False
        """The data plane's :meth:`DataPlane.vote_lapsed` (set by the composition)."""
        self.vote_waits: dict[str, tuple[list[Any], float]] = {}
        """gtid → (its ops, until when) of a prepare waiting out a lapse of the lease (the
        real participant's ``open``)."""
        self.vote_wait = VOTE_LAPSE_WAIT

    def check_ops(self, ops: Any) -> str | None:
        if not isinstance(ops, list) or not ops or len(ops) > 10_000:
            return "ops must be a non-empty list"
        first = ops[0]
        if not (
            isinstance(first, list)
            and len(first) == 2
            and first[0] == "b"
            and isinstance(first[1], str)
            and first[1]
        ):
            return 'the first op must be ["b", branch id]'
        for op in ops[1:]:
            if not (
                isinstance(op, list)
                and len(op) == 5
                and op[0] == "w"
                and isinstance(op[1], bytes)
                and len(op[1]) == REF_SIZE
                and isinstance(op[2], str)
                and isinstance(op[3], int)
                and not isinstance(op[3], bool)
                and isinstance(op[4], bytes)
            ):
                return f"bad write {op!r:.80}"
        return None

    def open(self, gtid: str, ops: list[Any]) -> list[Progress]:
        store = self.store
        bid = ops[0][1]
        if gtid in store.rm_branches or gtid in self.vote_waits:
            return []
        if not self.take_branch(bid):
            if self.vote_wait > 0 and self.branch_lapsed(bid):
                # Refused only for a lapse of the lease: ask again until it is back.
                self.vote_waits[gtid] = (ops, store.now + self.vote_wait)
                store.stats["vote_waits"] = store.stats.get("vote_waits", 0) + 1
                store._actions.append(SetTimer(f"{_VOTE}{gtid}", VOTE_POLL))
                return []
            return [Refused(gtid, BRANCH_GONE)]
        return self._taken(gtid, ops)

    def vote_timer(self, gtid: str) -> None:
        """A prepare waiting out a lapse asks for its branch again (:meth:`open`)."""
        waiting = self.vote_waits.get(gtid)
        if waiting is None:
            return  # (its outcome came first: finish)
        ops, until = waiting
        bid = ops[0][1]
        store = self.store
        if self.take_branch(bid):
            del self.vote_waits[gtid]
            store.stats["votes_waited_out"] = store.stats.get("votes_waited_out", 0) + 1
            self._emit(self._taken(gtid, ops))
        elif self.branch_lapsed(bid) and store.now < until:
            store._actions.append(SetTimer(f"{_VOTE}{gtid}", VOTE_POLL))
        else:
            del self.vote_waits[gtid]
            self._emit([Refused(gtid, BRANCH_GONE)])

    def _taken(self, gtid: str, ops: list[Any]) -> list[Progress]:
        """The branch is the two-phase commit's now: apply the write set and prepare."""
        store = self.store
        bid = ops[0][1]
        b = store.branches.pop(bid, None)
        if b is None:
            # The data plane had the branch, but it never ran an op here: nothing to hold.
            b = Branch(bid, True)
        if b.job is not None or b.queue or b.committing:
            store._actions.append(Log("error", f"store {store.name}: {bid} taken while busy"))
            store._abandon(b, errors.BranchRolledBack("taken by two-phase commit"))
        b.gtid = gtid
        store.rm_branches[gtid] = b
        if b.doomed is not None:
            return self._refuse(b, b.doomed)
        job = _Job(0, "branch.write", {}, [op[1:] for op in ops[1:]])
        b.job = job
        job.gen = store._op(b, job)
        return self._call(lambda: store._step(b, None))

    def prepared_or_refused(self, b: Branch, outcome: Any) -> None:
        """The prepare's writes are applied (or failed): compute the record, or refuse."""
        store = self.store
        assert b.gtid is not None
        if isinstance(outcome, dict) and "error" in outcome:
            name = str(outcome["error"])
            reason = _REASONS.get(name, f"{name}: {outcome.get('message')}")
            self._emit(self._refuse_reason(b, reason))
            return
        after, _ = store._after_images(b)
        b.after = after
        locks = [
            [_pack_resource(r), int(m)]
            for r, m in sorted(store.locks.held_by(b.bid).items(), key=lambda rm: repr(rm[0]))
        ]
        record = plain.pack({"b": b.bid, "a": after, "l": locks})
        gtid = b.gtid
        if store.replicator is None or not after:
            b.prepared = True
            store.note_prepared(gtid)
            self._emit([Ready(gtid, record, {})])
            return

        def replicated(error: dict[str, Any] | None) -> None:
            # Yes only once every sync replica holds the prepared record (ha.md §5 step 3).
            if error is not None and error.get("unknown") and store.replicator is not None:
                # This participant votes no (or already did): the outcome is abort, known
                # here -- a copy of the prepared record elsewhere resolves from it.  (Not
                # ``unknown``: refused after waiting out a lapse, nothing was made.)
                store.replicator.outcome(gtid, False, after)
            if store.rm_branches.get(gtid) is not b:
                return  # ended meanwhile (its coordinator gave up)
            if error is not None:
                self._emit(self._refuse_reason(b, NOT_REPLICATED))
                return
            b.prepared = True
            store.note_prepared(gtid)
            self._emit([Ready(gtid, record, {})])

        refused = store.replicator.prepare(gtid, store.to_replicate(after), replicated)
        if refused is not None:
            self._emit(self._refuse_reason(b, NOT_REPLICATED))

    def finish(
        self, gtid: str, commit: bool
    ) -> tuple[list[tuple[bytes, bytes | None]], list[Progress]]:
        store = self.store
        if self.vote_waits.pop(gtid, None) is not None:
            return [], []  # never voted: its branch is still the data plane's
        b = store.rm_branches.pop(gtid, None)
        if b is None:
            return [], []
        writes: list[tuple[bytes, bytes | None]] = []
        if store.replicator is not None and b.after:
            store.replicator.outcome(gtid, commit, b.after)
        if commit:
            if not b.prepared:
                raise AssertionError(f"{gtid}: commit of a branch that never prepared")
            store.install(b.after)
            store.note_applied(gtid)
            writes = store._durable(b.after)
        writes += store.load_after(b)

        def end() -> None:
            store._abandon(b, errors.BranchRolledBack("ended"))
            store._release(b)

        return writes, self._call(end)

    def recover(self, gtid: str, record: bytes) -> None:
        store = self.store
        rec = plain.unpack(record)
        b = Branch(rec["b"], True, gtid=gtid, prepared=True, after=rec["a"])
        for resource, mode in rec["l"]:
            # Prepared branches held these together before the crash: compatible.
            granted = store.locks.acquire(b.bid, _unpack_resource(resource), LockMode(mode))
            assert isinstance(granted, Granted), f"{gtid}: recovered lock not granted"
        for image in b.after:
            if isinstance(image[0], bytes):
                store._counter = max(store._counter, Ref(image[0]).counter)
        store.rm_branches[gtid] = b
        store.note_prepared(gtid)

    # ------------------------------------------------------------ internals
    def _refuse(self, b: Branch, exc: errors.Error) -> list[Progress]:
        name = type(exc).__name__
        return self._refuse_reason(b, _REASONS.get(name, f"{name}: {exc}"))

    def _refuse_reason(self, b: Branch, reason: str) -> list[Progress]:
        store = self.store
        assert b.gtid is not None
        store.rm_branches.pop(b.gtid, None)
        gtid = b.gtid
        return [Refused(gtid, reason), *self._call(lambda: store._release(b))]

    def _call(self, fn: Callable[[], None]) -> list[Progress]:
        """Run ``fn``; the progress it causes is returned (nested: passed up)."""
        outer = self.store._rm_call
        collected: list[Progress] = []
        self.store._rm_call = collected
        try:
            fn()
        finally:
            self.store._rm_call = outer
        if outer is not None:
            outer.extend(collected)
            return []
        return collected

    def _emit(self, progress: list[Progress]) -> None:
        sink = self.store._rm_call
        (sink if sink is not None else self.store._progress).extend(progress)


# ------------------------------------------------------------------ helpers
def _error(exc: BaseException) -> dict[str, Any]:
    return error_out(exc)


def _parts(f: dict[str, Any]) -> frozenset[bytes] | None:
    """The ``locs`` of a branch op (location codes) as reference prefixes, or None."""
    parts = f.get("locs")
    if not isinstance(parts, list):
        return None
    return frozenset(int(p).to_bytes(8, "big") for p in parts)


def _ref(value: Any) -> bytes:
    if isinstance(value, Ref):
        return value.raw
    if not isinstance(value, bytes) or len(value) != REF_SIZE:
        raise errors.BadArgument(f"ref must be {REF_SIZE} bytes, not {value!r:.40}")
    return value


def _unpacked(value: Any, what: str) -> Any:
    if not isinstance(value, bytes):
        raise errors.BadArgument(f"{what} must be packed bytes")
    try:
        return codec.unpack(value)
    except Exception as exc:
        raise errors.BadArgument(f"{what} cannot be decoded: {exc}") from None


def _req(req: Any) -> tuple[str, int]:
    if (
        isinstance(req, list | tuple)
        and len(req) == 2
        and isinstance(req[0], str)
        and req[0]
        and "\x00" not in req[0]
        and isinstance(req[1], int)
        and not isinstance(req[1], bool)
        and req[1] >= 0
    ):
        return req[0], req[1]
    raise errors.BadArgument("req must be [client id, seq >= 0]")


def _result_key(client: str, seq: int) -> bytes:
    return K_RESULT + client.encode() + b"\x00" + _SEQ.pack(seq)


def _pack_resource(resource: Hashable) -> list[Any]:
    assert isinstance(resource, tuple)
    return list(resource)


def _unpack_resource(raw: list[Any]) -> tuple[Any, ...]:
    return tuple(raw)


def is_prepared_key(key: bytes) -> bool:
    """The dtx machine's prepared-branch records (whose ``r`` is this store's record)."""
    return key.startswith(K_PREPARED)


def taken_name(partition: str, gtid: str) -> str:
    """The store's name of P's prepared record of ``gtid`` taken over at promotion."""
    return f"{partition}/{gtid}"


def taken_parts(taken: str) -> tuple[str, str]:
    """``(partition, gtid)`` of a name made by :func:`taken_name`."""
    partition, _, gtid = taken.partition("/")
    return partition, gtid


__all__ = [
    "ACCOUNT",
    "BANK_TYPES",
    "K_OBJ",
    "K_RESULT",
    "TIMER_PREFIX",
    "TRANSFER",
    "SimDataStore",
    "SimStoreResourceManager",
    "SimType",
    "StoreConfig",
    "taken_name",
    "taken_parts",
]
