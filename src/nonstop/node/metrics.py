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
PARTITION_STATES = ("Initial", "Active", "Migrating", "Replicating", "Updating", "Unavailable")
"""The partition table's states (``nonstop.ha.partition_table``): one series each, also at 0."""
ROLES = ("follower", "candidate", "leader")

OTHER = "other"
ROLLBACK = "Rollback"
"""The abort reason of a transaction its client rolled back."""
_CORR_TYPES = (int, str, bytes)
"""The request ids a commit's latency is tracked under (hashable by construction)."""
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
        # The client chose ``corr``: only the kinds a well-behaved client sends are
        # remembered (a list would not even hash), so no client can break the path.
        if (op == "tx.commit" or op == "tx.rollback") and type(corr) in _CORR_TYPES:
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
        if type(corr) not in _CORR_TYPES:
            return
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


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


def labelled(
    kind: type[CounterMetricFamily] | type[GaugeMetricFamily],
    name: str,
    doc: str,
    labels: Sequence[str],
    values: Iterable[tuple[Sequence[str], float]],
) -> Metric:
    """A family with one sample per ``(label values, value)``."""
    family = kind(PREFIX + name, doc, labels=list(labels))
    for label_values, value in values:
        family.add_metric(list(label_values), value)
    return family


def one_hot(name: str, doc: str, label: str, choices: Sequence[str], current: Any) -> Metric:
    """A gauge that is 1 for the current value of a fixed set of ``choices``, 0 for the others."""
    return labelled(
        GaugeMetricFamily, name, doc, [label], (([c], int(c == current)) for c in choices)
    )


class NodeCollector(Collector):
    """Every ``nonstop_*`` family of one node, read from ``runtime`` at scrape time."""

    def __init__(self, runtime: Any, observer: DataObserver) -> None:
        self.runtime = runtime
        self.observer = observer

    def collect(self) -> Iterable[Metric]:
        router = getattr(self.runtime, "router", None)
        service = getattr(router, "data", None)
        engine = getattr(getattr(router, "db", None), "engine", None)
        stats = getattr(service, "stats", None) or {}
        yield from self._transactions(service, stats)
        yield from self._data_service(service, stats, getattr(engine, "locks", None))
        yield from self._store(engine)
        node = cluster_node_of(getattr(self.runtime, "machine", None))
        yield from self._cluster(node)
        yield from self._partitions(node)
        yield from self._runtime()
        yield from self._loop_lag()
        yield from self._limits()

    # ------------------------------------------------------------ families
    def _transactions(self, service: Any, stats: Any) -> Iterator[Metric]:
        obs = self.observer
        yield counter(
            "transactions_committed",
            "Transactions this node coordinated that committed (tx.commit answered ok).",
            obs.commits,
        )
        reasons = collections.Counter(obs.aborts)
        reasons["Idle"] += int(stats.get("idle_sessions", 0))
        for reason in ("Conflict", "Deadlock", "LockTimeout", "Unavailable", ROLLBACK, "Idle"):
            reasons.setdefault(reason, 0)
        yield labelled(
            CounterMetricFamily,
            "transactions_aborted",
            "Transactions this node coordinated that ended without committing, by reason: "
            "the commit's error, Rollback (by the client), Idle (tx_idle passed).",
            ["reason"],
            (([reason], count) for reason, count in sorted(reasons.items())),
        )
        sessions = getattr(getattr(service, "machine", None), "sessions", None) or {}
        yield gauge(
            "transactions_active",
            "Transactions open now on this node as coordinator (client sessions).",
            len(sessions),
        )
        latency = obs.latency
        yield histogram(
            "commit_latency_seconds",
            "tx.commit latency at the coordinator, from the op's arrival to its reply.",
            latency.bounds,
            latency.counts,
            latency.sum,
        )

    def _data_service(self, service: Any, stats: Any, locks: Any) -> Iterator[Metric]:
        obs = self.observer
        machine = getattr(service, "machine", None)
        yield gauge(
            "data_branches",
            "Transaction branches held on this node (its sessions' and remote coordinators').",
            len(getattr(machine, "branches", None) or {}),
        )
        yield gauge(
            "data_client_connections",
            "Client connections that opened a data session on this node.",
            len(getattr(service, "_conns", None) or {}),
        )
        yield counter("data_session_ops", "Session ops received (tx.*).", obs.ops)
        yield labelled(
            CounterMetricFamily,
            "data_request_errors",
            "Session ops answered with an error, by error kind (nonstop.errors class name).",
            ["kind"],
            (([kind], count) for kind, count in sorted(obs.errors.items())),
        )
        yield labelled(
            CounterMetricFamily,
            "data_events",
            "The data plane's own counters (two_phase, rpc, idle_rollbacks, deadlock_victims...).",
            ["event"],
            (([str(event)], count) for event, count in sorted(stats.items())),
        )
        yield labelled(
            CounterMetricFamily,
            "lock_deadlock_victims",
            "Transactions rolled back to break a deadlock: found in this node's lock table "
            "(local) or across nodes by the data plane (distributed).",
            ["scope"],
            [
                (["local"], getattr(locks, "deadlocks", 0)),
                (["distributed"], int(stats.get("deadlock_victims", 0))),
            ],
        )
        yield counter("lock_waits", "Lock requests that had to wait.", getattr(locks, "waits", 0))
        yield counter(
            "lock_timeouts",
            "Lock waits that ended in LockTimeout (lock_wait passed).",
            getattr(locks, "timeouts", 0),
        )
        yield gauge(
            "lock_waiting_transactions",
            "Transactions waiting for a lock now.",
            len(locks.wait_for()) if locks is not None else 0,
        )

    def _store(self, engine: Any) -> Iterator[Metric]:
        stats = getattr(getattr(engine, "committer", None), "stats", None)
        if stats is None:
            return
        from nonstop.store.group_commit import GROUP_SIZE_BUCKETS, WRITE_SECONDS_BUCKETS

        yield counter(
            "group_commit_batches",
            "Object-store write transactions (one fsync each when durable).",
            stats.groups,
        )
        yield counter(
            "group_commit_write_sets",
            "Transactions' write sets committed by the group committer.",
            stats.commits,
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
            for name, doc, value in (
                ("cluster_log_term", "Raft term.", raft.term),
                ("cluster_log_commit_index", "Highest index known committed.", raft.commit_index),
                ("cluster_log_last_index", "Last index of this node's log.", raft.last_index),
                ("cluster_log_applied_index", "Highest index applied here.", node.applied_index),
                ("cluster_view", "Id of the committed view.", node.view),
                ("cluster_members", "Members of the committed view.", len(node.view_members)),
            ):
                yield gauge(name, doc, value)
            yield counter(
                "cluster_log_applied_entries",
                "Cluster-log entries applied (the applied index: rate() gives entries/s).",
                node.applied_index,
            )
            yield counter(
                "cluster_log_snapshots",
                "Cluster-log snapshots taken or installed by this node since it started.",
                getattr(node, "snapshots", 0),
            )
            yield one_hot(
                "cluster_log_role", "1 for this node's Raft role.", "role", ROLES, raft.role
            )
            yield labelled(
                GaugeMetricFamily,
                "cluster_log_leader",
                "1 with the name of the leader this node knows (no series: none known).",
                ["leader"],
                [] if raft.leader is None else [([str(raft.leader)], 1)],
            )
            yield one_hot(
                "cluster_quorum_state",
                "1 for this node's quorum state.",
                "state",
                QUORUM_STATES,
                node.quorum_state,
            )
        yield counter(
            "cluster_quorum_changes", "Quorum state changes of this node.", obs.quorum_changes
        )
        yield counter(
            "cluster_leader_changes", "Leader changes this node heard of.", obs.leader_changes
        )
        detector = getattr(node, "detector", None)
        states = collections.Counter(
            str(p.state) for p in (getattr(detector, "peers", None) or {}).values()
        )
        yield labelled(
            GaugeMetricFamily,
            "cluster_peers",
            "Peers by the failure detector's state (Up, Down, ...).",
            ["state"],
            (([state], states.get(state, 0)) for state in PEER_STATES),
        )
        yield labelled(
            CounterMetricFamily,
            "cluster_peer_transitions",
            "Peer state changes seen by the failure detector (suspicions: to InDownNotifier).",
            ["old", "new"],
            (([old, new], count) for (old, new), count in sorted(obs.transitions.items())),
        )

    def _partitions(self, node: Any) -> Iterator[Metric]:
        """The partition table (ha/), when the node's machine has one: counts, not names."""
        table = getattr(node, "partition_table", None)
        partitions = getattr(table, "partitions", None)
        if not isinstance(partitions, dict):
            return
        name = getattr(node, "name", None)
        states = collections.Counter(str(p.state) for p in partitions.values())
        yield labelled(
            GaugeMetricFamily,
            "partitions",
            "Partitions of the cluster by state (Initial, Active, Migrating, ...).",
            ["state"],
            (([state], states.get(state, 0)) for state in sorted({*PARTITION_STATES, *states})),
        )
        yield gauge(
            "partitions_active_here",
            "Partitions whose active copy is this node.",
            sum(1 for p in partitions.values() if p.active == name),
        )
        yield gauge(
            "partitions_copying_here",
            "Partitions this node holds a copy of that is still being copied.",
            sum(1 for p in partitions.values() if name in p.copying),
        )

    def _runtime(self) -> Iterator[Metric]:
        stats = getattr(self.runtime, "stats", None) or {}
        yield counter(
            "cluster_store_commits",
            "Cluster-state store commits (Raft log, votes, decisions; one fsync each).",
            int(stats.get("commits", 0)),
        )
        yield counter(
            "cluster_store_commit_seconds",
            "Time spent in those commits.",
            int(stats.get("commit_us", 0)) / 1e6,
        )
        yield labelled(
            CounterMetricFamily,
            "runtime_events",
            "The runtime's counters (received messages, persists, machine errors...).",
            ["event"],
            (
                ([str(event)], count)
                for event, count in sorted(stats.items())
                if event not in ("commits", "commit_us")
            ),
        )

    def _loop_lag(self) -> Iterator[Metric]:
        """How late the event loop wakes (``runtime/loop_lag.py``)."""
        lag = getattr(self.runtime, "loop_lag", None)
        if lag is None:
            return
        yield histogram(
            "event_loop_lag_seconds",
            "How late the node's event loop woke for a periodic 50 ms timer: the longest a"
            " ready callback (a keep-alive, a reply) waited behind the step that ran before it.",
            lag.bounds,
            lag.counts,
            lag.sum,
        )
        yield gauge(
            "event_loop_lag_max_seconds",
            "The worst event-loop lag since the previous scrape.",
            lag.take_recent_worst(),
        )
        yield counter(
            "event_loop_blocked",
            "Wake-ups later than the warning threshold (half the detector's timeout).",
            lag.over,
        )

    def _limits(self) -> Iterator[Metric]:
        """The node port's limits (``runtime/limits.py``): refusals, connections, bytes."""
        bounds = getattr(self.runtime, "bounds", None)
        if bounds is None:
            return
        snap = bounds.snapshot()
        yield labelled(
            CounterMetricFamily,
            "connection_refusals",
            "Connections closed or refused by a limit of the node port, by reason.",
            ["reason"],
            (([reason], count) for reason, count in sorted(snap["refusals"].items())),
        )
        yield labelled(
            GaugeMetricFamily,
            "connections",
            "Inbound connections of the node port: in their handshake, clients, nodes.",
            ["state"],
            (([state], count) for state, count in sorted(snap["connections"].items())),
        )
        yield gauge(
            "buffered_bytes",
            "Bytes of incomplete frames charged to the node's buffer budget now.",
            snap["buffered_bytes"],
        )
        yield gauge(
            "buffer_budget_bytes",
            "The node's buffer budget (limits.buffer_budget_bytes).",
            snap["buffer_budget_bytes"],
        )


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
    """Make the observer of ``runtime``'s node and hook it to the data service and notifiers;
    the one already hooked, if any (the metrics endpoint and the console share it)."""
    service = getattr(getattr(runtime, "router", None), "data", None)
    existing = getattr(service, "observer", None)
    if isinstance(existing, DataObserver):
        return existing
    observer = DataObserver(latency_bounds)
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
