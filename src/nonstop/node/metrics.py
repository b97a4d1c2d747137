"""A node's Prometheus metrics: read from the machines at scrape time (G6).

Nearly everything is *pulled*: :class:`NodeCollector` is a ``prometheus_client``
custom collector whose :meth:`~NodeCollector.collect` reads, when Prometheus
scrapes, the state and the plain counters the node's parts already keep:

* the cluster machine (``ClusterNode``: Raft's term, indexes, role and leader,
  the quorum state, the failure detector's peer states, snapshots);
* the data service and its machine (sessions, branches, client connections, the
  machine's event counters, the distributed deadlock victims);
* the object store's group committer (groups, write sets, the group-size and
  write-and-fsync histograms) and lock table (waits, timeouts, deadlocks);
* the runtime's counters (cluster-store commits, messages).

Two things are only seen as they happen, so :class:`DataObserver` keeps plain
integers for them: the outcome and latency of each ``tx.commit`` and the error
kind of each failed session op (the data service calls it for each session op
and reply), and the failure detector's, quorum's and leader's transitions (runtime
notifications).  Nothing here takes a lock or allocates per object on the data
path; ``collect`` runs on the event loop thread (the HTTP handler,
:mod:`nonstop.node.metrics_http`), so it reads the machines between two events,
never during one.

Labels are bounded: error kinds are the names of :mod:`nonstop.errors` classes
(anything else is ``other``), states and roles are the machines' fixed sets,
node names are the cluster's members.  No label carries an object, a session
or a client.
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from nonstop import errors

PREFIX = "nonstop_"

PEER_STATES = (
    "Undiscovered",
    "Discovered",
    "InUpNotifier",
    "Up",
    "InDownNotifier",
    "Down",
    "DuplicateLocation",
    "DuplicateTimestamp",
    "UnsupportedProtocol",
)
"""The failure detector's remote node states (C3): one series each, also at 0."""
QUORUM_STATES = ("Active", "Partial", "Disabled")
ROLES = ("follower", "candidate", "leader")

OTHER = "other"
ROLLBACK = "Rollback"
"""The abort reason of a transaction its client rolled back."""
PENDING_BOUND = 100_000
"""Commits waiting for their reply remembered at most (their connection may be gone)."""


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


ERROR_KINDS = frozenset(c.__name__ for c in (errors.Error, *_subclasses(errors.Error)))
"""The error kinds counted by name (the ``error`` of a reply); any other is :data:`OTHER`."""


def error_kind(name: Any) -> str:
    """A reply's ``error`` name as a bounded label value."""
    return name if isinstance(name, str) and name in ERROR_KINDS else OTHER


class Buckets:
    """A histogram kept as plain counts (no lock: it is only changed on the loop thread)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


def histogram(
    name: str, doc: str, bounds: Sequence[float], counts: Sequence[int], total: float
) -> HistogramMetricFamily:
    """A Prometheus histogram from per-bucket counts (``len(bounds) + 1``, the last: +Inf)."""
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return HistogramMetricFamily(PREFIX + name, doc, buckets=buckets, sum_value=total)


class DataObserver:
    """What the data service tells the metrics as it happens (module doc).

    ``op`` and ``reply`` are called by :class:`~nonstop.dataplane.service.DataService`
    for every session op and every reply of its machine; the notifier methods by
    the runtime for ``node_state``, ``quorum`` and ``leader`` notifications.
    """

    def __init__(self, latency_bounds: Sequence[float]) -> None:
        self.commits = 0
        self.aborts: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.ops = 0
        self.latency = Buckets(latency_bounds)
        self._pending: dict[tuple[int, Any], tuple[str, float]] = {}
        self.transitions: collections.Counter[tuple[str, str]] = collections.Counter()
        self.quorum_changes = 0
        self.leader_changes = 0

    # ------------------------------------------------------------ data service
    def op(self, conn: int, corr: Any, op: Any) -> None:
        """A session op arrived; ``tx.commit`` and ``tx.rollback`` wait for their reply."""
        self.ops += 1
        if op == "tx.commit" or op == "tx.rollback":
            pending = self._pending
            if len(pending) >= PENDING_BOUND:
                del pending[next(iter(pending))]
            pending[(conn, corr)] = (op, time.perf_counter())

    def reply(self, conn: int, corr: Any, payload: Any) -> None:
        """The machine answered op ``corr`` of connection ``conn``."""
        failed = isinstance(payload, dict) and "error" in payload
        kind = error_kind(payload["error"]) if failed else ""
        if failed:
            self.errors[kind] += 1
        started = self._pending.pop((conn, corr), None)
        if started is None:
            return
        op, at = started
        if op == "tx.rollback":
            self.aborts[ROLLBACK] += 1
            return
        self.latency.observe(time.perf_counter() - at)
        if failed:
            self.aborts[kind] += 1
        else:
            self.commits += 1

    # ------------------------------------------------------------ notifications
    def on_node_state(self, action: Any) -> None:
        data = action.data
        old, new = str(data.get("old")), str(data.get("new"))
        if old in PEER_STATES and new in PEER_STATES:
            self.transitions[(old, new)] += 1

    def on_quorum(self, _action: Any) -> None:
        self.quorum_changes += 1

    def on_leader(self, _action: Any) -> None:
        self.leader_changes += 1


def cluster_node_of(machine: Any) -> Any:
    """The ``ClusterNode`` inside the node's machine (it may wrap it as ``.cluster``)."""
    for _ in range(4):
        if machine is None or hasattr(machine, "raft"):
            return machine
        machine = getattr(machine, "cluster", None)
    return None


class NodeCollector(Collector):
    """Every ``nonstop_*`` family of one node, read from ``runtime`` at scrape time."""

    def __init__(self, runtime: Any, observer: DataObserver) -> None:
        self.runtime = runtime
        self.observer = observer

    def collect(self) -> Iterable[Metric]:
        router = getattr(self.runtime, "router", None)
        service = getattr(router, "data", None)
        db = getattr(router, "db", None)
        yield from self._transactions(service)
        yield from self._data_service(service, db)
        yield from self._store(db)
        yield from self._cluster(cluster_node_of(getattr(self.runtime, "machine", None)))
        yield from self._runtime()

    # ------------------------------------------------------------ families
    def _transactions(self, service: Any) -> Iterator[Metric]:
        obs = self.observer
        yield CounterMetricFamily(
            PREFIX + "transactions_committed",
            "Transactions this node coordinated that committed (tx.commit answered ok).",
            value=obs.commits,
        )
        aborted = CounterMetricFamily(
            PREFIX + "transactions_aborted",
            "Transactions this node coordinated that ended without committing, by reason: "
            "the commit's error, Rollback (by the client), Idle (tx_idle passed).",
            labels=["reason"],
        )
        stats = getattr(service, "stats", None) or {}
        reasons = collections.Counter(obs.aborts)
        reasons["Idle"] += int(stats.get("idle_sessions", 0))
        for reason in ("Conflict", "Deadlock", "LockTimeout", "Unavailable", ROLLBACK, "Idle"):
            reasons.setdefault(reason, 0)
        for reason, count in sorted(reasons.items()):
            aborted.add_metric([reason], count)
        yield aborted
        sessions = getattr(getattr(service, "machine", None), "sessions", None) or {}
        yield GaugeMetricFamily(
            PREFIX + "transactions_active",
            "Transactions open now on this node as coordinator (client sessions).",
            value=len(sessions),
        )
        yield histogram(
            "commit_latency_seconds",
            "tx.commit latency at the coordinator, from the op's arrival to its reply.",
            obs.latency.bounds,
            obs.latency.counts,
            obs.latency.sum,
        )

    def _data_service(self, service: Any, db: Any) -> Iterator[Metric]:
        obs = self.observer
        machine = getattr(service, "machine", None)
        yield GaugeMetricFamily(
            PREFIX + "data_branches",
            "Transaction branches held on this node (its sessions' and remote coordinators').",
            value=len(getattr(machine, "branches", None) or {}),
        )
        yield GaugeMetricFamily(
            PREFIX + "data_client_connections",
            "Client connections that opened a data session on this node.",
            value=len(getattr(service, "_conns", None) or {}),
        )
        yield CounterMetricFamily(
            PREFIX + "data_session_ops", "Session ops received (tx.*).", value=obs.ops
        )
        failed = CounterMetricFamily(
            PREFIX + "data_request_errors",
            "Session ops answered with an error, by error kind (nonstop.errors class name).",
            labels=["kind"],
        )
        for kind, count in sorted(obs.errors.items()):
            failed.add_metric([kind], count)
        yield failed
        events = CounterMetricFamily(
            PREFIX + "data_events",
            "The data plane's own counters (two_phase, rpc, idle_rollbacks, deadlock_victims...).",
            labels=["event"],
        )
        for event, count in sorted((getattr(service, "stats", None) or {}).items()):
            events.add_metric([str(event)], count)
        yield events
        victims = CounterMetricFamily(
            PREFIX + "lock_deadlock_victims",
            "Transactions rolled back to break a deadlock: found in this node's lock table "
            "(local) or across nodes by the data plane (distributed).",
            labels=["scope"],
        )
        locks = self._locks_of(getattr(db, "engine", None))
        victims.add_metric(["local"], getattr(locks, "deadlocks", 0))
        victims.add_metric(
            ["distributed"], int((getattr(service, "stats", None) or {}).get("deadlock_victims", 0))
        )
        yield victims

    @staticmethod
    def _locks_of(engine: Any) -> Any:
        return getattr(engine, "locks", None)

    def _store(self, db: Any) -> Iterator[Metric]:
        engine = getattr(db, "engine", None)
        locks = self._locks_of(engine)
        yield CounterMetricFamily(
            PREFIX + "lock_waits",
            "Lock requests that had to wait.",
            value=getattr(locks, "waits", 0),
        )
        yield CounterMetricFamily(
            PREFIX + "lock_timeouts",
            "Lock waits that ended in LockTimeout (lock_wait passed).",
            value=getattr(locks, "timeouts", 0),
        )
        waiting = locks.wait_for() if locks is not None else {}
        yield GaugeMetricFamily(
            PREFIX + "lock_waiting_transactions",
            "Transactions waiting for a lock now.",
            value=len(waiting),
        )
        stats = getattr(getattr(engine, "committer", None), "stats", None)
        if stats is None:
            return
        from nonstop.store.group_commit import GROUP_SIZE_BUCKETS, WRITE_SECONDS_BUCKETS

        yield CounterMetricFamily(
            PREFIX + "group_commit_batches",
            "Object-store write transactions (one fsync each when durable).",
            value=stats.groups,
        )
        yield CounterMetricFamily(
            PREFIX + "group_commit_write_sets",
            "Transactions' write sets committed by the group committer.",
            value=stats.commits,
        )
        yield histogram(
            "group_commit_batch_size",
            "Write sets per group commit.",
            GROUP_SIZE_BUCKETS,
            stats.group_sizes,
            float(stats.commits),
        )
        yield histogram(
            "group_commit_write_seconds",
            "Time to write one group and commit it (the fsync, when durable).",
            WRITE_SECONDS_BUCKETS,
            stats.write_seconds,
            stats.write_seconds_sum,
        )

    def _cluster(self, node: Any) -> Iterator[Metric]:
        obs = self.observer
        raft = getattr(node, "raft", None)
        if raft is not None:
            yield GaugeMetricFamily(PREFIX + "cluster_log_term", "Raft term.", value=raft.term)
            yield GaugeMetricFamily(
                PREFIX + "cluster_log_commit_index",
                "Highest cluster-log index known committed.",
                value=raft.commit_index,
            )
            yield GaugeMetricFamily(
                PREFIX + "cluster_log_last_index",
                "Last index of this node's cluster log.",
                value=raft.last_index,
            )
            yield GaugeMetricFamily(
                PREFIX + "cluster_log_applied_index",
                "Highest cluster-log index applied here.",
                value=node.applied_index,
            )
            yield CounterMetricFamily(
                PREFIX + "cluster_log_applied_entries",
                "Cluster-log entries applied (the applied index: rate() gives entries/s).",
                value=node.applied_index,
            )
            yield CounterMetricFamily(
                PREFIX + "cluster_log_snapshots",
                "Cluster-log snapshots taken or installed by this node since it started.",
                value=getattr(node, "snapshots", 0),
            )
            role = GaugeMetricFamily(
                PREFIX + "cluster_log_role", "1 for this node's Raft role.", labels=["role"]
            )
            for name in ROLES:
                role.add_metric([name], 1 if raft.role == name else 0)
            yield role
            leader = GaugeMetricFamily(
                PREFIX + "cluster_log_leader",
                "1 with the name of the leader this node knows (no series: none known).",
                labels=["leader"],
            )
            if raft.leader is not None:
                leader.add_metric([str(raft.leader)], 1)
            yield leader
            yield GaugeMetricFamily(
                PREFIX + "cluster_view", "Id of the committed view.", value=node.view
            )
            yield GaugeMetricFamily(
                PREFIX + "cluster_members",
                "Members of the committed view.",
                value=len(node.view_members),
            )
            quorum = GaugeMetricFamily(
                PREFIX + "cluster_quorum_state", "1 for this node's quorum state.", labels=["state"]
            )
            for state in QUORUM_STATES:
                quorum.add_metric([state], 1 if node.quorum_state == state else 0)
            yield quorum
        yield CounterMetricFamily(
            PREFIX + "cluster_quorum_changes",
            "Quorum state changes of this node.",
            value=obs.quorum_changes,
        )
        yield CounterMetricFamily(
            PREFIX + "cluster_leader_changes",
            "Leader changes this node heard of.",
            value=obs.leader_changes,
        )
        detector = getattr(node, "detector", None)
        peers = GaugeMetricFamily(
            PREFIX + "cluster_peers",
            "Peers by the failure detector's state (Up, Down, ...).",
            labels=["state"],
        )
        counts = collections.Counter(
            str(p.state) for p in (getattr(detector, "peers", None) or {}).values()
        )
        for state in PEER_STATES:
            peers.add_metric([state], counts.get(state, 0))
        yield peers
        transitions = CounterMetricFamily(
            PREFIX + "cluster_peer_transitions",
            "Peer state changes seen by the failure detector (suspicions: to InDownNotifier).",
            labels=["old", "new"],
        )
        for (old, new), count in sorted(obs.transitions.items()):
            transitions.add_metric([old, new], count)
        yield transitions

    def _runtime(self) -> Iterator[Metric]:
        stats = getattr(self.runtime, "stats", None) or {}
        yield CounterMetricFamily(
            PREFIX + "cluster_store_commits",
            "Cluster-state store commits (Raft log, votes, decisions; one fsync each).",
            value=int(stats.get("commits", 0)),
        )
        yield CounterMetricFamily(
            PREFIX + "cluster_store_commit_seconds",
            "Time spent in those commits.",
            value=int(stats.get("commit_us", 0)) / 1e6,
        )
        events = CounterMetricFamily(
            PREFIX + "runtime_events",
            "The runtime's counters (received messages, persists, machine errors...).",
            labels=["event"],
        )
        for event, count in sorted(stats.items()):
            if event not in ("commits", "commit_us"):
                events.add_metric([str(event)], count)
        yield events


def node_registry(runtime: Any, observer: DataObserver, process: bool = True) -> CollectorRegistry:
    """A registry of its own for the node (not the library's global one: a test may run
    several nodes in one process): :class:`NodeCollector` plus the library's process
    collector (CPU, memory, open files of this process)."""
    from prometheus_client import ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(runtime, observer))
    if process:
        ProcessCollector(registry=registry)
    return registry


def attach(runtime: Any, latency_bounds: Sequence[float]) -> DataObserver:
    """Make the observer of ``runtime``'s node and hook it to the data service and notifiers."""
    observer = DataObserver(latency_bounds)
    service = getattr(getattr(runtime, "router", None), "data", None)
    if service is not None:
        service.observer = observer
    add = getattr(runtime, "add_notifier", None)
    if add is not None:
        add("node_state", observer.on_node_state)
        add("quorum", observer.on_quorum)
        add("leader", observer.on_leader)
    return observer


__all__ = [
    "DataObserver",
    "NodeCollector",
    "attach",
    "cluster_node_of",
    "error_kind",
    "histogram",
    "node_registry",
]
