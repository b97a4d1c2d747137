"""Two-phase commit with a replicated decision: the coordinator and participant roles.

One sans-I/O :class:`DtxNode` per node plays both roles (every node coordinates
the transactions its clients start, and is a participant of any transaction
that writes or reads its objects).  It follows ``nonstop.runtime.interface``:
events in, actions out, durable state only through ``Persist`` and only acted
upon after ``Persisted``.  See ``docs/design/dtx.md`` for the full protocol;
in short:

1. **Record.**  A client asks ``{"op": "run", "branches": {node: [op, ...]}}``.
   The coordinator durably records the gtid and its branches (so that a
   coordinator that crashes can still finish or roll back what it started).
2. **Prepare.**  Each participant takes its locks (strict 2PL, through its
   :class:`ResourceManager`), computes its branch and durably records it as
   *prepared* before it votes yes; or votes no (refused, deadlock, lock wait
   past ``branch_timeout``).  Prepares are retransmitted until voted on.
3. **Decide.**  All yes: the coordinator *proposes* ``commit`` to the decision
   log (:mod:`nonstop.dtx.decisions`) and only acts on the log's answer.  A no
   vote or ``vote_timeout`` before it proposed: it aborts on its own authority
   (nobody else can ever propose commit), answers ``Aborted`` / ``Unavailable``
   (B8) and rolls back every branch.
4. **Phase two.**  The outcome goes to every participant, retried until every
   one has acknowledged, which each does only once the outcome is durable.  A
   commit is answered only then (read your writes: every participant applied
   it), or ``apply_wait`` after the decision naming those that have not
   (``unapplied``); a participant whose acknowledgement the composition holds
   (:attr:`DtxNode.hold_ack`) says ``applied`` meanwhile, which counts for the
   reply but not for forgetting.  Once every one acknowledged the coordinator
   forgets the gtid and raises its *floor* (compaction).
5. **Termination (B9).**  A participant prepared for ``decision_timeout``
   without an outcome proposes ``abort`` to the log; whichever decision the log
   holds first is the outcome for everybody.  A recovered coordinator looks its
   unfinished gtids up in the log and proposes ``abort`` for the undecided ones:
   it never guesses, and since a participant's outcome is applied idempotently
   and remembered (tombstones), a late message can never flip it.

The resource manager is the seam to the store: :class:`nonstop.sim.scenarios.dtx_resource.
SimResourceManager` in the simulator, an adapter over ``Database`` /
``Transaction.prepare`` / ``Database.resolve`` in production.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from nonstop.dtx.decisions import (
    ABORT,
    COMMIT,
    DECIDED,
    FORGET,
    FORGOT,
    LOG,
    LOOKUP,
    OUTCOMES,
    PROPOSE,
    UNKNOWN,
    make_gtid,
    parse_gtid,
)
from nonstop.net import plain
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Log,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    Reply,
    Send,
    SetTimer,
    Started,
    TimerFired,
)

# Message types between nodes ("t" of the payload).
PREPARE = "dtx.prepare"  # coordinator -> participant {"g", "ops", "f"}
VOTE = "dtx.vote"  # participant -> coordinator {"g", "v": "yes"|"no", "r": reads, "why"}
OUTCOME = "dtx.outcome"  # coordinator -> participant {"g", "o", "f"}
ACK = "dtx.ack"  # participant -> coordinator {"g"}
APPLIED = "dtx.applied"  # participant -> coordinator {"g"}: applied, its ack held (hold_ack)
RM = "dtx.rm"  # the node to itself: {"p": [Progress, ...]} reported later by its resource manager

TICK = "dtx.tick"
WORKING = "dtx.working"  # participant -> coordinator {"g"}: still preparing (ops done)

# Durable keys owned by the machine (the resource manager owns its own prefix).
K_COORD = b"dtx/c/"  # + gtid -> coordinator record {"b": branches}
K_SEQ = b"dtx/seq"  # -> the next sequence number this coordinator will use
K_PREPARED = b"dtx/p/"  # + gtid -> prepared branch {"r": resource manager record}
K_TOMB = b"dtx/t/"  # + gtid -> outcome applied here (until the coordinator's floor passes)
K_FLOOR = b"dtx/f/"  # + coordinator -> the highest floor learned from it


_pack = plain.pack
_unpack = plain.unpack


# ----------------------------------------------------------------- resource manager
@dataclass(frozen=True, slots=True)
class Ready:
    """A branch holds all its locks and computed its effects: persist ``record``, vote yes."""

    gtid: str
    record: bytes
    reads: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refused:
    """A branch cannot prepare (constraint, deadlock victim): vote no.  Its locks are gone."""

    gtid: str
    reason: str


@dataclass(frozen=True, slots=True)
class Working:
    """A branch's ops are done and it waits for no lock: its prepare is computing and
    replicating its effects (a large write set takes seconds), so it is not timed out
    (``branch_timeout``) before ``prepare_limit`` while its coordinator is up."""

    gtid: str


Progress = Ready | Refused | Working


class ResourceManager(Protocol):
    """The participant's store, sans-I/O: what the machine asks of it, and why.

    Locks are taken by :meth:`open` and held until :meth:`finish`; a branch that
    waits for a lock is reported later, in the ``Progress`` list returned by
    whichever call released the lock.  Effects are computed under the locks at
    prepare time, so the prepared record is exactly what commit will install.
    """

    def check_ops(self, ops: Any) -> str | None:
        """Why ``ops`` (from the wire) is malformed, or None."""
        ...

    def open(self, gtid: str, ops: list[Any]) -> list[Progress]:
        """Start a branch: take its locks.

        The list holds this branch's result unless it waits for a lock, plus any
        branch that a refusal (deadlock victim) unblocked.
        """
        ...

    def finish(
        self, gtid: str, commit: bool
    ) -> tuple[list[tuple[bytes, bytes | None]], list[Progress]]:
        """End a branch (any state): apply it in memory if ``commit``, release its locks.

        Returns the writes that make the effect durable (the machine persists
        them atomically with the end of the prepared record) and the waiting
        branches the released locks let progress.
        """
        ...

    def recover(self, gtid: str, record: bytes) -> None:
        """Reinstall a prepared branch after a restart (its locks held again)."""
        ...


# ----------------------------------------------------------------- configuration
@dataclass(frozen=True, slots=True)
class DtxConfig:
    """Timeouts (seconds of ``event.now``).  Why each exists is in docs/design/dtx.md."""

    tick: float = 0.05
    """One periodic timer drives every deadline and retransmission."""
    retry: float = 0.1
    """Retransmit prepares, outcomes and log requests this often until answered."""
    vote_timeout: float = 0.5
    """Coordinator: votes missing this long after prepare -> abort, ``Unavailable`` (B8)."""
    branch_timeout: float = 0.4
    """Participant: not prepared this long after the prepare arrived -> abort the branch (B4)."""
    decision_timeout: float = 0.6
    """Participant: prepared this long without an outcome -> propose abort to the log (B9)."""
    prepare_limit: float = 2.0
    """Participant: a branch whose resource manager reported :class:`Working` is not timed
    out before this long after its prepare arrived; it tells its coordinator (``WORKING``,
    every ``retry``), which holds the coordinator's ``vote_timeout`` back as long (section
    5 of dtx.md: an overwrite's prepare of hundreds of thousands of objects)."""
    apply_wait: float = 0.3
    """Coordinator: a commit is acknowledged once every participant applied it (its ack:
    the outcome durable there), so that no read after the acknowledgement sees the state
    before it; a participant that has not acked this long after the decision (down,
    cut off) no longer holds the client back: the reply then names it (``unapplied``)."""
    forget_every: float = 1.0
    """Compaction runs this often (it is only an optimisation): the coordinator sends its
    floor to the log (resent until confirmed) and a participant drops the tombstones
    below the floors it learned.  Batched, not per transaction: each ``forget`` is a
    replicated log entry and each pruning a durable write."""

    @classmethod
    def real(cls) -> DtxConfig:
        """Timeouts for real networks and disks (the defaults are the simulator's).

        Why these values: docs/design/dtx.md section 5.
        """
        return cls(
            tick=0.05,
            retry=0.5,
            vote_timeout=5.0,
            branch_timeout=4.0,
            decision_timeout=10.0,
            prepare_limit=300.0,
            apply_wait=2.0,
            forget_every=1.0,
        )


# ----------------------------------------------------------------- state
@dataclass(slots=True)
class CoordTx:
    """The coordinator's view of one global transaction."""

    gtid: str
    seq: int
    branches: dict[NodeId, list[Any]]
    request_id: int | None
    phase: str
    """recording -> preparing -> deciding -> finishing; recovering after a restart."""
    votes: dict[NodeId, dict[str, Any]] = field(default_factory=dict)
    proposed: str | None = None
    outcome: str | None = None
    acks: set[NodeId] = field(default_factory=set)
    applied: set[NodeId] = field(default_factory=set)
    """Participants that applied the outcome but hold their ack (``APPLIED``): the client's
    reply may go (read your writes), the gtid may not be forgotten (no ack yet)."""
    vote_deadline: float = 0.0
    vote_limit: float = 0.0
    """The latest ``vote_deadline`` participants still preparing (``WORKING``) may push."""
    next_retry: float = 0.0
    replied: bool = False
    held_reply: dict[str, Any] | None = None
    """A commit's reply, held until every participant applied it (or ``reply_by``)."""
    reply_by: float = 0.0


@dataclass(slots=True)
class Branch:
    """A participant's branch of one global transaction."""

    gtid: str
    coordinator: NodeId
    state: str
    """locking -> persisting -> prepared -> resolving (then gone, leaving a tombstone)."""
    deadline: float
    reads: dict[str, Any] = field(default_factory=dict)
    pending_outcome: str | None = None
    resolving: str | None = None
    next_ask: float = 0.0
    asked: bool = False
    working: bool = False
    """Its ops are done, its prepare is computing (:class:`Working`): no branch timeout
    before ``limit`` while the coordinator is up."""
    limit: float = 0.0


# ----------------------------------------------------------------- the machine
class DtxNode:
    """Coordinator and participant of distributed transactions on one node (module doc)."""

    def __init__(
        self,
        name: NodeId,
        rm: ResourceManager,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        config: DtxConfig | None = None,
    ) -> None:
        self.name = name
        self.rm = rm
        self.rng = rng
        self.config = config or DtxConfig()
        self.now = 0.0
        self.coord: dict[str, CoordTx] = {}
        self.branches: dict[str, Branch] = {}
        self.tombs: dict[str, str] = {}
        self.durable_tombs: set[str] = set()
        self.floors: dict[NodeId, int] = {}
        self.next_seq = 1
        self.sent_floor = 0
        self.log_floor = 0
        """The highest floor the log confirmed; FORGET is resent until it reaches ours."""
        self._next_forget = 0.0
        self._next_prune = 0.0
        self._floors_learned: set[NodeId] = set()
        """Coordinators whose floor rose since the last pruning of their tombstones."""
        self._token = 0
        self._on_persisted: dict[int, tuple[str, str]] = {}
        self._out: list[Action] = []
        self._loop: list[Any] = []
        self.coordinators_down: frozenset[NodeId] = frozenset()
        """Peers the composition's failure detector sees down (:meth:`peers_down`): a prepared
        branch of theirs asks the log at once instead of after ``decision_timeout``."""
        self.hold_ack: Callable[[str], bool] = _never
        """Participant: is the acknowledgement of this gtid's phase two held back?  Set by a
        composition whose prepared records have copies elsewhere (replicated partitions):
        the coordinator lets the log forget a gtid once every participant acknowledged it,
        so a participant acknowledges only once every copy that may be promoted holds the
        outcome (replication.md, holds).  A held acknowledgement goes when the coordinator
        resends the outcome, or at once through :meth:`released`; meanwhile the participant
        sends ``APPLIED`` (the coordinator may answer its client, not forget the gtid)."""
        self._recover(recovered)

    # ------------------------------------------------------------- recovery
    def _recover(self, recovered: Mapping[bytes, bytes]) -> None:
        """Rebuild from durable state: unfinished gtids, prepared branches, tombstones, floors."""
        for key in sorted(recovered):
            raw = recovered[key]
            if key == K_SEQ:
                self.next_seq = max(self.next_seq, int(_unpack(raw)))
            elif key.startswith(K_COORD):
                gtid = key[len(K_COORD) :].decode()
                parsed = parse_gtid(gtid)
                assert parsed is not None
                rec = _unpack(raw)
                self.coord[gtid] = CoordTx(gtid, parsed[1], rec["b"], None, "recovering")
                self.next_seq = max(self.next_seq, parsed[1] + 1)
            elif key.startswith(K_PREPARED):
                gtid = key[len(K_PREPARED) :].decode()
                rec = _unpack(raw)
                self.rm.recover(gtid, rec["r"])
                self.branches[gtid] = Branch(gtid, rec["c"], "prepared", 0.0, rec.get("reads", {}))
            elif key.startswith(K_TOMB):
                gtid = key[len(K_TOMB) :].decode()
                self.tombs[gtid] = raw.decode()
                self.durable_tombs.add(gtid)
            elif key.startswith(K_FLOOR):
                self.floors[key[len(K_FLOOR) :].decode()] = int(_unpack(raw))

    # ------------------------------------------------------------- events
    def handle(self, event: Event) -> list[Action]:
        self.now = event.now
        self._out = []
        if isinstance(event, Started):
            self._started()
        elif isinstance(event, TimerFired):
            if event.name == TICK:
                self._tick()
        elif isinstance(event, Persisted):
            self._persisted(event.token)
        elif isinstance(event, Received):
            self._received(event.sender, event.payload)
        elif isinstance(event, ClientRequest):
            self._client(event.request_id, event.payload)
        while self._loop:  # messages this node sent itself
            self._received(self.name, self._loop.pop(0))
        out, self._out = self._out, []
        return out

    def peers_down(self, now: float, down: frozenset[NodeId]) -> None:
        """The composition's failure detector sees ``down`` not Up (call it when that changes).

        As participant: a coordinator that is down cannot decide what it has not decided
        yet, and whatever it did decide is in the log: its branches here need not wait for
        it (B9 at once, not after ``decision_timeout``), since their locks stop every
        transaction that touches the same objects (a takeover then cost clients
        ``lock_wait`` per attempt).  Safe even if the peer was only slow: a proposal of
        abort loses against a commit the log already holds, and a branch not prepared yet
        has no yes vote a commit could have counted.  As coordinator: a transaction still
        waiting for a vote of a peer that is down aborts (B8 at once, not after
        ``vote_timeout``).  The effects come with the next tick.
        """
        newly = down - self.coordinators_down
        self.coordinators_down = frozenset(down)
        if not newly:
            return
        self.now = max(self.now, now)
        for b in self.branches.values():
            if b.coordinator in newly and b.state in ("locking", "prepared"):
                b.deadline = min(b.deadline, self.now)
                b.next_ask = 0.0
        # As coordinator: a participant that died before its vote will not vote (a restarted
        # one says "branch gone"), and meanwhile the others' prepared branches hold their
        # locks until ``vote_timeout``: abort now, on this node's own authority (B8).
        for tx in self.coord.values():
            if tx.phase == "preparing" and (set(tx.branches) - set(tx.votes)) & newly:
                tx.vote_deadline = min(tx.vote_deadline, self.now)

    def released(self, now: float, gtid: str) -> list[Action]:
        """The composition released its hold on ``gtid`` (:attr:`hold_ack`): acknowledge the
        applied outcome now rather than at the coordinator's next resend."""
        self.now = now
        self._out = []
        parsed = parse_gtid(gtid)
        if parsed is not None and gtid not in self.branches and gtid in self.tombs:
            self._ack(parsed[0], gtid)
        while self._loop:
            self._received(self.name, self._loop.pop(0))
        out, self._out = self._out, []
        return out

    def _started(self) -> None:
        for b in self.branches.values():  # recovered prepared branches: in doubt from now
            b.deadline = self.now + self.config.decision_timeout
        for tx in self.coord.values():
            tx.next_retry = self.now
        self._out.append(SetTimer(TICK, self.config.tick))
        if self.coord or self.branches:
            self._log("info", f"recovered {len(self.coord)} gtids, {len(self.branches)} prepared")

    def _received(self, sender: NodeId, payload: Any) -> None:
        if not isinstance(payload, dict) or not isinstance(payload.get("t"), str):
            self._log("warning", f"dropped malformed message from {sender}: {payload!r:.80}")
            return
        kind = payload["t"]
        if kind == RM:
            self._rm_progress(sender, payload.get("p"))
            return
        if kind == FORGOT:
            floor = payload.get("f")
            if sender == LOG and isinstance(floor, int) and payload.get("c") == self.name:
                self.log_floor = max(self.log_floor, floor)
            return
        gtid = cast(str, payload.get("g"))  # checked by parse_gtid just below
        parsed = parse_gtid(gtid)
        if kind == FORGET or parsed is None:
            self._log("warning", f"dropped {kind} from {sender}: bad gtid {gtid!r:.40}")
            return
        coordinator = parsed[0]
        if kind in (DECIDED, UNKNOWN):
            if sender != LOG:
                self._log("warning", f"dropped {kind} from {sender}: not the log")
            elif kind == DECIDED and payload.get("o") in OUTCOMES:
                self._decided(gtid, payload["o"])
            elif kind == UNKNOWN:
                self._unknown(gtid, bool(payload.get("forgotten")))
            return
        if kind in (PREPARE, OUTCOME):
            if sender != coordinator:
                self._log("warning", f"dropped {kind} {gtid} from {sender}: not its coordinator")
                return
            floor = payload.get("f")
            if isinstance(floor, int) and not isinstance(floor, bool):
                self._learn_floor(coordinator, floor)
            if kind == PREPARE:
                self._prepare(gtid, payload.get("ops"))
            elif payload.get("o") in OUTCOMES:
                self._participant_outcome(gtid, payload["o"])
            return
        if kind == WORKING:
            tx = self.coord.get(gtid)
            if tx is not None and sender in tx.branches:
                self._still_preparing(tx, sender)
            return
        if kind in (VOTE, ACK, APPLIED):
            tx = self.coord.get(gtid)
            if tx is None or sender not in tx.branches:
                return  # late or duplicated: the transaction is over, or not ours
            if kind == ACK:
                self._acked(tx, sender)
            elif kind == APPLIED:
                self._applied(tx, sender)
            elif payload.get("v") == "yes" and isinstance(payload.get("r", {}), dict):
                self._voted_yes(tx, sender, payload.get("r", {}))
            elif payload.get("v") == "no":
                self._voted_no(tx, sender, str(payload.get("why", "")))
            return
        self._log("warning", f"dropped unknown message {kind!r} from {sender}")

    def _rm_progress(self, sender: NodeId, progress: Any) -> None:
        """Results the resource manager computed asynchronously (a real store's prepare).

        The runtime hands them in as a message from this node to itself; a peer
        cannot forge one (its sender is never our name), and anything else is
        dropped like any malformed message.
        """
        if sender != self.name:
            self._log("warning", f"dropped {RM} from {sender}: only this node reports progress")
            return
        if not isinstance(progress, list) or not all(
            isinstance(p, Ready | Refused | Working) for p in progress
        ):
            self._log("warning", f"dropped malformed {RM}: {progress!r:.80}")
            return
        self._progress(progress)

    def _tick(self) -> None:
        self._out.append(SetTimer(TICK, self.config.tick))
        now = self.now
        for tx in list(self.coord.values()):
            if self.coord.get(tx.gtid) is tx:
                self._coord_tick(tx, now)
        if now >= self._next_forget and self.floor() > max(self.log_floor, 1):
            self._forget()
        if now >= self._next_prune and self._floors_learned:
            self._prune_tombstones()
        for b in list(self.branches.values()):
            if self.branches.get(b.gtid) is not b:
                continue  # ended by an earlier one's released locks
            if b.state in ("locking", "persisting") and self._still_working(b, now):
                # (persisting: a working branch's prepared record -- a swap's write set,
                # megabytes -- is still being made durable: still working, dtx.md §5)
                if now >= b.next_ask:
                    b.next_ask = now + self.config.retry
                    self._send(b.coordinator, {"t": WORKING, "g": b.gtid})
            elif b.state == "locking" and now >= b.deadline:
                self._branch_timeout(b)
            elif b.state == "prepared" and now >= b.deadline and now >= b.next_ask:
                b.next_ask = now + self.config.retry
                self._in_doubt(b)

    def _persisted(self, token: int) -> None:
        what = self._on_persisted.pop(token, None)
        if what is None:
            return
        kind, gtid = what
        if kind == "recorded":
            tx = self.coord.get(gtid)
            if tx is not None and tx.phase == "recording":
                self._start_prepare(tx)
        elif kind == "prepared":
            b = self.branches.get(gtid)
            if b is not None and b.state == "persisting":
                self._branch_prepared(b)
        elif kind == "resolved":
            b = self.branches.get(gtid)
            if b is not None and b.state == "resolving":
                self._branch_resolved(b)

    # ------------------------------------------------------------- helpers
    def _send(self, to: NodeId, payload: dict[str, Any]) -> None:
        if to == self.name:
            self._loop.append(payload)
        else:
            self._out.append(Send(to, payload))

    def _persist(self, writes: list[tuple[bytes, bytes | None]], then: tuple[str, str]) -> None:
        self._token += 1
        if then[0]:
            self._on_persisted[self._token] = then
        self._out.append(Persist(self._token, tuple(writes)))

    def _log(self, level: str, message: str) -> None:
        self._out.append(Log(level, f"dtx {self.name}: {message}"))

    def floor(self) -> int:
        """Every gtid of this coordinator below this sequence has finished everywhere."""
        return min([tx.seq for tx in self.coord.values()] + [self.next_seq])

    # ============================================================= coordinator
    def _client(self, request_id: int, payload: Any) -> None:
        if isinstance(payload, dict) and payload.get("op") == "status":
            self._out.append(Reply(request_id, self.status()))
            return
        branches = payload.get("branches") if isinstance(payload, dict) else None
        why = self._check_branches(branches) if payload_op(payload) == "run" else "unknown op"
        if why is not None:
            self._out.append(Reply(request_id, {"ok": False, "error": "BadRequest", "why": why}))
            return
        assert isinstance(branches, dict)
        seq = self.next_seq
        self.next_seq += 1
        gtid = make_gtid(self.name, seq)
        tx = CoordTx(gtid, seq, branches, request_id, "recording")
        self.coord[gtid] = tx
        # Recorded before any prepare leaves: a crashed coordinator must find every
        # gtid whose branches may hold locks, to finish or roll them back.
        self._persist(
            [(K_COORD + gtid.encode(), _pack({"b": branches})), (K_SEQ, _pack(self.next_seq))],
            ("recorded", gtid),
        )

    def _check_branches(self, branches: Any) -> str | None:
        if not isinstance(branches, dict) or not branches:
            return "branches must be a non-empty {node: [op, ...]}"
        for node, ops in branches.items():
            if not isinstance(node, str) or not node or node == LOG:
                return f"bad node {node!r:.40}"
            why = self.rm.check_ops(ops)
            if why is not None:
                return f"{node}: {why}"
        return None

    def _start_prepare(self, tx: CoordTx) -> None:
        tx.phase = "preparing"
        tx.vote_deadline = self.now + self.config.vote_timeout
        tx.vote_limit = tx.vote_deadline + self.config.prepare_limit
        tx.next_retry = self.now + self.config.retry
        self._out.append(
            Notify(
                "dtx.begin", {"g": tx.gtid, "request_id": tx.request_id, "branches": tx.branches}
            )
        )
        for node in sorted(tx.branches):
            self._send_prepare(tx, node)

    def _send_prepare(self, tx: CoordTx, node: NodeId) -> None:
        ops = tx.branches[node]
        self._send(node, {"t": PREPARE, "g": tx.gtid, "ops": ops, "f": self.floor()})

    def _voted_yes(self, tx: CoordTx, node: NodeId, reads: dict[str, Any]) -> None:
        if tx.phase != "preparing":
            return  # a duplicate or late vote: phase one is over
        tx.votes[node] = reads
        if len(tx.votes) == len(tx.branches):
            self._on_all_yes(tx)

    def _on_all_yes(self, tx: CoordTx) -> None:
        """Every branch is prepared: propose commit, and act only on the log's answer."""
        tx.phase = "deciding"
        tx.proposed = COMMIT
        tx.next_retry = self.now + self.config.retry
        self._propose(tx.gtid, COMMIT, sorted(tx.branches))

    def _propose(self, gtid: str, outcome: str, tell: list[NodeId]) -> None:
        self._send(LOG, {"t": PROPOSE, "g": gtid, "o": outcome, "n": sorted({self.name, *tell})})

    def _voted_no(self, tx: CoordTx, node: NodeId, why: str) -> None:
        if tx.phase == "preparing":
            self._abort_before_commit(tx, "Aborted", f"{node} voted no: {why}")

    def _abort_before_commit(self, tx: CoordTx, error: str, why: str) -> None:
        """Abort on our own authority: safe because only this incarnation could propose commit.

        The log is not consulted: a participant in doubt that asks it finds no
        commit (nobody will ever propose one) and gets its own abort decided.
        """
        self._reply(tx, {"ok": False, "outcome": ABORT, "error": error, "why": why, "g": tx.gtid})
        self._enter_phase_two(tx, ABORT)

    def _coord_tick(self, tx: CoordTx, now: float) -> None:
        if tx.phase == "preparing":
            if now >= tx.vote_deadline:
                missing = sorted(set(tx.branches) - set(tx.votes))
                cfg = self.config
                waited = now - (tx.vote_limit - cfg.prepare_limit - cfg.vote_timeout)
                down = sorted(set(missing) & self.coordinators_down)
                why = f"{', '.join(down)} seen down" if down else "vote_timeout"
                self._log(
                    "warning",
                    f"{tx.gtid}: no vote from {', '.join(missing)} {waited:.1f} s after the "
                    f"prepares: aborted (B8, {why})",
                )
                self._abort_before_commit(tx, "Unavailable", f"no vote from {missing}")
                return
            if now >= tx.next_retry:
                tx.next_retry = now + self.config.retry
                for node in sorted(set(tx.branches) - set(tx.votes)):
                    self._send_prepare(tx, node)
        elif tx.phase == "deciding" and now >= tx.next_retry:
            tx.next_retry = now + self.config.retry
            assert tx.proposed is not None
            self._propose(tx.gtid, tx.proposed, sorted(tx.branches))
        elif tx.phase == "recovering" and now >= tx.next_retry:
            tx.next_retry = now + self.config.retry
            self._send(LOG, {"t": LOOKUP, "g": tx.gtid})
        elif tx.phase == "finishing":
            if tx.held_reply is not None and now >= tx.reply_by:
                # A participant has not applied the commit in time (down, cut off):
                # acknowledge with the decision durable, naming who has not applied.
                unapplied = sorted(set(tx.branches) - tx.acks - tx.applied)
                self._release_reply(tx, unapplied)
            if now >= tx.next_retry:
                tx.next_retry = now + self.config.retry
                self._send_outcomes(tx)

    def _coord_decided(self, tx: CoordTx, outcome: str) -> None:
        if tx.outcome is not None:
            if tx.outcome != outcome:
                self._log("error", f"{tx.gtid}: log says {outcome} but we finish {tx.outcome}")
            return
        if tx.phase == "recording":
            return  # cannot be: nobody has heard of the gtid yet
        if outcome == COMMIT:
            reads: dict[str, Any] = {}
            for node in sorted(tx.votes):
                reads.update(tx.votes[node])
            self._commit_decided(tx, {"ok": True, "outcome": COMMIT, "g": tx.gtid, "reads": reads})
        else:
            self._reply(tx, {"ok": False, "outcome": ABORT, "error": "Aborted", "g": tx.gtid})
        self._enter_phase_two(tx, outcome)

    def _commit_decided(self, tx: CoordTx, reply: dict[str, Any]) -> None:
        """The log decided commit: the reply waits until every participant applied it.

        Read-your-writes: a client told "committed" never reads, on any node, the
        state before the commit (docs/guarantees.md).  The wait is phase two's own
        round trip (outcome out, ack back): no message is added.
        """
        if tx.request_id is None or tx.replied:
            return
        tx.held_reply = reply
        tx.reply_by = self.now + self.config.apply_wait

    def _release_reply(self, tx: CoordTx, unapplied: list[NodeId]) -> None:
        reply, tx.held_reply = tx.held_reply, None
        assert reply is not None
        if unapplied:
            reply = {**reply, "unapplied": unapplied}
        self._reply(tx, reply)

    def _coord_unknown(self, tx: CoordTx, forgotten: bool) -> None:
        if tx.phase != "recovering":
            return
        if forgotten:
            # Below our own floor: phase two finished before the crash, only the
            # record's deletion was lost.
            self._finished(tx)
        else:
            # Undecided: we lost the votes, so we can only propose abort.  If our
            # commit proposal from before the crash is still in flight and lands
            # first, the log says commit and we finish that instead.
            tx.phase = "deciding"
            tx.proposed = ABORT
            tx.next_retry = self.now + self.config.retry
            self._propose(tx.gtid, ABORT, sorted(tx.branches))

    def _enter_phase_two(self, tx: CoordTx, outcome: str) -> None:
        tx.outcome = outcome
        tx.phase = "finishing"
        tx.next_retry = self.now + self.config.retry
        self._send_outcomes(tx)

    def _send_outcomes(self, tx: CoordTx) -> None:
        assert tx.outcome is not None
        floor = self.floor()
        for node in sorted(set(tx.branches) - tx.acks):
            self._send(node, {"t": OUTCOME, "g": tx.gtid, "o": tx.outcome, "f": floor})

    def _acked(self, tx: CoordTx, node: NodeId) -> None:
        if tx.phase != "finishing":
            return  # it resolved through the log; it will ack again once we know the outcome
        tx.acks.add(node)
        if tx.acks >= set(tx.branches):
            if tx.held_reply is not None:
                self._release_reply(tx, [])
            self._finished(tx)
        else:
            self._reply_if_applied(tx)

    def _applied(self, tx: CoordTx, node: NodeId) -> None:
        """``node`` applied the outcome durably but holds its ack (``hold_ack``): the client
        may hear the commit (read your writes); the gtid stays until the ack (section 4)."""
        if tx.phase != "finishing":
            return  # as for an ack: it will tell again once we know the outcome
        tx.applied.add(node)
        self._reply_if_applied(tx)

    def _reply_if_applied(self, tx: CoordTx) -> None:
        if tx.held_reply is not None and (tx.acks | tx.applied) >= set(tx.branches):
            self._release_reply(tx, [])

    def _finished(self, tx: CoordTx) -> None:
        """Phase two is complete everywhere: forget the gtid, raise the floor (compaction).

        The log hears the new floor on the next tick past ``forget_every``, not now:
        one ``forget`` entry then covers every transaction finished meanwhile.
        """
        del self.coord[tx.gtid]
        self._persist([(K_COORD + tx.gtid.encode(), None)], ("", tx.gtid))
        self._out.append(Notify("dtx.finished", {"g": tx.gtid, "o": tx.outcome}))

    def _forget(self) -> None:
        """Compaction: tell the log every gtid of ours below the floor is finished everywhere.

        Sent from the tick, at most every ``forget_every``, and resent until the log
        confirms it (``log_floor``); section 6 of docs/design/dtx.md.
        """
        self._next_forget = self.now + self.config.forget_every
        self.sent_floor = self.floor()
        self._send(LOG, {"t": FORGET, "c": self.name, "f": self.sent_floor})

    def _reply(self, tx: CoordTx, payload: dict[str, Any]) -> None:
        if tx.request_id is not None and not tx.replied:
            tx.replied = True
            self._out.append(Reply(tx.request_id, payload))

    # ============================================================= participant
    def _prepare(self, gtid: str, ops: Any) -> None:
        parsed = parse_gtid(gtid)
        assert parsed is not None
        coordinator, seq = parsed
        if seq < self.floors.get(coordinator, 0):
            self._vote(gtid, coordinator, False, "finished long ago")
            return
        tomb = self.tombs.get(gtid)
        if tomb is not None:
            if tomb == ABORT:  # aborted here (maybe on our own, B9): a late prepare gets no
                self._vote(gtid, coordinator, False, "aborted")
            return
        b = self.branches.get(gtid)
        if b is not None:
            if b.state == "prepared":  # our vote was lost: say it again
                self._vote(gtid, coordinator, True, reads=b.reads)
            return
        why = self.rm.check_ops(ops)
        if why is not None:
            self._vote(gtid, coordinator, False, f"bad ops: {why}")
            return
        assert isinstance(ops, list)
        b = Branch(gtid, coordinator, "locking", self.now + self.config.branch_timeout)
        b.limit = self.now + self.config.prepare_limit
        self.branches[gtid] = b
        self._progress(self.rm.open(gtid, ops))

    def _progress(self, results: list[Progress]) -> None:
        for result in results:
            b = self.branches.get(result.gtid)
            if b is None or b.state != "locking":
                continue
            if isinstance(result, Refused):
                del self.branches[b.gtid]
                self.tombs[b.gtid] = ABORT
                self._vote(b.gtid, b.coordinator, False, result.reason)
                continue
            if isinstance(result, Working):
                b.working = True
                continue
            b.state = "persisting"
            b.reads = result.reads
            record = {"c": b.coordinator, "r": result.record, "reads": result.reads}
            self._persist([(K_PREPARED + b.gtid.encode(), _pack(record))], ("prepared", b.gtid))

    def _branch_prepared(self, b: Branch) -> None:
        b.state = "prepared"
        b.deadline = self.now + self.config.decision_timeout
        if b.coordinator in self.coordinators_down:
            b.deadline = self.now  # its coordinator died meanwhile: ask the log (peers_down)
        if b.pending_outcome is not None:  # the outcome overtook our durable prepare
            self._participant_outcome(b.gtid, b.pending_outcome)
            return
        self._vote(b.gtid, b.coordinator, True, reads=b.reads)

    def _vote(
        self,
        gtid: str,
        coordinator: NodeId,
        yes: bool,
        why: str = "",
        reads: dict[str, Any] | None = None,
    ) -> None:
        if yes:
            self._send(coordinator, {"t": VOTE, "g": gtid, "v": "yes", "r": reads or {}})
        else:
            self._send(coordinator, {"t": VOTE, "g": gtid, "v": "no", "why": why})

    def _still_working(self, b: Branch, now: float) -> bool:
        """Is ``b`` preparing (:class:`Working`) within ``prepare_limit``, its coordinator
        not seen down?  Then its lock-wait deadline does not apply."""
        return b.working and now < b.limit and b.coordinator not in self.coordinators_down

    def _still_preparing(self, tx: CoordTx, node: NodeId) -> None:
        """``node`` says its branch is still preparing: its vote is not late yet, up to
        ``vote_limit`` -- unless a participant still to vote is down (B8 stands)."""
        if tx.phase != "preparing" or node in tx.votes:
            return
        if (set(tx.branches) - set(tx.votes)) & self.coordinators_down:
            return
        wanted = min(self.now + self.config.vote_timeout, tx.vote_limit)
        tx.vote_deadline = max(tx.vote_deadline, wanted)

    def _branch_timeout(self, b: Branch) -> None:
        """Never prepared in time (lock wait, lost coordinator): abort it, release the locks."""
        del self.branches[b.gtid]
        self.tombs[b.gtid] = ABORT
        _, progress = self.rm.finish(b.gtid, False)
        self._vote(b.gtid, b.coordinator, False, "branch timeout")
        self._progress(progress)

    def _in_doubt(self, b: Branch) -> None:
        """Prepared and no outcome in time (B9): ask the log, proposing abort.

        The proposal doubles as the lookup: if a decision exists, the log answers
        with it; if not, ours becomes the decision.  Either way everybody applies
        the one the log holds, so waiting for a dead coordinator ends here.
        """
        b.asked = True
        self._propose(b.gtid, ABORT, [b.coordinator])

    def _participant_outcome(self, gtid: str, outcome: str) -> None:
        b = self.branches.get(gtid)
        parsed = parse_gtid(gtid)
        assert parsed is not None
        coordinator, seq = parsed
        if b is None:
            tomb = self.tombs.get(gtid)
            if tomb is not None and tomb != outcome:
                self._log("error", f"{gtid}: told {outcome} but applied {tomb}")
                self._out.append(Notify("dtx.conflict", {"g": gtid, "o": outcome, "had": tomb}))
                return
            if tomb is None and outcome == COMMIT and seq >= self.floors.get(coordinator, 0):
                # A commit needs our durable yes vote, so a prepared record: losing it is a bug.
                self._log("error", f"{gtid}: commit for a branch never prepared here")
                self._out.append(Notify("dtx.conflict", {"g": gtid, "o": outcome, "had": None}))
                return
            if tomb is None and outcome == ABORT:
                self.tombs[gtid] = ABORT  # so a prepare still in flight is refused
            self._ack(coordinator, gtid)
            return
        if b.state == "locking":
            if outcome == COMMIT:
                self._log("error", f"{gtid}: commit before we prepared")
                self._out.append(Notify("dtx.conflict", {"g": gtid, "o": outcome, "had": None}))
                return
            del self.branches[gtid]
            self.tombs[gtid] = ABORT
            _, progress = self.rm.finish(gtid, False)
            self._ack(coordinator, gtid)
            self._progress(progress)
        elif b.state == "persisting":
            b.pending_outcome = outcome
        elif b.state == "prepared":
            self._resolve(b, outcome)
        elif b.resolving != outcome:
            self._log("error", f"{gtid}: told {outcome} while applying {b.resolving}")
            self._out.append(Notify("dtx.conflict", {"g": gtid, "o": outcome, "had": b.resolving}))

    def _resolve(self, b: Branch, outcome: str) -> None:
        """Apply the outcome: effects, end of the prepared record and tombstone in one write."""
        b.state = "resolving"
        b.resolving = outcome
        writes, progress = self.rm.finish(b.gtid, outcome == COMMIT)
        writes = [
            *writes,
            (K_PREPARED + b.gtid.encode(), None),
            (K_TOMB + b.gtid.encode(), outcome.encode()),
        ]
        self._persist(writes, ("resolved", b.gtid))
        self._progress(progress)

    def _branch_resolved(self, b: Branch) -> None:
        assert b.resolving is not None
        del self.branches[b.gtid]
        self.tombs[b.gtid] = b.resolving
        self.durable_tombs.add(b.gtid)
        self._out.append(Notify("dtx.resolved", {"g": b.gtid, "o": b.resolving, "node": self.name}))
        self._ack(b.coordinator, b.gtid)

    def _ack(self, coordinator: NodeId, gtid: str) -> None:
        """Acknowledge phase two of ``gtid``; while the composition holds the ack (hold_ack),
        only say it is applied here (the client's reply need not wait for the hold)."""
        if not self.hold_ack(gtid):
            self._send(coordinator, {"t": ACK, "g": gtid})
        else:
            self._send(coordinator, {"t": APPLIED, "g": gtid})

    def _learn_floor(self, coordinator: NodeId, floor: int) -> None:
        """The coordinator finished every gtid below ``floor``: refuse their prepares from now.

        Their tombstones are dropped later, in one durable write per ``forget_every``
        (:meth:`_prune_tombstones`): a tombstone kept longer is only redundant (it
        refuses the same late prepares as the floor), and the durable floor may lag
        the one in memory for the same reason.
        """
        if floor <= self.floors.get(coordinator, 0):
            return
        self.floors[coordinator] = floor
        self._floors_learned.add(coordinator)

    def _prune_tombstones(self) -> None:
        """Persist the floors learned since the last pruning, dropping the tombstones below."""
        self._next_prune = self.now + self.config.forget_every
        learned, self._floors_learned = self._floors_learned, set()
        writes: list[tuple[bytes, bytes | None]] = [
            (K_FLOOR + c.encode(), _pack(self.floors[c])) for c in sorted(learned)
        ]
        for gtid in list(self.tombs):
            parsed = parse_gtid(gtid)
            if parsed is not None and parsed[0] in learned and parsed[1] < self.floors[parsed[0]]:
                del self.tombs[gtid]
                if gtid in self.durable_tombs:
                    self.durable_tombs.discard(gtid)
                    writes.append((K_TOMB + gtid.encode(), None))
        self._persist(writes, ("", ""))

    # ============================================================= the log's answers
    def _decided(self, gtid: str, outcome: str) -> None:
        tx = self.coord.get(gtid)
        if tx is not None:
            self._coord_decided(tx, outcome)
        if gtid in self.branches:
            self._participant_outcome(gtid, outcome)

    def _unknown(self, gtid: str, forgotten: bool) -> None:
        tx = self.coord.get(gtid)
        if tx is not None:
            self._coord_unknown(tx, forgotten)
        b = self.branches.get(gtid)
        if b is not None and forgotten and b.state == "prepared":
            # Finished everywhere, yet prepared here: a ghost of a duplicated
            # prepare.  Its outcome was applied already; this copy must not be.
            self._log("warning", f"{gtid}: prepared after it was finished; discarding")
            del self.branches[gtid]
            _, progress = self.rm.finish(gtid, False)
            self._persist([(K_PREPARED + gtid.encode(), None)], ("", gtid))
            self._progress(progress)

    # ============================================================= inspection
    def status(self) -> dict[str, Any]:
        """What this node is doing (client ``status`` op, tests, the campaign's liveness check)."""
        return {
            "node": self.name,
            "coordinating": {g: tx.phase for g, tx in sorted(self.coord.items())},
            "branches": {g: b.state for g, b in sorted(self.branches.items())},
            "tombstones": len(self.tombs),
            "floor": self.floor(),
        }


def _never(gtid: str) -> bool:
    return False


def payload_op(payload: Any) -> Any:
    return payload.get("op") if isinstance(payload, dict) else None
