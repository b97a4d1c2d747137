"""The bank through the real data-path machine, under faults: one seed = one checked run.

:func:`run_seed` draws everything from the seed:

1. 3 nodes (5 in some seeds), each a :class:`~nonstop.sim.scenarios.dataplane_node.
   SimDataNode` -- the cluster layer, two-phase commit with the decision in the
   Raft log, the real :class:`~nonstop.dataplane.machine.DataPlane` and the
   simulated store -- with a few bank accounts each; network delay, loss,
   duplication and reordering rates; the disk's fsync latency;
2. clients (:class:`BankClient`) that run transfers as interactive transactions
   exactly as the real client does (data-path.md §3, §8): ``tx.get`` of both
   accounts with a write lock (the first op carries ``begin``), ``tx.create`` of
   a ``Transfer`` record, ``tx.commit`` shipping the write set with a request id
   ``req = [client, seq]``; after a lost reply or ``Unavailable`` they ask
   ``request.result`` instead of committing twice; a retryable abort is replayed
   as a new attempt (a new request id).  Some transactions are read-only audits
   (``tx.query`` of every account under read locks);
3. the nemesis (:mod:`nonstop.sim.nemesis`): crashes with restarts (a crash
   loses the disk's unsynced writes, except a torn prefix), pauses, partitions
   both ways and one way, loss bursts, disk stalls -- until ``heal_at``;
4. after the heal the cluster must settle (every node up with quorum, nothing
   in doubt) and a final audit -- every account and every transfer record, in
   one transaction -- must commit.

Every transaction the clients attempted is recorded in two histories: the
list-append one (each account's ``log`` lists the transfers that touched it, in
commit order: a transfer reads both logs and appends its id to each) checked by
:func:`nonstop.sim.history.check_list_append` for serializability (with real-time
and per-client order: strict serializability), and the bank one (balances) by
:func:`~nonstop.sim.history.check_bank` (every complete read sums to the total).
Then, on the final audit: every acknowledged transfer is present exactly once,
no transfer whose commit failed is, each account's balance and log match the
transfer records (atomicity), the total is conserved; and every node's store
rebuilt from its disk equals its memory (durability).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from nonstop.cluster.failure import DetectorConfig, location_code
from nonstop.cluster.node import ClusterConfig
from nonstop.cluster.raft import RaftConfig
from nonstop.dataplane.machine import DataPlaneConfig
from nonstop.dtx.protocol import DtxConfig
from nonstop.model import codec
from nonstop.model.ref import Ref
from nonstop.model.wire import write_out
from nonstop.net import plain
from nonstop.runtime.interface import Action, Event, NodeId, Reply
from nonstop.sim import nemesis
from nonstop.sim.core import Simulation, decode, encode
from nonstop.sim.history import Recorder, Txn, check_bank, check_list_append
from nonstop.sim.scenario_base import (
    CommonConfig,
    install_faults,
    new_world,
    run_stats,
    runaway_fails,
)
from nonstop.sim.scenarios.dataplane_crashes import STEPS, CrashAtStep
from nonstop.sim.scenarios.dataplane_node import CLOSE, SimDataNode
from nonstop.sim.scenarios.dataplane_orphans import BranchOutlivesSession
from nonstop.sim.scenarios.dataplane_partitions import PartitionRouting
from nonstop.sim.scenarios.dataplane_replication import (
    SIM_REPLICATION,
    replicas_durable_observer,
    replicated_class,
    replicated_key,
)
from nonstop.sim.scenarios.dataplane_store import (
    ACCOUNT,
    K_OBJ,
    K_RESULT,
    TRANSFER,
    SimDataStore,
    StoreConfig,
)
from nonstop.tx.runner import BACKOFF, DEADLOCK_BACKOFF

INITIAL = 100
SAME_ID_ATTEMPTS = 8
"""Attempts of a transfer whose outcome was once unknown (homed requests, requests.md):
the same request id is run again until settled, across the failover that follows."""
TYPE_VERSION = 1

DEFINITE_ABORTS = frozenset(
    {
        "Aborted",
        "Conflict",
        "LockTimeout",
        "Deadlock",
        "BranchRolledBack",
        "NotActive",
        "TransactionLost",
    }
)
"""Commit errors after which the transaction is known rolled back (data-path.md §5)."""
RETRYABLE = frozenset(
    {
        "Conflict",
        "LockTimeout",
        "Deadlock",
        "BranchRolledBack",
        "Unavailable",
        "NotActive",
        "TransactionLost",
    }
)


@dataclass(slots=True)
class ScenarioConfig(CommonConfig):
    """Knobs of a data-plane run: the shared ones (3 nodes in most seeds), and its own."""

    nodes: tuple[int, ...] = (3, 3, 3, 5)
    fault_start: float = 0.8
    heal_at: float = 3.0
    fault_rate: float = 1.5
    max_events: int = 1_000_000
    accounts_per_node: int = 3
    clients: tuple[int, ...] = (3, 4, 5)
    client_start: float = 0.6
    """Raft elects a leader and the detectors see everyone Up first (about 0.3-0.5 s)."""
    settle_within: float = 8.0
    final_within: float = 5.0
    """After settling, the final audit must commit within this (retried on errors)."""
    op_timeout: float = 1.5
    """A client gives up waiting for a reply after this (then: ``request.result``)."""
    audit_share: float = 0.1
    snapshot_audits: float = 0.5
    """Share of audits run as ``snapshot`` transactions (no locks): their sums must be the
    total too (no read skew in snapshot mode, ``bank-wrong-total``; snapshot_cut.py)."""
    local_share: float = 0.3
    """Transfers between two accounts of the node the client talks to (local commits)."""
    unordered: float = 0.0
    """Share of transfers that lock their two accounts in random order rather than
    sorted: they make deadlocks, across nodes too (docs/design/deadlocks.md)."""
    read_back: float = 0.5
    """Share of acknowledged transfers the client reads back at once, without locks,
    through a random node: each account must show the transfer (no stale read after
    an acknowledged commit; docs/guarantees.md)."""
    replays: int = 2
    """Replays of a transfer after a retryable, definite abort (``@transactional``: 100)."""
    transactional_replays: bool = False
    """Replays back off as ``@transactional`` does (``tx/runner.py``) and carry the first
    attempt's age on ``begin``, so a replay keeps its rank in wound-wait (issue 14:
    starvation; docs/design/deadlocks.md section 2b)."""
    lossless: bool = False
    """No lost message from the start (the no-fault runs of issue 14: commit gaps)."""
    crash_steps: bool = True
    """Also crash one node at a delicate step of a commit (:mod:`.dataplane_crashes`)."""
    fence: bool = True
    """Homed clients settle every other unknown outcome (even request ids) at the home
    (``request.result`` with ``fence``, requests.md §3): "not committed" is then final,
    and the transfer runs again under a new request id."""
    dtx: DtxConfig = field(default_factory=DtxConfig)
    dataplane: DataPlaneConfig | None = None
    """The data plane's configuration (None: :func:`sim_dataplane_config`)."""
    store: StoreConfig = field(default_factory=StoreConfig)
    node_class: type[SimDataNode] = SimDataNode
    """Tests plug broken variants in here (the mutation check)."""
    digest: bool = False
    """Keep the full trace digest (determinism tests); campaigns leave it off for speed."""
    partitions: bool = False
    """Route by partition (``ha.data = "partitions"``): every node runs the HA cluster
    node, two partitions per node with one copy each (replicas = 0), accounts and
    transfers placed by the hash of their unique key (:mod:`.dataplane_partitions`)."""
    replicas: int = 0
    """With ``partitions``: sync replicas per partition.  Above 0 every node also runs the
    replication machine (:mod:`.dataplane_replication`): a partition's writes reach its
    replicas before they are acknowledged and a failover promotes one."""
    replication_mutant: str | None = None
    """One of ``nonstop.replication.machine.MUTANTS`` (the mutation check)."""
    prepare_delay: float = 0.0
    """With replicas: a participant's prepare reaches the replication host up to this many
    seconds after it began (uniform), as a real participant's large prepare does after
    encoding on a worker thread -- long enough for a lease to lapse in between
    (replication.md §4a, "A lapse of the lease is waited out").  0: at once."""
    late_renewals: float = 0.0
    """With replicas: this share of every node's lease renewals is dropped, as a real
    node's renewal comes late when its loop is held up: its lease lapses while the table
    stays (the lapses the data plane's ops and votes wait out, ``lapse_waits.py``)."""


def partitioned_config(**overrides: Any) -> ScenarioConfig:
    """The partitioned variant (``partitions=True``): clients start once the partition table
    is defined, enabled and acted for on every node (about 1 s: entries through the log,
    then the leases), and the faults and the heal move by as much."""
    settings: dict[str, Any] = {
        "partitions": True,
        "client_start": 1.2,
        "fault_start": 1.4,
        "heal_at": 3.6,
        **overrides,
    }
    return ScenarioConfig(**settings)


def sim_dataplane_config() -> DataPlaneConfig:
    """The data plane's timeouts scaled to the simulator (its defaults are for real networks).

    As in production, ``rpc_timeout`` exceeds the store's lock wait (a peer
    waiting for a lock is not down) and ``commit_timeout`` the dtx machine's
    vote and decision timeouts (an undecided commit is the exception).
    """
    return DataPlaneConfig(branch_idle=2.0, rpc_timeout=0.8, commit_timeout=1.2, sweep_every=0.1)


@dataclass(slots=True)
class Violation:
    time: float
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"t={self.time:.3f} {self.invariant}: {self.detail}"


@dataclass(slots=True)
class Violations:
    """The run's violations (the first 20), each at the simulation's time."""

    found: list[Violation] = field(default_factory=list)

    def fail(self, sim: Simulation, invariant: str, detail: str) -> None:
        if len(self.found) < 20:
            self.found.append(Violation(sim.now, invariant, detail))


@dataclass(slots=True)
class DataPlaneResult:
    seed: int
    ok: bool
    violations: list[Violation]
    faults: list[nemesis.Fault]
    nodes: list[NodeId]
    stats: dict[str, Any]
    history: list[Txn] = field(default_factory=list)
    """The list-append history (what the serializability check read)."""

    def summary(self) -> str:
        s = self.stats
        return (
            f"seed {self.seed}: {'ok' if self.ok else 'FAIL'} nodes={len(self.nodes)} "
            f"clients={s['clients']} faults={len(self.faults)} step={s['step']} "
            f"transfers={s['transfers']} "
            f"acked={s['acked']} failed={s['failed']} unknown={s['unknown']} "
            f"audits={s['audits']} snapshots={s['counts'].get('snapshot_audits', 0)} "
            f"events={s['events']} virtual={s['virtual_time']:.2f}s "
            f"cpu={s['cpu_time']:.3f}s"
        )


# ------------------------------------------------------------------ client plumbing
Call = tuple[str, Any, Any]
"""What a client coroutine yields: ``("call", node, payload)`` or ``("sleep", seconds, None)``."""
Coroutine = Generator[Call, Any, Any]


class Wire:
    """Client requests over the simulator; each reply (or a timeout: None) resumes a callback."""

    def __init__(self, sim: Simulation, latency: float, timeout: float) -> None:
        self.sim = sim
        self.latency = latency
        self.timeout = timeout
        self.pending: dict[int, Callable[[Any], None]] = {}
        self.commits: dict[int, NodeId] = {}
        """Request id of a ``tx.commit`` that writes, in flight -> the node it went to."""
        sim.observers.append(self._observe)

    def call(self, node: NodeId, payload: dict[str, Any], then: Callable[[Any], None]) -> None:
        rid = self.sim.request(node, payload, delay=self.latency)
        self.pending[rid] = then
        if payload.get("op") == "tx.commit" and payload.get("req") is not None:
            self.commits[rid] = node  # a commit that writes (read-only ones carry no id)
        self.sim.at(self.sim.now + self.timeout, lambda: self._expire(rid))

    def tell(self, node: NodeId, payload: dict[str, Any]) -> None:
        """Fire and forget (closing a connection)."""
        self.sim.request(node, payload, delay=self.latency)

    def _observe(self, sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Reply) and action.request_id in self.pending:
                self.commits.pop(action.request_id, None)
                then = self.pending.pop(action.request_id)
                payload = decode(encode(action.payload))
                sim.at(sim.now + self.latency, functools.partial(then, payload))

    def _expire(self, rid: int) -> None:
        then = self.pending.pop(rid, None)
        self.commits.pop(rid, None)
        if then is not None:
            then(None)


class Coroutines:
    """Runs client coroutines: a yielded call resumes with its reply, a sleep with None."""

    def __init__(self, sim: Simulation, wire: Wire) -> None:
        self.sim = sim
        self.wire = wire
        self.running = 0

    def start(self, at: float, coroutine: Coroutine) -> None:
        self.running += 1
        self.sim.at(at, lambda: self._resume(coroutine, None))

    def _resume(self, coroutine: Coroutine, value: Any) -> None:
        try:
            kind, what, payload = coroutine.send(value)
        except StopIteration:
            self.running -= 1
            return
        if kind == "call":
            self.wire.call(what, payload, lambda reply: self._resume(coroutine, reply))
        else:
            self.sim.at(self.sim.now + float(what), lambda: self._resume(coroutine, None))


# ------------------------------------------------------------------ the bank
@dataclass(slots=True)
class Attempt:
    """One transaction attempt of a client: one entry in each history."""

    tid: str
    la: int
    bank: int
    outcome: str = "info"


@dataclass(slots=True)
class Ledger:
    """What the clients did and were told (the checks' side of the story)."""

    la: Recorder
    bank: Recorder
    acked: set[str] = field(default_factory=set)
    """Transfers whose commit the client was told succeeded."""
    failed: set[str] = field(default_factory=set)
    """Transfers known not committed (a definite abort, ``aborted`` / ``unknown`` result)."""
    unknown: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    stale: list[str] = field(default_factory=list)
    """Read-backs that did not see the client's own acknowledged transfer."""
    commit_times: list[float] = field(default_factory=list)
    """Virtual time of every acknowledged transfer (commit gaps, issue 14)."""
    attempts: list[int] = field(default_factory=list)
    """Attempts of every transfer that ended (acknowledged, or given up): starvation."""
    waits: list[float] = field(default_factory=list)
    """Seconds from the first attempt of every transfer that ended to its end."""
    same_id: set[str] = field(default_factory=set)
    """Transfers run again under the same request id (homed requests, requests.md)."""
    again: set[str] = field(default_factory=set)
    """Transfers whose retry was answered with the first attempt's outcome (``again``)."""
    fenced: set[str] = field(default_factory=set)
    """Requests settled at their home as not committed (``fence``): no attempt of theirs
    may be in the store."""


def _call(node: NodeId, payload: dict[str, Any]) -> Call:
    return ("call", node, payload)


def _sleep(seconds: float) -> Call:
    return ("sleep", seconds, None)


def _get_account(
    conn: int, number: int, lock: str, session: Any, age: float | None = None
) -> dict[str, Any]:
    """``tx.get`` of account ``number``: in ``session``, or beginning one if None (a
    replay's ``age``: how long ago its first attempt began)."""
    op: dict[str, Any] = {
        "conn": conn,
        "op": "tx.get",
        "type": ACCOUNT,
        "tv": TYPE_VERSION,
        "key": codec.pack({"number": number}),
        "lock": lock,
    }
    if session is None:
        op["begin"] = "serializable"
        if age is not None:
            op["age"] = age
    else:
        op["s"] = session
    return op


def _error(reply: Any) -> str | None:
    """The error class a reply names; ``"NoReply"`` for a timeout; None for success."""
    if reply is None:
        return "NoReply"
    if not isinstance(reply, dict):
        return "Error"
    error = reply.get("error")
    return None if error is None else str(error)


def _objects(reply: dict[str, Any]) -> list[tuple[bytes, str, int, dict[str, Any]]]:
    out = []
    for ref, type_name, version, state in reply.get("os") or []:
        out.append((bytes(ref), type_name, int(version), codec.unpack(state)))
    return out


class BankClient:
    """One client process: transfers and audits against random nodes (module doc)."""

    def __init__(
        self,
        name: str,
        sim: Simulation,
        rng: random.Random,
        nodes: list[NodeId],
        numbers: list[int],
        home: dict[int, NodeId],
        ledger: Ledger,
        cfg: ScenarioConfig,
        stop_at: float,
    ) -> None:
        self.name = name
        self.sim = sim
        self.rng = rng
        self.nodes = nodes
        self.numbers = numbers
        self.home = home
        self.ledger = ledger
        self.cfg = cfg
        self.stop_at = stop_at
        self.wire: Wire | None = None
        self.seq = 0
        self.conns = 0
        self.epoch = 0
        """Bumped after an unknown outcome: the history's process id changes (its old
        transaction may still be in flight)."""
        self.index = int(name[1:])
        self.homed = cfg.replicas > 0
        """Homed requests (requests.md): each commit names its home, and after an
        unknown outcome the client asks another node and runs the same request id
        again there, as a client does when its node died."""
        self.doubtful: set[str] = set()
        self.tries: dict[str, int] = {}
        """Attempts per request id."""
        """Transfers with an attempt of unknown outcome: never reported rolled back."""

    @property
    def process(self) -> str:
        return f"{self.name}.{self.epoch}"

    def _conn(self) -> int:
        self.conns += 1
        return self.index * 1_000_000 + self.conns

    def _close(self, node: NodeId, conn: int) -> None:
        assert self.wire is not None
        self.wire.tell(node, {"conn": conn, "op": CLOSE})

    def run(self) -> Coroutine:
        while self.sim.now < self.stop_at:
            if self.rng.random() < self.cfg.audit_share:
                if self.rng.random() < self.cfg.snapshot_audits:
                    yield from self.snapshot_audit()
                else:
                    yield from self.audit()
            else:
                yield from self.transfer()
            yield _sleep(self.rng.uniform(0.002, 0.03))

    # ------------------------------------------------------------ transfers
    def transfer(self) -> Coroutine:
        """A transfer between two random accounts, through a random node; or, like an
        application that knows where its objects live, between two accounts of one
        node through that node (a local commit, no two-phase commit)."""
        src, dst = self.rng.sample(self.numbers, 2)
        node = self.rng.choice(self.nodes)
        if self.rng.random() < self.cfg.local_share:
            node = self.rng.choice(self.nodes)
            mine = [n for n in self.numbers if self.home[n] == node]
            if len(mine) >= 2:
                src, dst = self.rng.sample(mine, 2)
        amount = self.rng.randint(1, 30)
        first_at = self.sim.now
        age: float | None = None
        same: int | None = None
        attempt, attempts = 0, self.cfg.replays + 1
        while True:
            retry = yield from self._transfer_once(node, src, dst, amount, age, same)
            if retry is None:
                break
            if retry == "NotCommitted":
                same = None  # settled as not committed: the next attempt is a new request
            if self.homed and f"{self.name}-{self.seq if same is None else same}" in self.doubtful:
                # The same request again, on another node (its node may be dead): the
                # home's record makes it run at most once (requests.md).  Until it is
                # settled, as a client would, through the failover (a few more tries).
                same = self.seq if same is None else same
                node = self._other(node)
                attempts = max(attempts, SAME_ID_ATTEMPTS)
                self.ledger.counts["same_id_retries"] += 1
                self.ledger.same_id.add(f"{self.name}-{same}")
            # Also after the last attempt, as before: the seeds' histories stay the same.
            yield _sleep(self._backoff(attempt, retry))
            if self.cfg.transactional_replays:
                age = self.sim.now - first_at
            if attempt + 1 >= attempts:
                break
            attempt += 1
        self.ledger.attempts.append(attempt + 1)
        self.ledger.waits.append(self.sim.now - first_at)

    def _backoff(self, attempt: int, error: str) -> float:
        if not self.cfg.transactional_replays:
            return self.rng.uniform(0.01, 0.05) * (attempt + 1)
        # tx/runner.py's back-off, on the simulation's seeded generator.
        base = DEADLOCK_BACKOFF if error == "Deadlock" else BACKOFF
        return self.rng.uniform(0, min(0.05, base * (2 ** min(attempt, 10))))

    def _other(self, node: NodeId) -> NodeId:
        others = [n for n in self.nodes if n != node]
        return self.rng.choice(others) if others else node

    def _transfer_once(
        self,
        node: NodeId,
        src: int,
        dst: int,
        amount: int,
        age: float | None = None,
        same: int | None = None,
    ) -> Coroutine:
        """One attempt (``age``: of the first attempt, a replay's rank; ``same``: again under
        that request id): the error if worth replaying (a retryable, definite abort; homed:
        also an unknown outcome, ``"Unknown"``), else None."""
        ledger = self.ledger
        conn = self._conn()
        if same is None:
            self.seq += 1
        seq = self.seq if same is None else same
        tid = f"{self.name}-{seq}"
        # The value this attempt appends to the logs (unique per attempt, as the history
        # checker needs); ``tid`` names the request, whichever attempt commits it.
        tries = self.tries[tid] = self.tries.get(tid, 0) + 1
        value = tid if tries == 1 else f"{tid}/{tries}"
        a = Attempt(tid, ledger.la.invoke(self.process), ledger.bank.invoke(self.process))
        ledger.counts["transfers"] += 1
        first, second = sorted((src, dst))
        if self.cfg.unordered and self.rng.random() < self.cfg.unordered:
            first, second = src, dst  # locks in any order: cycles across nodes happen
        got: dict[int, tuple[bytes, int, dict[str, Any]]] = {}
        session: Any = None
        for number in (first, second):
            reply = yield _call(node, _get_account(conn, number, "write", session, age))
            if isinstance(reply, dict) and reply.get("s") is not None:
                session = reply["s"]
            error = _error(reply)
            if error is None and reply.get("o") is None:
                error = "NotFound"
            if error is not None:
                self._close(node, conn)
                self._fail(a, [])
                ledger.counts[f"get_{error}"] += 1
                return error if error in RETRYABLE else None
            ref, _, version, state = _objects({"os": [reply["o"]]})[0]
            got[number] = (ref, version, state)
        reads_la = [("r", n, list(got[n][2]["log"])) for n in (src, dst)]
        reads_bank = [("r", n, got[n][2]["balance"]) for n in (src, dst)]
        balance_src, balance_dst = got[src][2]["balance"], got[dst][2]["balance"]
        if balance_src < amount:
            yield _call(node, {"conn": conn, "op": "tx.rollback", "s": session})
            self._fail(a, reads_la, reads_bank)
            ledger.counts["insufficient"] += 1
            return None
        st = codec.pack({"tid": value, "req": tid, "src": src, "dst": dst, "amount": amount})
        reply = yield _call(
            node,
            {"conn": conn, "op": "tx.create", "s": session, "type": TRANSFER, "tv": 1, "st": st},
        )
        error = _error(reply)
        if error is not None:
            self._close(node, conn)
            self._fail(a, reads_la, reads_bank)
            ledger.counts[f"create_{error}"] += 1
            return error if error in RETRYABLE else None
        writes = []
        new = {src: balance_src - amount, dst: balance_dst + amount}
        for n in (src, dst):
            ref, version, state = got[n]
            writes.append(
                write_out(ref, ACCOUNT, version, {"balance": new[n], "log": [*state["log"], value]})
            )
        ops_la = [*reads_la, ("append", src, value), ("append", dst, value)]
        ops_bank = [*reads_bank, ("w", src, new[src]), ("w", dst, new[dst])]
        req = [self.name, seq]
        commit = {"conn": conn, "op": "tx.commit", "s": session, "w": writes, "req": req}
        home = min(got[src][0], got[dst][0]) if self.homed else None
        if home is not None:
            commit["home"] = home
        reply = yield _call(node, commit)
        error = _error(reply)
        if error is None and reply.get("again"):
            # The first attempt committed; this one ran nothing (exactly once).
            self._done_before(a, ops_la, ops_bank)
            return None
        if error is None:
            self._ok(a, ops_la, ops_bank)
            if self.rng.random() < self.cfg.read_back:
                unapplied = set(reply.get("unapplied") or ())
                yield from self._read_back(value, (src, dst), unapplied)
            return None
        ledger.counts[f"commit_{error}"] += 1
        if error in DEFINITE_ABORTS:
            self._fail(a, ops_la, ops_bank)
            return error if error in RETRYABLE else None
        if error == "NoReply":
            self._close(node, conn)
        if home is not None:
            # Unknown outcome: ask another node, which asks the home partition's active
            # node; anything but "committed" -> run the same request id again.
            ledger.counts["asked_elsewhere"] += 1
            fence = self.cfg.fence and seq % 2 == 0
            state = yield from self._ask(self._other(node), req, home, fence)
            if state == "committed" and tid not in self.doubtful:
                self._ok(a, ops_la, ops_bank)
                return None
            if state == "committed":
                self._done_before(a, ops_la, ops_bank)  # which attempt committed: unknown
                return None
            if state == "fenced":
                # Settled at the home as not committed: no attempt of this request id
                # commits, ever (requests.md §3); the transfer runs again under a new id.
                ledger.counts["fenced"] += 1
                ledger.fenced.add(tid)
                self.doubtful.discard(tid)
                self._fail(a, ops_la, ops_bank)
                return "NotCommitted"
            self._unknown(a, ops_la, ops_bank)
            self.doubtful.add(tid)
            return "Unknown"
        # Unknown outcome (a lost reply, Unavailable): ask, never commit twice (H1).
        state = yield from self._ask(node, req)
        if state == "committed":
            self._ok(a, ops_la, ops_bank)
        elif state in ("aborted", "unknown"):
            self._fail(a, ops_la, ops_bank)
            return "aborted"
        else:
            self._unknown(a, ops_la, ops_bank)
        return None

    def _read_back(self, tid: str, numbers: tuple[int, ...], unapplied: set[str]) -> Coroutine:
        """Read the accounts of acknowledged transfer ``tid`` without locks: both show it.

        Through a random node, in a new transaction: once a commit is acknowledged,
        no read anywhere returns the state before it -- except on a participant the
        acknowledgement names as not having applied it yet (``unapplied``: it was
        down or cut off for ``apply_wait``).
        """
        ledger = self.ledger
        node = self.rng.choice(self.nodes)
        conn = self._conn()
        session: Any = None
        for number in numbers:
            reply = yield _call(node, _get_account(conn, number, "none", session))
            if isinstance(reply, dict) and reply.get("s") is not None:
                session = reply["s"]
            if _error(reply) is not None or reply.get("o") is None:
                ledger.counts["read_back_failed"] += 1
                break
            if self.home[number] in unapplied:
                ledger.counts["read_back_unapplied"] += 1
                continue
            log = _objects({"os": [reply["o"]]})[0][3]["log"]
            ledger.counts["read_backs"] += 1
            if tid not in log:
                ledger.stale.append(
                    f"{tid} acknowledged to {self.name}, then account {number} read "
                    f"through {node} (master {self.home[number]}) without it: log {log}"
                )
        self._close(node, conn)

    def _ask(
        self, node: NodeId, req: list[Any], home: bytes | None = None, fence: bool = False
    ) -> Coroutine:
        """``request.result`` on the coordinator until it knows (data-path.md §8); with a
        ``home``, on any node (it asks the home partition's active node, requests.md),
        settling the request there with ``fence``: ``"fenced"`` when the home's answer is
        a final abort (the fence just recorded, or one recorded before)."""
        for _ in range(6):
            conn = self._conn()
            ask: dict[str, Any] = {"conn": conn, "op": "request.result", "req": req}
            if home is not None:
                ask["home"] = home
                if fence:
                    ask["fence"] = True
            reply = yield _call(node, ask)
            state = reply.get("state") if isinstance(reply, dict) else None
            self.ledger.counts[f"asked_{state}"] += 1
            if state == "aborted" and home is not None and reply.get("final"):
                return "fenced"
            if state in ("committed", "aborted", "unknown"):
                return state
            yield _sleep(0.2)
        return None

    # ------------------------------------------------------------ audits
    def audit(self) -> Coroutine:
        """A read-only transaction over every account (a consistent snapshot, or nothing)."""
        ledger = self.ledger
        node = self.rng.choice(self.nodes)
        conn = self._conn()
        a = Attempt("", ledger.la.invoke(self.process), ledger.bank.invoke(self.process))
        reply = yield _call(
            node,
            {
                "conn": conn,
                "op": "tx.query",
                "begin": "serializable",
                "type": ACCOUNT,
                "tv": TYPE_VERSION,
                "lock": "read",
                "audit": self.rng.choice(["fail_if_down", "skip_down"]),
            },
        )
        if _error(reply) is not None:
            self._close(node, conn)
            self._fail(a, [])
            return
        objs = _objects(reply)
        reads_la = [("r", s["number"], list(s["log"])) for _, _, _, s in objs]
        reads_bank = [("r", s["number"], s["balance"]) for _, _, _, s in objs]
        reply = yield _call(node, {"conn": conn, "op": "tx.commit", "s": reply["s"], "req": None})
        if _error(reply) is None:
            ledger.counts["audits"] += 1
            self._ok(a, reads_la, reads_bank)
        else:
            self._close(node, conn)
            self._fail(a, reads_la, reads_bank)

    def snapshot_audit(self) -> Coroutine:
        """A ``snapshot`` transaction summing every account without locks: recorded in the
        bank history only (snapshot isolation allows write skew, which the list-append
        check of serializability would report), where its sum must be the total."""
        ledger = self.ledger
        node = self.rng.choice(self.nodes)
        conn = self._conn()
        h = ledger.bank.invoke(self.process)
        reply = yield _call(
            node,
            {
                "conn": conn,
                "op": "tx.query",
                "begin": "snapshot",
                "type": ACCOUNT,
                "tv": TYPE_VERSION,
                "lock": "none",
                "audit": self.rng.choice(["fail_if_down", "skip_down"]),
            },
        )
        if _error(reply) is not None:
            self._close(node, conn)
            ledger.bank.complete(h, "fail", [])
            return
        reads = [("r", s["number"], s["balance"]) for _, _, _, s in _objects(reply)]
        reply = yield _call(node, {"conn": conn, "op": "tx.commit", "s": reply["s"], "req": None})
        if _error(reply) is None:
            ledger.counts["snapshot_audits"] += 1
            ledger.bank.complete(h, "ok", reads)
        else:
            self._close(node, conn)
            ledger.bank.complete(h, "fail", reads)

    # ------------------------------------------------------------ recording
    def _ok(self, a: Attempt, ops_la: list[Any], ops_bank: list[Any] | None = None) -> None:
        self.ledger.la.complete(a.la, "ok", ops_la)
        self.ledger.bank.complete(a.bank, "ok", ops_bank if ops_bank is not None else [])
        if a.tid:
            self.ledger.acked.add(a.tid)
            self.ledger.commit_times.append(self.sim.now)

    def _fail(self, a: Attempt, ops_la: list[Any], ops_bank: list[Any] | None = None) -> None:
        self.ledger.la.complete(a.la, "fail", ops_la)
        self.ledger.bank.complete(a.bank, "fail", ops_bank if ops_bank is not None else [])
        if a.tid and a.tid not in self.doubtful:
            # (an earlier attempt of the same request id may still have committed)
            self.ledger.failed.add(a.tid)

    def _done_before(self, a: Attempt, ops_la: list[Any], ops_bank: list[Any]) -> None:
        """The request committed, in an earlier attempt of unknown outcome (or this one:
        the client cannot tell which): acknowledged, this attempt's effect unknown."""
        ledger = self.ledger
        ledger.la.complete(a.la, "info", ops_la)
        ledger.bank.complete(a.bank, "info", ops_bank)
        ledger.acked.add(a.tid)
        ledger.again.add(a.tid)
        ledger.commit_times.append(self.sim.now)
        ledger.counts["answered_again"] += 1
        self.epoch += 1

    def _unknown(self, a: Attempt, ops_la: list[Any], ops_bank: list[Any]) -> None:
        self.ledger.la.complete(a.la, "info", ops_la)
        self.ledger.bank.complete(a.bank, "info", ops_bank)
        self.ledger.unknown.add(a.tid)
        self.epoch += 1


@dataclass(slots=True)
class FinalAudit:
    """Every account and every transfer record, read in one committed transaction."""

    accounts: dict[int, dict[str, Any]] = field(default_factory=dict)
    transfers: list[dict[str, Any]] = field(default_factory=list)
    committed: bool = False
    attempts: int = 0
    last_error: Any = None


def final_audit(
    nodes: list[NodeId], rng: random.Random, result: FinalAudit, deadline: float, sim: Simulation
) -> Coroutine:
    conn = 9_000_000
    while sim.now < deadline:
        conn += 1
        result.attempts += 1
        node = rng.choice(nodes)
        query = {"type": ACCOUNT, "tv": TYPE_VERSION, "lock": "read", "audit": "fail_if_down"}
        reply = yield _call(
            node, {"conn": conn, "op": "tx.query", "begin": "serializable", **query}
        )
        if _error(reply) is None:
            session = reply["s"]
            accounts = _objects(reply)
            query = {**query, "type": TRANSFER}
            reply = yield _call(node, {"conn": conn, "op": "tx.query", "s": session, **query})
            if _error(reply) is None:
                transfers = _objects(reply)
                reply = yield _call(
                    node, {"conn": conn, "op": "tx.commit", "s": session, "req": None}
                )
                if _error(reply) is None:
                    result.accounts = {s["number"]: s for _, _, _, s in accounts}
                    result.transfers = [s for _, _, _, s in transfers]
                    result.committed = True
                    return
        result.last_error = reply
        yield ("call", node, {"conn": conn, "op": CLOSE})
        yield _sleep(0.1)


# ------------------------------------------------------------------ the run
def run_seed(
    seed: int, config: ScenarioConfig | None = None, *, trace: bool = False
) -> tuple[DataPlaneResult, Simulation]:
    """Run one seed (module doc)."""
    cfg = config or ScenarioConfig()
    cpu = time.process_time()
    world = new_world(
        seed, cfg, sync_max=(0.004, 0.02, 0.05), trace=trace, digest=trace or cfg.digest
    )
    rng, sim, names = world.rng, world.sim, world.names
    n = len(names)
    numbers = list(range(1, n * cfg.accounts_per_node + 1))
    home = {number: names[number % n] for number in numbers}
    total = INITIAL * len(numbers)
    dp_config = cfg.dataplane if cfg.dataplane is not None else sim_dataplane_config()
    routing: PartitionRouting | None = None
    if cfg.partitions:
        routing = PartitionRouting(names, cfg.replicas)
        home = {number: routing.node_of_account(number) for number in numbers}
        dp_config = dataclasses.replace(dp_config, placement=routing.placement)
    _add_nodes(sim, rng, names, home, cfg, dp_config, routing)
    if routing is not None:
        sim.observers.append(routing.ack_observer(lambda i, d: checker.fail(sim, i, d)))
        sim.observers.append(routing.table_observer(lambda i, d: checker.fail(sim, i, d)))
        if cfg.replicas > 0:
            sim.observers.append(replicas_durable_observer(lambda i, d: checker.fail(sim, i, d)))
    faults = install_faults(world, names, cfg)
    # The data path sends each RPC once (over TCP, a lost message is a broken
    # connection: Unavailable, and the client retries).  So after the heal the
    # network's steady loss stops too: liveness is judged on a healed network.
    sim.at(cfg.heal_at, lambda: setattr(sim.net, "drop", 0.0))
    if cfg.lossless:
        sim.net.drop = 0.0
    step = rng.choice(STEPS) if cfg.crash_steps else "none"
    injector = CrashAtStep(
        step,
        rng.choice(names),
        rng.uniform(cfg.client_start, cfg.heal_at * 0.8),
        rng.choice([0.05, 0.3, 1.0]),
    ).attach(sim)

    checker = Violations()

    def fail(invariant: str, detail: str) -> None:
        checker.fail(sim, invariant, detail)

    def orphans(sim: Simulation, name: NodeId, event: Event, actions: list[Action]) -> None:
        """A node told a peer went down holds none of the branches that peer coordinates."""
        machine = sim.machine(name)
        if not isinstance(machine, SimDataNode) or not machine.lost_peers:
            return
        lost, machine.lost_peers = machine.lost_peers, set()
        for peer in sorted(lost):
            kept = sorted(b for b in machine.dataplane.branches if b.startswith(peer + "."))
            if kept:
                fail("orphan-branch", f"{name} sees {peer} down but keeps its branches {kept}")

    sim.observers.append(orphans)
    # Half of branch_idle: a branch left to idle out is caught, a prompt end is not.
    BranchOutlivesSession(cfg.heal_at, dp_config.branch_idle / 2, fail).attach(sim)
    quorum_before: dict[NodeId, str] = {}

    def disabled_acks(sim: Simulation, name: NodeId, event: Event, actions: list[Action]) -> None:
        """No commit that writes is acknowledged by a node whose quorum is Disabled (D16).

        Disabled before the step (so the data plane had been told) and after it.
        A read-only commit commits nothing and may still end there.
        """
        machine = sim.machine(name)
        if not isinstance(machine, SimDataNode):
            return
        state = machine.node.cluster.quorum_state
        before = quorum_before.get(name)
        quorum_before[name] = state
        if state != "Disabled" or before != "Disabled":
            return
        for action in actions:
            if (
                isinstance(action, Reply)
                and wire.commits.get(action.request_id) == name
                and isinstance(action.payload, dict)
                and action.payload.get("ok")
            ):
                fail("ack-without-quorum", f"{name} acknowledged a commit while Disabled")

    sim.observers.append(disabled_acks)
    clock: Callable[[], float] = lambda: sim.now  # noqa: E731
    ledger = Ledger(Recorder(clock), Recorder(clock))
    wire = Wire(sim, 0.0003, cfg.op_timeout)
    runner = Coroutines(sim, wire)
    n_clients = rng.choice(cfg.clients)
    for i in range(1, n_clients + 1):
        client = BankClient(
            f"c{i}",
            sim,
            random.Random(rng.getrandbits(64)),
            names,
            numbers,
            home,
            ledger,
            cfg,
            cfg.heal_at,
        )
        client.wire = wire
        runner.start(cfg.client_start + rng.uniform(0, 0.05), client.run())

    audit = FinalAudit()
    settled_at: float | None = None
    with runaway_fails(checker, sim):
        sim.run_until(cfg.heal_at)
        deadline = cfg.heal_at + cfg.settle_within
        while sim.now < deadline and (runner.running or _busy(sim, names) is not None):
            sim.run_for(0.05)
        busy = _busy(sim, names)
        if busy is not None:
            fail("liveness", f"not settled {cfg.settle_within}s after the heal: {busy}")
        elif runner.running:
            fail(
                "liveness",
                f"{runner.running} clients still waiting {cfg.settle_within}s after the heal",
            )
        else:
            settled_at = sim.now
            end = sim.now + cfg.final_within
            runner.start(sim.now, final_audit(names, random.Random(seed), audit, end, sim))
            sim.run_until(end + cfg.op_timeout + 0.1, lambda: audit.committed)
            if not audit.committed:
                fail("liveness", f"final audit did not commit: {audit.last_error!r:.200}")
            # Its phase two and the data plane's cleanup, then nothing may be in flight.
            stop = sim.now + 3.0
            while sim.now < stop and _busy(sim, names) is not None:
                sim.run_for(0.05)
            # The store's own writes still in the disks' buffers land: a replicated store
            # installs a commit (or a promoted copy) in memory once it is durable in the
            # replication copy (rep/), and persists its own keys (st/) after.
            while sim.now < stop + 1.0 and _store_writes_in_flight(sim, names):
                sim.run_for(0.01)

    history = ledger.la.history()
    check_histories(ledger, history, numbers, total, fail)
    for stale in ledger.stale[:3]:
        fail("stale-read", stale)
    if audit.committed:
        check_final(ledger, audit, numbers, total, fail)
        check_durable(sim, names, fail)
        check_fences(sim, names, ledger, fail)

    s = ledger.counts
    stats = run_stats(
        world,
        clients=n_clients,
        step=step,
        crash_fired=injector.fired_at,
        transfers=s["transfers"],
        acked=len(ledger.acked),
        failed=len(ledger.failed),
        unknown=len(ledger.unknown),
        audits=s["audits"],
        counts=dict(sorted(s.items())),
        settled_after=None if settled_at is None else settled_at - cfg.heal_at,
        max_gap=commit_gap(ledger.commit_times, cfg.client_start + GAP_WARMUP, cfg.heal_at),
        max_attempts=max(ledger.attempts, default=0),
        max_wait=max(ledger.waits, default=0.0),
        # (nodes up at the end: a crashed node's count went with it)
        lapses_waited=sum(
            getattr(getattr(sim.machine(n), "host", None), "lapses_waited", 0)
            for n in names
            if sim.is_up(n)
        ),
        # ops and answers of the data plane that waited out a lapse (lapse_waits.py)
        dp_lapses_waited=sum(
            dp.stats["lapses_waited_out"]
            for n in names
            if sim.is_up(n) and (dp := getattr(sim.machine(n), "dataplane", None)) is not None
        ),
        # prepares that waited out a lapse before their vote (the store's vote wait)
        votes_waited=sum(
            st.stats.get("votes_waited_out", 0)
            for n in names
            if sim.is_up(n) and (st := getattr(sim.machine(n), "store", None)) is not None
        ),
        cpu_time=time.process_time() - cpu,
    )
    violations = checker.found
    result = DataPlaneResult(seed, not violations, violations, faults, names, stats, history)
    return result, sim


GAP_WARMUP = 0.1
"""Seconds after the clients start before commit gaps count (their first transactions)."""


def commit_gap(times: list[float], start: float, end: float) -> float:
    """The longest interval of ``[start, end]`` in which no transfer was acknowledged."""
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(marks))


def check_histories(
    ledger: Ledger,
    history: list[Txn],
    numbers: list[int],
    total: int,
    fail: Callable[[str, str], None],
) -> None:
    """Serializability (strict: real time and client order) and the bank invariant."""
    la = check_list_append(history, realtime=True, process=True)
    for kind, anomalies in sorted(la.anomalies.items()):
        fail(f"history-{kind}", str(anomalies[0])[:600])
    bank = check_bank(ledger.bank.history(), total=total, accounts=numbers)
    for kind, anomalies in sorted(bank.anomalies.items()):
        fail(f"bank-{kind}", str(anomalies[0])[:600])


def check_final(
    ledger: Ledger,
    audit: FinalAudit,
    numbers: list[int],
    total: int,
    fail: Callable[[str, str], None],
) -> None:
    """Exactly once, atomicity and conservation, on what the final audit read."""
    if sorted(audit.accounts) != numbers:
        fail("final-audit", f"read accounts {sorted(audit.accounts)}, not {numbers}")
        return
    tids = Counter(t.get("req") or t["tid"] for t in audit.transfers)
    for tid, count in sorted(tids.items()):
        if count > 1 and tid in ledger.same_id:
            # Exactly once per request id across failover (requests.md): a request run
            # again under its id, on another node, must find the first attempt's record.
            fail("exactly-once-request", f"request {tid} run again under its id: {count} commits")
        elif count > 1:
            fail("exactly-once", f"transfer {tid} recorded {count} times")
        if tid in ledger.fenced:
            fail("fenced-but-present", f"request {tid} was settled as not committed but is there")
        elif tid in ledger.failed:
            fail("aborted-but-present", f"transfer {tid} was reported rolled back but committed")
    for tid in sorted(ledger.again - set(tids)):
        fail("exactly-once-request", f"request {tid} answered with a first outcome never committed")
    for tid in sorted(ledger.acked - ledger.again - set(tids)):
        fail("acked-lost", f"transfer {tid} was acknowledged but is not in the store")
    expected = dict.fromkeys(numbers, INITIAL)
    logs: dict[int, list[str]] = {n: [] for n in numbers}
    for t in audit.transfers:
        expected[t["src"]] -= t["amount"]
        expected[t["dst"]] += t["amount"]
        logs[t["src"]].append(t["tid"])
        logs[t["dst"]].append(t["tid"])
    for number in numbers:
        account = audit.accounts[number]
        if account["balance"] != expected[number]:
            fail(
                "atomicity",
                f"account {number}: balance {account['balance']}, transfers say {expected[number]}",
            )
        log = account["log"]
        if sorted(log) != sorted(logs[number]) or len(set(log)) != len(log):
            fail("atomicity", f"account {number}: log {log} vs transfers {sorted(logs[number])}")
    got = sum(a["balance"] for a in audit.accounts.values())
    if got != total:
        fail("conservation", f"final total {got} != {total}")


def check_fences(
    sim: Simulation, names: list[NodeId], ledger: Ledger, fail: Callable[[str, str], None]
) -> None:
    """Every request settled as not committed (``fence``) keeps that record: some node's
    store or replicated copies answer it "not committed", none "committed" (a fence lost
    at a failover would let a late attempt of the request commit, requests.md §3)."""
    for tid in sorted(ledger.fenced):
        client, _, seq = tid.rpartition("-")
        key = (client, int(seq))
        kept = False
        for name in names:
            machine = sim.machine(name)
            if not isinstance(machine, SimDataNode):
                continue
            found = machine.store.lookup_result(key)
            if found is not None and found[0]:
                fail("fenced-but-committed", f"{name} holds request {tid} committed")
            kept = kept or (found is not None and not found[0])
        if not kept:
            fail("fence-lost", f"no node keeps request {tid}'s settled outcome")


def check_durable(sim: Simulation, names: list[NodeId], fail: Callable[[str, str], None]) -> None:
    """Every node's store rebuilt from its disk equals its memory (nothing left in doubt)."""
    for name in names:
        machine = sim.machine(name)
        if not isinstance(machine, SimDataNode):
            continue
        store = machine.store
        doubt = store.in_doubt_names()
        if doubt:
            fail("durability", f"{name}: {len(doubt)} branches still in doubt: {doubt}")
            continue
        durable = sim.nodes[name].disk.durable
        rebuilt = SimDataStore(name, store.location, store.timestamp, durable)
        if rebuilt.snapshot() != store.snapshot():
            differ = sorted(
                str(Ref(r))
                for r in set(rebuilt.objects) | set(store.objects)
                if rebuilt.snapshot().get(r) != store.snapshot().get(r)
            )
            fail("durability", f"{name}: disk and memory differ on {differ[:5]}")
        if rebuilt.results != store.results:
            fail("durability", f"{name}: request results differ between disk and memory")


# ------------------------------------------------------------------ cluster
def _add_nodes(
    sim: Simulation,
    rng: random.Random,
    names: list[NodeId],
    home: dict[int, NodeId],
    cfg: ScenarioConfig,
    dp_config: Any,
    routing: PartitionRouting | None = None,
) -> None:
    raft = RaftConfig(election_timeout=rng.choice([0.3, 0.5]), heartbeat_interval=0.05)
    detector = DetectorConfig(keepalive_interval=0.1, non_response_timeout=0.4)
    addresses = {x: f"sim://{x}" for x in names}
    for i, name in enumerate(names):
        timestamp = 1_700_000_000 + i
        node_cfg = ClusterConfig(
            name=name,
            address=addresses[name],
            store_timestamp=timestamp,
            members=tuple(names),
            static_peers={x: a for x, a in addresses.items() if x != name},
            detector=detector,
            raft=raft,
            snapshot_every=rng.choice([16, 64, 256]),
        )

        def factory(
            node_rng: random.Random, recovered: Any, node_cfg: ClusterConfig = node_cfg
        ) -> SimDataNode:
            extra: dict[str, Any] = {}
            node_class = cfg.node_class
            if routing is not None:
                extra["cluster_factory"] = routing.cluster_factory
            if routing is not None and cfg.replicas > 0:
                node_class = replicated_class(cfg.node_class)
                extra["replication"] = dataclasses.replace(
                    SIM_REPLICATION, mutant=cfg.replication_mutant
                )
                if cfg.prepare_delay > 0:
                    extra["prepare_delay"] = cfg.prepare_delay
                if cfg.late_renewals > 0:
                    extra["late_renewals"] = cfg.late_renewals
            return node_class(
                node_cfg,
                node_rng,
                recovered,
                dtx_config=cfg.dtx,
                dataplane_config=dp_config,
                store_config=cfg.store,
                **extra,
            )

        node = sim.add_node(name, factory, start=False)
        # The bank's accounts, as if loaded before the run (durable, version 1).
        location = location_code(name)
        for number, where in sorted(home.items()):
            if where == name:
                ref = Ref.make(location, timestamp, number).raw
                if routing is not None:
                    ref = routing.account_ref(number)
                state = {"number": number, "balance": INITIAL, "log": []}
                node.disk.durable[K_OBJ + ref] = codec.pack([ACCOUNT, 1, state])
        if routing is not None and cfg.replicas > 0:
            # Every copy of a partition holds its accounts from the start (the same history).
            for number in sorted(home):
                partition = routing.partition_of_account(number)
                if name in routing.holders[partition]:
                    state = {"number": number, "balance": INITIAL, "log": []}
                    key = routing.account_ref(number).hex()
                    node.disk.durable[replicated_key(partition, key)] = plain.pack(
                        [ACCOUNT, 1, state]
                    )
        sim.start(name)


def _store_writes_in_flight(sim: Simulation, names: list[NodeId]) -> bool:
    """Does a node's disk still buffer a write of its store (``st/``)?"""
    return any(
        key.startswith((K_OBJ, K_RESULT))
        for name in names
        for persist in sim.nodes[name].disk.pending
        for key, _ in persist.writes
    )


def _busy(sim: Simulation, names: list[NodeId]) -> str | None:
    """None once every node is up with quorum and nothing is in doubt or being decided."""
    for name in names:
        node = sim.nodes[name]
        if not node.up or node.paused:
            return f"{name} is down"
    for name in names:
        m = sim.machine(name)
        assert isinstance(m, SimDataNode)
        if m.node.cluster.quorum_state != "Active":
            return f"{name}: quorum {m.node.cluster.quorum_state}"
        dtx = m.node.dtx
        if dtx.coord or dtx.branches:
            return f"{name}: {dtx.status()}"
    return None


__all__ = ["DataPlaneResult", "ScenarioConfig", "Violation", "partitioned_config", "run_seed"]
