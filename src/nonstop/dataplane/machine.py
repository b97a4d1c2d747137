"""The data plane of one node as a sans-I/O machine (docs/design/dataplane-machine.md).

:class:`DataPlane` holds the node's client sessions, the branches it holds
(its sessions' own and those remote coordinators opened here), the
coordinator's two-phase orchestration, commit request results (H1), the
unique-key hints and the reaction to membership changes.  It follows the
machine rules of :mod:`nonstop.runtime.interface`; its events and actions are
:mod:`nonstop.dataplane.events`.  The store runs its ``Exec`` actions and the
distributed-commit machine its ``Decide`` actions; the asyncio adapter of the
real node is :mod:`nonstop.dataplane.service`, the simulator's
``nonstop.sim.scenarios.dataplane``.

A client op runs as a coroutine (:mod:`nonstop.dataplane.steps`, run by
:mod:`nonstop.dataplane.driver`): the session ops are
:mod:`nonstop.dataplane.session_ops`, the commit :mod:`nonstop.dataplane.commit`,
request results :mod:`nonstop.dataplane.results`.  The data requests this node
sends are :mod:`nonstop.dataplane.calls`, the branches it holds and the branch
ops peers send :mod:`nonstop.dataplane.branches`.  This module holds the
sessions and routes the events.
"""

from __future__ import annotations

import collections
import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nonstop import errors
from nonstop.dataplane.args import RequestId, parse_home
from nonstop.dataplane.branches import BranchRegistry
from nonstop.dataplane.calls import BUSY, COMMITTING_OPS, PROBE, PROBED, RPC_TIMER, PeerCalls
from nonstop.dataplane.commit import g_commit
from nonstop.dataplane.deadlocks import WAITS_TIMER, DeadlockDetector, claimed_age
from nonstop.dataplane.driver import ALONE, COMMIT_TIMER, FIRST, Driver, Immediate
from nonstop.dataplane.ends import OwedEnds
from nonstop.dataplane.events import (
    BranchDone,
    ClientGone,
    ClientOp,
    ClientReply,
    ClusterChanged,
    DataAction,
    DecisionDone,
    EndBranch,
    Exec,
    LocalWaits,
)
from nonstop.dataplane.holdings import HOLDINGS_OP, g_holdings
from nonstop.dataplane.lapse_waits import LAPSE_TIMER, LapseWaits
from nonstop.dataplane.managed_types import check_type
from nonstop.dataplane.placement import Placement
from nonstop.dataplane.request_result import g_request_result
from nonstop.dataplane.results import g_commit_retry, g_settle
from nonstop.dataplane.routing import SESSION_OPS
from nonstop.dataplane.session_ops import OPS, WRITE_NOW, take_writes
from nonstop.dataplane.sizes import check_writes
from nonstop.dataplane.snapshot_cut import g_cut, needs_cut, outside_cut, view_refusal
from nonstop.dataplane.state import ACTIVE, COMMITTING, OVER, Branch, Session
from nonstop.dataplane.steps import (
    UNDECIDED,
    Call,
    Gather,
    OpCoroutine,
    Task,
)
from nonstop.dataplane.view import ClusterView
from nonstop.model.wire import STORE_ISOLATION, error_out
from nonstop.net.frames import DEFAULT_MAX_FRAME
from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    Log,
    Received,
    SetTimer,
    Started,
    TimerFired,
)

SWEEP_TIMER = "dp.sweep"
"""Every ``sweep_every``: participants' branches idle for ``branch_idle`` and sessions
idle for ``tx_idle`` roll back."""

_BOUND = 10_000
"""How many broken sessions and recent request outcomes are remembered."""
_MAX_HINTS = 100_000


@dataclass
class DataPlaneConfig:
    """Timeouts of the data path (seconds) and the managed-type check."""

    branch_idle: float = 90.0
    """A participant's branch without an op for this long is rolled back (B8): the
    backstop for a coordinator that is up but silent (a lost ``branch.end``); above
    ``tx_idle``, so that an idle transaction is ended by its coordinator first."""
    tx_idle: float = 60.0
    """A session (an open transaction) with no client op for this long is rolled back
    on every node, its own branch included; its next op hears TransactionClosed."""
    rpc_timeout: float = 15.0
    """A peer that does not answer a data request this long is Unavailable (> lock wait)."""
    probe_after: float = 2.0
    """A data request unanswered this long is probed (calls.py): if the peer does not run
    it, it was lost with a connection and fails now, not at ``rpc_timeout`` (0: off)."""
    commit_timeout: float = 30.0
    """A two-phase commit undecided this long: the client hears Unavailable (outcome unknown)."""
    lapse_wait: float = 2.0
    """Seconds an op waits out a lapse of this node's lease before it is refused NotActive
    (``lapse_waits.py``; a participant's op at most ``rpc_timeout / 2``; 0: refused at once)."""
    sweep_every: float = 1.0
    """How often idle branches are looked for."""
    max_message: int = DEFAULT_MAX_FRAME
    """The largest message to a peer (``max_frame_bytes``): writes that would not fit
    are refused with TooLarge before they are sent (``dataplane/sizes.py``)."""
    deadlock_every: float = 0.025
    """How often the wait-for edges are read, shared and searched for cycles that
    span nodes (docs/design/deadlocks.md); 0 turns distributed detection off."""
    deadlock_wound: str = "blocked"
    """Wound-wait on the gathered wait-for edges (docs/design/deadlocks.md): an older
    transaction waiting for a younger one that is itself waiting wounds it
    (``"blocked"``), or for any younger one (``"any"``); ``"off"``: cycles only."""
    deadlock_age_max: float = 0.0
    """The most seniority a replayed transaction may claim (``age`` on ``begin``, seconds):
    a replay keeps its first attempt's rank up to this, so a client cannot make itself
    older than it is by more.  0 (the default): every replay ranks anew -- keeping the
    rank cost more wounds and longer gaps than it saved on real processes
    (docs/design/deadlocks.md section 2b)."""
    check_type: Callable[[Any, Any], object] = check_type
    """``(type name, client's version)`` → raises UnknownType / TypeVersionMismatch.
    The coordinator checks before anything runs; the store checks again."""
    placement: Placement | None = None
    """Routing by partition (``ha.data = "partitions"``, ha.md "Routing by partition"):
    where creates and unique keys go.  None: route by node (references name a node's
    store, creates go to the coordinator's node, unique lookups ask every node)."""
    acting: Callable[[float, str], bool] | None = None
    """``(now, partition)`` → whether this node acts for it at that instant (the cluster
    node's ``acting``: lease held, ha.md §8).  None: the acting flag of the latest view."""
    applied_epoch: Callable[[str], int | None] | None = None
    """``partition`` → its epoch in this node's applied partition table at this instant
    (None: not in it).  The fence compares an op's epoch with it, not with the latest
    view's: the view reaches the data plane at the end of a step, and a step that applies
    a table entry may also answer an op (a commit's phase two releasing its locks) --
    answered from the view, the op would pass a fence its epoch no longer holds
    (replication.md §10b, seeds 1767 and 2293).  None: the latest view's epoch."""


class DataPlane(Driver):
    """The data-plane machine of node ``name`` (module doc)."""

    def __init__(
        self, name: str, rng: random.Random, config: DataPlaneConfig | None = None
    ) -> None:
        self.name = name
        self.config = config or DataPlaneConfig()
        super().__init__(self.config.commit_timeout)
        self.check_type = self.config.check_type
        self.view = ClusterView(name)
        self.sessions: dict[int, Session] = {}
        self._by_conn: dict[int, set[int]] = {}
        # Branch ids "<node>.<sid>" must never repeat, also across restarts of this
        # node: participants remember ended branches, and a reused id would either be
        # refused or, worse, join a stale branch.  A random start per incarnation.
        self._next_sid = rng.randrange(1, 1 << 52)
        self.registry = BranchRegistry(self)
        self._broken: collections.OrderedDict[int, tuple[type[errors.Error], str]] = (
            collections.OrderedDict()
        )
        """Sessions rolled back by the node (a node of theirs went down, idle, deadlock
        victim) → the error their next op hears (class, message)."""
        self.calls = PeerCalls(self, rng)
        self.ends = OwedEnds(self)
        """``branch.end`` owed to peers until they answer (ends.py, issue 14)."""
        self.recent: collections.OrderedDict[RequestId, dict[str, Any]] = collections.OrderedDict()
        """Outcomes of recent commit requests (phase two may not have reached the store yet)."""
        self.hints: collections.OrderedDict[tuple[str, bytes], str] = collections.OrderedDict()
        """(type, packed unique key) → the node a cluster-scope get found it on last."""
        self.stats = collections.Counter[str]()
        self.deadlocks = DeadlockDetector(self)
        self._fenced: dict[int, dict[str, int]] = {}
        """Exec corr → the (partition, epoch) fence checked again when its answer comes."""
        self.lapses = LapseWaits(self)
        """Ops and answers waiting out a lapse of this node's lease (lapse_waits.py)."""
        self._now = 0.0
        self._handlers: dict[type, Callable[[Any], None]] = {
            ClientOp: self._on_client_op,
            BranchDone: self._on_branch_done,
            Received: self._on_received,
            TimerFired: self._on_timer,
            DecisionDone: self._on_decision,
            ClientGone: self._on_client_gone,
            ClusterChanged: self._on_cluster,
            Started: self._on_started,
            LocalWaits: self._on_local_waits,
        }

    # ================================================================ machine
    def handle(self, event: Any) -> list[Action | DataAction]:
        """Consume one event; the actions to carry out, in order."""
        out = self._out = []
        handler = self._handlers.get(type(event))
        if handler is None:
            out.append(Log("warning", f"data plane: unexpected event {type(event).__name__}"))
        else:
            self._now = event.now
            handler(event)
            if self.lapses:
                self.lapses.settle()
        return out

    @property
    def branches(self) -> dict[str, Branch]:
        """The branches this node holds now: branch id → record (read-only use)."""
        return self.registry.branches

    def take_branch(self, bid: str, now: float | None = None) -> bool:
        """The commit participant takes branch ``bid`` over for two-phase commit.

        True if it was held here: from then on the machine forgets it (no idle
        timeout, ``branch.end`` or session end touches it; its outcome ends it).
        Routing by partition: False (the participant votes no, "branch gone",
        retryable) unless this node acts at ``now`` for every (partition, epoch) the
        branch's ops touched -- the vote is fenced like the ops.  ``now``: the time
        of the call (it comes from outside the machine's events; without it, the
        time of the last event, which may be well before: a lease that ran out since
        would still look held).
        """
        self._catch_up(now)
        branch = self.registry.branches.get(bid)
        if branch is not None and branch.fence:
            refused = self.not_active(branch.fence)
            if refused is not None:
                # Not ended here (called outside ``handle``): its session's end does it.
                self.stats["fenced_votes"] += 1
                return False
        return self.registry.take(bid)

    def vote_lapsed(self, bid: str, now: float | None = None) -> bool:
        """Whether :meth:`take_branch` refuses ``bid`` only because this node's lease
        lapsed (its applied table still names every fenced epoch): the participant may
        ask again until it acts (``lapse_waits.py``; the resource managers' vote wait)."""
        self._catch_up(now)
        branch = self.registry.branches.get(bid)
        return (
            branch is not None
            and bool(branch.fence)
            and self.not_active(branch.fence) is not None
            and self.lapses.lapsed_only(branch.fence)
        )

    def _catch_up(self, now: float | None) -> None:
        """A call from outside the events at ``now``: the machine's time moves on to it."""
        if now is not None and now > self._now:
            self._now = now

    def log(self, level: str, message: str) -> None:
        self._out.append(Log(level, message))

    def emit(self, action: Action | DataAction) -> None:
        self._out.append(action)

    @property
    def now(self) -> float:
        """The time of the event being handled."""
        return self._now

    # ================================================================ clients
    def _on_client_op(self, ev: ClientOp) -> None:
        self.stats["client_ops"] += 1
        p = ev.payload
        try:
            if not isinstance(p, dict):
                raise errors.BadArgument("a data op is a map with an 'op'")
            op = p.get("op")
            if not isinstance(op, str):
                raise errors.BadArgument(f"op must be an op name, not {op!r:.40}")
            if op in SESSION_OPS:
                self._session_op(ev.conn, ev.corr, op, p)
            elif op == "tx.begin":
                s = self._begin(ev.conn, p.get("iso"), p.get("age"))
                self._out.append(ClientReply(ev.conn, ev.corr, {"s": s.sid}))
            elif op == "request.result":
                home = parse_home(p.get("home"))
                if home is None:
                    task = Task(g_request_result(self, p.get("req")), ev.conn, ev.corr)
                else:
                    # Asked of the home partition's active node, in a read-only
                    # session of its own (fenced by the partition's epoch; requests.md).
                    s = self._begin(ev.conn, "read_committed")
                    fence = p.get("fence") is True
                    s.task = task = Task(
                        g_request_result(self, p.get("req"), s, home, fence), ev.conn, ev.corr, s
                    )
                self._run(task, None, None)
            elif op == HOLDINGS_OP:
                # A read-only session of its own, ended by the op (holdings.py).
                s = self._begin(ev.conn, "snapshot")
                s.task = Task(g_holdings(self, s, p), ev.conn, ev.corr, s)
                self._run(s.task, None, None)
            else:
                raise errors.BadArgument(f"unknown op {op!r:.40}")
        except errors.Error as exc:
            self._out.append(ClientReply(ev.conn, ev.corr, error_out(exc)))

    def _session_op(self, conn: int, corr: Any, op: str, p: dict[str, Any]) -> None:
        sid = p.get("s")
        if sid is None and "begin" in p:
            # tx.begin folded into the session's first op: one round trip less.
            new = self._begin(conn, p.get("begin"), p.get("age"))
            if op == "tx.rollback":  # a session opened and ended
                self.end_session(new)
                self._out.append(ClientReply(conn, corr, {"s": new.sid}))
                return
            self._start_op(new, conn, corr, op, p, fold=True)
            return
        s = self._session(conn, sid)
        if op == "tx.rollback":
            if s is not None:
                self.end_session(s)
            self._out.append(ClientReply(conn, corr, {}))
            return
        if s is None or s.state != ACTIVE:
            if op == "tx.commit" and p.get("req") is not None:
                # A commit retried after its reply was lost: the first outcome (H1).
                self._run(Task(g_commit_retry(self, p.get("req"), sid), conn, corr), None, None)
                return
            raise self.closed_error(sid)
        if s.task is not None:  # one op at a time: after the one running
            if s.queue is None:
                s.queue = collections.deque()
            s.queue.append((conn, corr, op, p))
            return
        self._start_op(s, conn, corr, op, p, fold=False)

    def _begin(self, conn: int, iso: Any, age: Any = None) -> Session:
        iso = iso or "serializable"
        if not isinstance(iso, str) or iso not in STORE_ISOLATION:
            raise errors.BadArgument(
                f"iso must be 'serializable' or 'read_committed', not {iso!r:.40}"
            )
        seniority = claimed_age(age, self.config.deadlock_age_max)
        sid = self._next_sid
        self._next_sid += 1
        s = Session(sid, conn, STORE_ISOLATION[iso], f"{self.name}.{sid}")
        s.last = s.started = self._now
        s.age = seniority
        self.sessions[sid] = s
        conn_sids = self._by_conn.get(conn)
        if conn_sids is None:
            conn_sids = self._by_conn[conn] = set()
        conn_sids.add(sid)
        return s

    def _session(self, conn: int, sid: Any) -> Session | None:
        if not isinstance(sid, int) or isinstance(sid, bool):
            raise errors.BadArgument(f"s must be a session id, not {sid!r:.40}")
        s = self.sessions.get(sid)
        if s is None or s.conn != conn:
            return None
        return s

    def closed_error(self, sid: Any) -> errors.Error:
        """The error of an op on a session that is over (Unavailable if a node of it died)."""
        broken = self._broken.get(sid) if isinstance(sid, int) else None
        if broken is not None:
            cls, why = broken
            return cls(why)
        return errors.TransactionClosed(f"transaction {sid!r:.40} is over")

    def _start_op(
        self, s: Session, conn: int, corr: Any, op: str, p: dict[str, Any], fold: bool
    ) -> None:
        if op == "tx.commit":
            gen = g_commit(self, s, p)
        elif needs_cut(s, op):
            gen = _g_after_cut(self, s, op, p)  # a snapshot's views first (snapshot_cut.py)
        elif p.get("w"):
            gen = _g_with_writes(self, s, op, p)
        else:
            gen = OPS[op](self, s, p)
        task = Task(gen, conn, corr, s)
        task.fold = fold
        s.task = task
        s.last = self._now
        self._run(task, None, None)

    def _next_op(self, s: Session) -> None:
        """The op that waited for the one just finished (if any) runs now."""
        queue = s.queue
        while queue:
            conn, corr, op, p = queue.popleft()
            if s.state != ACTIVE:
                self._out.append(ClientReply(conn, corr, error_out(self.closed_error(s.sid))))
                continue
            self._start_op(s, conn, corr, op, p, fold=False)
            return

    def _task_over(self, task: Task) -> None:
        s = task.session
        if s is not None and s.task is task:
            s.task = None
            s.last = self._now
            if s.queue:
                self._next_op(s)

    def _failed(self, task: Task, error: errors.Error) -> None:
        s = task.session
        if s is not None and s.state == ACTIVE and isinstance(error, _DOOMING):
            # The branch that failed is doomed or gone: the whole transaction is
            # over, and every other branch is released now (B8).
            self.end_session(s)

    def _on_client_gone(self, ev: ClientGone) -> None:
        """The connection closed: its sessions roll back, except committing ones (B8)."""
        for sid in sorted(self._by_conn.pop(ev.conn, ())):
            s = self.sessions.get(sid)
            if s is not None and s.state == ACTIVE:
                self.end_session(s, answer=False)

    # ============================================================== sessions
    def end_session(self, s: Session, answer: bool = True) -> None:
        """Roll the session back everywhere (B8): here now, remote branches by message.

        Its op in flight (if any, and not the caller) is dropped and answered
        with the error its next op would get; so are the ops queued behind it.
        """
        if s.state != ACTIVE:
            return
        s.state = OVER
        s.pending.clear()
        self.forget_session(s)
        self._release(s)
        task, queue = s.task, s.queue
        s.queue = None
        if task is not None and task is not self._current and not task.done:
            s.task = None
            task.done = True
            if inspect.getgeneratorstate(task.gen) != inspect.GEN_RUNNING:
                # (Running: the op ends its own session from a ``finally`` while it is being
                # closed -- by the garbage collector when a crashed simulated node's machine
                # is dropped; closing it again would raise "generator already executing".)
                task.gen.close()
            if answer:
                self._answer(task, error_out(self.closed_error(s.sid)))
        if queue and answer:
            for conn, corr, _, _ in queue:
                self._out.append(ClientReply(conn, corr, error_out(self.closed_error(s.sid))))

    def doom(self, s: Session, cls: type[errors.Error], why: str) -> None:
        """Roll ``s`` back now on every node; its op in flight and its next op hear ``cls(why)``."""
        self._broken[s.sid] = (cls, why)
        while len(self._broken) > _BOUND:
            self._broken.popitem(last=False)
        self.end_session(s)

    def _sweep_sessions(self, now: float) -> None:
        """Roll back sessions without a client op for ``tx_idle`` (no lock held for ever)."""
        limit = self.config.tx_idle
        cutoff = now - limit
        idle = [
            s
            for s in self.sessions.values()
            if s.state == ACTIVE and s.task is None and s.last <= cutoff
        ]
        for s in idle:
            self.stats["idle_sessions"] += 1
            self.log("info", f"transaction {s.bid} idle for {limit:g} s: rolled back")
            why = f"transaction {s.sid} rolled back after {limit:g} s idle (tx_idle)"
            self.doom(s, errors.TransactionClosed, why)

    def forget_session(self, s: Session) -> None:
        self.sessions.pop(s.sid, None)
        sids = self._by_conn.get(s.conn)
        if sids is not None:
            sids.discard(s.sid)
            if not sids:
                del self._by_conn[s.conn]

    def _release(self, s: Session) -> None:
        """End every branch of ``s`` still open (B8).

        Branches that took part in two-phase commit are the participant's by
        now (:meth:`take_branch` took them out of the registry), so this
        releases exactly the read-only ones, and rolls back everything else.
        """
        if self.registry.branches.pop(s.bid, None) is not None:
            self._out.append(EndBranch(s.bid))
        for node in sorted(s.remote - s.committed):
            # An op may still be on its way there (sent, reply unknown): told until
            # that node answers, also if it is not up now (ends.py).
            self.ends.owe(node, s.bid)
        s.remote.clear()

    def finish_commit(
        self,
        s: Session,
        req: RequestId | None,
        outcome: dict[str, Any] | None,
        record: bool = True,
    ) -> None:
        """The commit of ``s`` is over: release its branches, settle its request (H1).

        ``outcome`` None: the request was found already done (nothing to record).
        ``record`` False: an abort is remembered here, not recorded in the store (a
        homed request: its record lives with its home partition, requests.md).
        """
        s.state = OVER
        self._release(s)
        self.forget_session(s)
        if req is None:
            return
        if outcome is None:
            for task in self.running.pop(req, ()):
                self.resolve(task, -1, None, None)
        else:
            self._run(Task(g_settle(self, req, outcome, record), None, None), None, None)

    def settled(self, req: RequestId, outcome: dict[str, Any]) -> None:
        """Request ``req`` has its outcome: remember it, answer those waiting for it."""
        self.recent[req] = outcome
        while len(self.recent) > _BOUND:
            self.recent.popitem(last=False)
        for task in self.running.pop(req, ()):
            self.resolve(task, -1, outcome, None)

    def forget_branch(self, bid: str) -> None:
        """The branch was committed here: nothing is left to end."""
        self.registry.branches.pop(bid, None)

    def remember(self, hint_key: tuple[str, bytes], node: str) -> None:
        self.hints[hint_key] = node
        while len(self.hints) > _MAX_HINTS:
            self.hints.popitem(last=False)

    # ============================================================ partitions
    def locate(self, s: Session, ref: bytes) -> str:
        """The node serving ``ref`` now; under routing by partition the session's ops
        on that node are fenced by the partition's epoch from here on."""
        node, part = self.view.route(ref)
        if part is not None:
            s.fence.setdefault(node, {})[part.name] = part.epoch
        return node

    def place(self, s: Session, partition: str) -> str:
        """The active node of ``partition`` (Unavailable if none), fenced as :meth:`locate`."""
        part = self.view.partitions.get(partition)
        if part is None:
            # Start-up: the leader defines the table after the nodes start; retryable.
            raise errors.NotActive(f"partition {partition} is not in the table here yet")
        node = self.view.active_of(part)
        s.fence.setdefault(node, {})[part.name] = part.epoch
        return node

    def acting_epochs(self) -> dict[str, int]:
        """{partition: epoch} of every partition this node acts for now."""
        out: dict[str, int] = {}
        applied_epoch = self.config.applied_epoch
        for name, part in self.view.partitions.items():
            epoch = applied_epoch(name) if applied_epoch is not None else part.epoch
            if epoch is not None and self.not_active({name: epoch}) is None:
                out[name] = epoch
        return out

    def epoch_here(self, partition: str) -> int | None:
        """``partition``'s epoch in this node's applied table (``config.applied_epoch``),
        else in the latest view; None if neither has it."""
        applied_epoch = self.config.applied_epoch
        if applied_epoch is not None:
            return applied_epoch(partition)
        part = self.view.partitions.get(partition)
        return None if part is None else part.epoch

    def not_active(self, fence: dict[str, int]) -> errors.NotActive | None:
        """NotActive unless this node acts, now, for every (partition, epoch) of ``fence``."""
        acting = self.config.acting
        for name, epoch in fence.items():
            part = self.view.partitions.get(name)
            here = self.epoch_here(name)
            if here is None or here != epoch:
                now = "unknown here" if here is None else f"at epoch {here}"
                return errors.NotActive(
                    f"{self.name} does not act for partition {name} at epoch {epoch} ({now})"
                )
            if acting is not None:
                acts = acting(self._now, name)
            else:
                acts = part is not None and part.acting
            if not acts:
                return errors.NotActive(
                    f"{self.name} does not act for partition {name} (epoch {epoch}) now"
                )
        return None

    def _call(self, task: Task, slot: int, call: Call) -> Immediate | None:
        """Run branch op ``call`` of the task's session, here or on a peer."""
        s = task.session
        assert s is not None, "a Call outside a session"
        node = call.node
        refused = outside_cut(s, node)
        if refused is not None:
            return None, refused
        if slot == ALONE and node != self.name and self.name in s.pending:
            # Writes to objects mastered here are applied before the op goes
            # anywhere else, as when they arrived.
            task.then = call
            return self._call(task, FIRST, Call(self.name, WRITE_NOW, {}))
        fence = s.fence.get(node)
        if node == self.name and fence:
            refused = self.not_active(fence)
            if refused is not None:
                if self.lapses.wait(
                    fence,
                    self.config.lapse_wait,
                    lambda: self._call_again(task, slot, call),
                    lambda exc: self.resolve(task, slot, None, exc),
                ):
                    return None
                return None, refused
        pending = s.pending.get(node)
        if pending and node != self.name:
            try:
                check_writes(node, pending.values(), self.config.max_message)
            except errors.TooLarge as exc:
                return None, exc
        pending = s.pending.pop(node, None)
        writes = list(pending.values()) if pending else None
        if node == self.name:
            iso = None
            if not s.local_open:
                if s.state != ACTIVE and s.state != COMMITTING:
                    return None, errors.TransactionClosed(f"transaction {s.sid} is over")
                s.local_open = True
                iso = s.iso
                self.registry.branches[s.bid] = Branch(s.bid, True, self._now)
            branch = self.registry.branches.get(s.bid)
            refused = view_refusal(self, branch, call.op, fence, bool(call.fields.get("reset")))
            if refused is not None:
                return None, refused
            corr = self.next_corr()
            if fence:
                if branch is not None:
                    branch.fence.update(fence)
                if call.op not in _COMMITTING_OPS:
                    # Checked again at the answer -- except a commit's: once the store
                    # committed, refusing would report a committed transaction as
                    # rolled back (it was checked just above, before it ran).
                    self._fenced[corr] = dict(fence)
            if writes:
                s.dirty.add(node)
            self._execs[corr] = (task, slot)
            self._out.append(Exec(corr, s.bid, call.op, call.fields, iso, writes))
            return None
        msg = {"t": "data.req", "op": call.op, "b": s.bid, **call.fields}
        if fence:
            msg["pe"] = [[name, epoch] for name, epoch in fence.items()]
        if node not in s.remote:
            msg["new"] = True
            msg["iso"] = s.iso
        if writes:
            msg["w"] = writes
            s.dirty.add(node)
        if node not in self.view.up:
            return None, errors.Unavailable(f"node {node} is not up")  # nothing sent
        s.remote.add(node)  # from here on it may hold locks: end it with the session
        self.calls.send(node, msg, task, slot)
        return None

    def _call_again(self, task: Task, slot: int, call: Call) -> None:
        """A call that waited out a lapse of the lease (lapse_waits.py): carried out now."""
        if task.done:
            return
        now = self._call(task, slot, call)
        if now is not None:
            self.resolve(task, slot, now[0], now[1])

    def _gather(self, task: Task, calls: list[Call]) -> Immediate | None:
        s = task.session
        if s is not None and self.name in s.pending and all(c.node != self.name for c in calls):
            task.then = Gather(calls)  # as for one call: the writes here first
            return self._call(task, FIRST, Call(self.name, WRITE_NOW, {}))
        return super()._gather(task, calls)

    # ================================================================ events
    def _on_branch_done(self, ev: BranchDone) -> None:
        waiting = self._execs.pop(ev.corr, None)
        if waiting is None:
            self.registry.done(ev.corr, ev.reply)
            return
        reply = ev.reply
        fence = self._fenced.pop(ev.corr, None) if self._fenced else None
        if fence and isinstance(reply, dict) and "error" not in reply:
            # Acknowledged only while acting (a lease lapses by time alone, ha.md §8):
            # a lapse alone is waited out (lapse_waits.py).
            refused = self.not_active(fence)
            if refused is not None:
                task, slot = waiting
                if not self.lapses.wait(
                    fence,
                    self.config.lapse_wait,
                    lambda: self.resolve_reply(task, slot, reply),
                    lambda exc: self.resolve(task, slot, None, exc),
                ):
                    self.resolve(task, slot, None, refused)
                return
        if not isinstance(reply, dict):
            self.resolve(*waiting, None, errors.ProtocolError(f"bad store reply {reply!r:.60}"))
        else:
            self.resolve_reply(*waiting, reply)

    def _on_received(self, ev: Received) -> None:
        msg = ev.payload
        kind = msg.get("t") if isinstance(msg, dict) else None
        if kind == "data.rep":
            if not self.ends.answered(ev.sender, msg):
                self.calls.answered(ev.sender, msg)
        elif kind == "data.req":
            self.registry.serve(ev.sender, msg)
        elif kind == BUSY:
            self.calls.busy(ev.sender, msg)
        elif kind == PROBE:
            self.registry.probed(ev.sender, msg)
        elif kind == PROBED:
            self.calls.probed(ev.sender, msg)
        elif kind == "data.waits":
            self.deadlocks.received(ev.sender, msg)
        else:
            self.log("warning", f"dropped data message {kind!r:.40} from {ev.sender}")

    def _on_timer(self, ev: TimerFired) -> None:
        name = ev.name
        if name == SWEEP_TIMER:
            self.registry.sweep(ev.now)
            self.registry.keep_alive()
            self.ends.retry(ev.now)
            self.calls.probe(ev.now)
            self._sweep_sessions(ev.now)
            self._out.append(SetTimer(SWEEP_TIMER, self.config.sweep_every))
        elif name == WAITS_TIMER:
            self.deadlocks.tick()
        elif name == LAPSE_TIMER:
            self.lapses.timer_fired()
        elif name.startswith(COMMIT_TIMER) and name[len(COMMIT_TIMER) :].isdigit():
            task = self._deciding.get(int(name[len(COMMIT_TIMER) :]))
            if task is not None:
                self.resolve(task, -1, UNDECIDED, None)
        elif not self.calls.timed_out(name):
            self.log("warning", f"data plane: unknown timer {name!r:.60}")

    def _on_decision(self, ev: DecisionDone) -> None:
        task = self._deciding.pop(ev.corr, None)
        if task is None:
            return
        self._out.append(CancelTimer(f"{COMMIT_TIMER}{ev.corr}"))
        self.resolve(task, -1, ev.reply, None)

    def _on_started(self, ev: Started) -> None:
        self._out.append(SetTimer(SWEEP_TIMER, self.config.sweep_every))
        self.deadlocks.start()

    def _on_local_waits(self, ev: LocalWaits) -> None:
        self.deadlocks.local_waits(ev.edges)

    def _on_cluster(self, ev: ClusterChanged) -> None:
        before = self.view.up
        self.view = ClusterView(
            self.name,
            ev.members,
            ev.up,
            ev.quorum,
            ev.locations,
            ev.partitions,
            route_partitions=self.config.placement is not None,
        )
        for peer in sorted(before - self.view.up):
            self._peer_down(peer)
        for peer in sorted(self.view.up - before):
            self.ends.node_up(peer)

    def sessions_on(self, peer: str) -> list[int]:
        """The sessions still open (committing, undecided) that have a branch on ``peer``."""
        sessions = list(self.sessions.values())
        sessions += [t.session for t in self._deciding.values() if t.session is not None]
        return sorted({s.sid for s in sessions if peer in s.remote})

    def _peer_down(self, peer: str) -> None:
        """A peer left Up: what depends on it ends now, not at a timeout (B8).

        Its coordinator's open branches here are rolled back (never prepared
        ones: those are the commit participant's); if it was only slow, its next
        op on such a branch gets BranchRolledBack (retryable).  Every active
        session with a branch there is rolled back too: it cannot commit any
        more; the client hears ``TransactionLost`` (an ``Unavailable`` that
        ``@transactional`` replays) at its next op.  The data requests it
        has not answered fail.
        """
        for s in list(self.sessions.values()):
            if s.state == ACTIVE and peer in s.remote:
                self.stats["sessions_broken"] += 1
                why = f"transaction rolled back: node {peer} of the transaction is down"
                self.doom(s, errors.TransactionLost, why)
        self.calls.node_down(peer)
        self.registry.coordinator_down(peer)
        self.deadlocks.node_down(peer)


_COMMITTING_OPS = COMMITTING_OPS
"""Store ops whose success is a commit: fenced before they run, never after."""

_DOOMING = (errors.Retryable, errors.Unavailable, errors.TransactionClosed)
"""Errors of a session op that end its session (other errors leave it usable)."""


def _g_after_cut(dp: DataPlane, s: Session, op: str, p: dict[str, Any]) -> OpCoroutine:
    """A snapshot session's first op: its views on every node first (snapshot_cut.py)."""
    yield from g_cut(dp, s)
    if p.get("w"):
        return (yield from _g_with_writes(dp, s, op, p))
    return (yield from OPS[op](dp, s, p))


def _g_with_writes(dp: DataPlane, s: Session, op: str, p: dict[str, Any]) -> OpCoroutine:
    """A session op carrying the client's deferred writes (``w``): taken first."""
    take_writes(dp, s, p["w"])
    return (yield from OPS[op](dp, s, p))


__all__ = [
    "COMMIT_TIMER",
    "RPC_TIMER",
    "SWEEP_TIMER",
    "WAITS_TIMER",
    "DataPlane",
    "DataPlaneConfig",
]
