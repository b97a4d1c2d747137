"""The replication scenario: sync replication under the full nemesis (replication.md section 7).

One seed = one run of the cluster scenario (:mod:`nonstop.sim.scenarios.cluster_log`:
3-5 nodes, crashes, pauses, partitions both ways and one way, loss,
duplication, reordering, disks losing unsynced writes, then a heal) whose
nodes are :class:`~nonstop.sim.scenarios.replication_node.ReplicatedNode`:
the partition table (with the partitions scenario's layout: a dynamic policy
with one sync replica, plus a static partition with two sync copies and an
async one), the replication machine, the decision table and a small data
service.  Clients (:mod:`nonstop.sim.scenarios.replication_workload`) append
to lists and run two-partition transactions until the heal, then finish what
they started.

Checked during the run (:class:`ReplicationChecker`, after every event):

* **one-acknowledger** (I1) -- at most one node acknowledges records of a
  partition at one epoch;
* **durable** (I3) -- when a node acknowledges record ``seq``, its own disk
  and the disk of every in-sync sync replica of its epoch hold the stream up
  to ``seq`` (read from the simulated disks' synced state, not from the
  machines);
* **fence** (I2) -- a replica handling a ``rep`` of a lower epoch than its own
  does not move its place in the partition's history;
* and the partitions scenario's checks (:class:`~nonstop.sim.scenarios.
  partitions.PartitionChecker`): tables agree, one active per epoch, one
  acting node at any instant.

Checked at the end:

* **heal** -- every partition Active again, every listed node in sync (the
  restore copies done), and every client operation finished;
* **acked-everywhere** -- every acknowledged append is in the final active
  node's object and in every in-sync sync replica's;
* **list** (I4 and exactly once) -- per key, on the active node: every
  acknowledged append exactly once, no value twice, no value nobody wrote,
  and an append acknowledged before another was invoked comes first;
* **history** -- the history checker (:func:`~nonstop.sim.history.check_list_append`,
  strict serializability) on the clients' history plus a final read of every key.

Mutants (``mutant``; tests/sim/test_replication.py asserts each is caught):
``ack_before_replica`` (completion does not wait for replicas),
``stale_epoch`` (a replica accepts records of a lower epoch, from anyone),
``local_promotion`` (a node promotes itself without a log entry),
``ignore_prepared`` (a promoted node drops its prepared records).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from nonstop.cluster.node import ClusterConfig
from nonstop.ha.failover import PromoterConfig
from nonstop.ha.lease import LeaseConfig
from nonstop.net import plain
from nonstop.replication import ReplicationConfig
from nonstop.replication.data import K_HEAD
from nonstop.replication.machine import MUTANTS as MACHINE_MUTANTS
from nonstop.replication.machine import REP
from nonstop.runtime.interface import Action, Event, Machine, NodeId, Notify, Received
from nonstop.sim.checker import OnlineChecker, Violation
from nonstop.sim.core import Simulation
from nonstop.sim.history import OK, Txn, check_list_append
from nonstop.sim.scenarios import cluster_log
from nonstop.sim.scenarios.partitions import (
    HaResult,
    Layouts,
    PartitionChecker,
    run_cluster,
    run_until_settled,
    settled,
)
from nonstop.sim.scenarios.replication_node import (
    LocalPromotionNode,
    ReplicatedNode,
    partition_of,
)
from nonstop.sim.scenarios.replication_workload import Client, Op, WorkloadConfig

MUTANTS = (*MACHINE_MUTANTS, "local_promotion")


@dataclass(slots=True)
class ReplicationScenarioConfig:
    """Knobs of a replication run (the cluster scenario's own in ``cluster``)."""

    cluster: cluster_log.ScenarioConfig = field(
        default_factory=lambda: cluster_log.ScenarioConfig(
            heal_at=4.0,
            membership_probability=0.0,
            client_interval=0.2,
            fault_kinds=("crash", "pause", "partition", "one_way", "loss", "stall"),
            max_events=600_000,
        )
    )
    partitions: int = 4
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    clients_start: float = 0.6
    settle_within: float = 10.0
    retry: float = 0.3
    lease: LeaseConfig = field(default_factory=lambda: LeaseConfig(lease=0.6, drift=0.0))
    replication: ReplicationConfig = field(
        default_factory=lambda: ReplicationConfig(
            replica_timeout=0.3,
            resend=0.05,
            batch=4,
            resolve_after=1.0,
            # Every two-key prepared record in two parts, every message at most two writes:
            # the seeds run the parts and the bounded messages (replication.md §4a).
            record_writes=1,
            message_writes=2,
            # One write made per event: every such record and every outcome of one goes
            # across events (``rep.slice``), other records queued behind (§4a).
            step_writes=1,
        )
    )
    mutant: str | None = None


# ---------------------------------------------------------------- checker
@dataclass(slots=True)
class ReplicationChecker(OnlineChecker):
    """The replication invariants checked during the run (module doc)."""

    acknowledgers: dict[tuple[str, int], NodeId] = field(default_factory=dict)
    heads: dict[NodeId, tuple[int, dict[str, tuple[int, int]]]] = field(default_factory=dict)
    last_acker: dict[str, tuple[NodeId, float]] = field(default_factory=dict)
    orphaned: dict[str, tuple[NodeId, float]] = field(default_factory=dict)
    takeovers: list[float] = field(default_factory=list)
    """Virtual seconds from the crash of a node acknowledging for P to P's next acknowledgement."""
    acks: int = 0
    drops: set[tuple[str, int]] = field(default_factory=set)
    stale_refused: int = 0

    def on_fault(self, sim: Simulation, what: str, details: dict[str, Any]) -> None:
        if what != "crash":
            return
        node = details.get("node")
        for name, (acker, at) in self.last_acker.items():
            if acker == node and sim.now - at < 0.3 and name not in self.orphaned:
                self.orphaned[name] = (acker, sim.now)

    def observe(self, sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        machine = sim.machine(node)
        if not isinstance(machine, ReplicatedNode):
            return
        rep = machine.replication
        life = sim.nodes[node].incarnation  # (not id(machine): partitions.py)
        payload = event.payload if isinstance(event, Received) else None
        if isinstance(payload, dict) and payload.get("t") == REP:
            self._check_fence(sim, node, life, rep.views, rep.data.heads, payload)
        for action in actions:
            if not isinstance(action, Notify):
                continue
            if action.kind == "rep.acked":
                self._on_ack(sim, node, machine, action.data)
            elif action.kind == "pt.changed" and action.data.get("kind") == "drop":
                self.drops.add((action.data["p"], action.data["epoch"]))
        self.heads[node] = (life, dict(rep.data.heads))

    def _check_fence(
        self,
        sim: Simulation,
        node: NodeId,
        life: int,
        views: Mapping[str, Any],
        heads: Mapping[str, tuple[int, int]],
        payload: dict[str, Any],
    ) -> None:
        before_life, before = self.heads.get(node, (None, {}))
        if before_life != life:
            return
        for part in payload.get("parts", []):
            if not isinstance(part, list) or len(part) not in (5, 6):
                continue
            name, epoch = part[0], part[1]
            view = views.get(name)
            if view is None or not isinstance(epoch, int) or epoch >= view.epoch:
                continue
            self.stale_refused += 1
            # Applying a part moves the head onto the part's own stream (data.apply);
            # the node's own work in the same step (a promoted node opening its new
            # stream) moves it elsewhere, which is not the stale part applied.
            head = heads.get(name)
            if head != before.get(name) and head is not None and head[0] == part[2]:
                self.fail(
                    sim,
                    "fence",
                    f"{node} at epoch {view.epoch} of {name} applied records of epoch {epoch}",
                )

    def _on_ack(
        self, sim: Simulation, node: NodeId, machine: ReplicatedNode, data: dict[str, Any]
    ) -> None:
        self.acks += 1
        name, epoch, seq, stream = data["p"], data["e"], data["seq"], data["s"]
        first = self.acknowledgers.setdefault((name, epoch), node)
        if first != node:
            self.fail(
                sim, "one-acknowledger", f"{name} epoch {epoch}: {first} and {node} acknowledge"
            )
        orphan = self.orphaned.get(name)
        if orphan is not None and orphan[0] != node:
            self.takeovers.append(sim.now - orphan[1])
            del self.orphaned[name]
        self.last_acker[name] = (node, sim.now)
        view = machine.replication.views.get(name)
        holders = [node, *(view.in_sync_replicas() if view is not None else ())]
        for holder in holders:
            raw = sim.nodes[holder].disk.durable.get(K_HEAD + name.encode())
            head = tuple(plain.unpack(raw)) if raw is not None else (0, 0)
            if head[0] != stream or head[1] < seq:
                self.fail(
                    sim,
                    "durable",
                    f"{node} acknowledged {name} seq {seq} at epoch {epoch}; "
                    f"{holder}'s disk holds {head}",
                )


# ---------------------------------------------------------------- final checks
def check_final(
    sim: Simulation,
    names: list[NodeId],
    partitions: list[str],
    ops: list[tuple[int, Op]],
    fail: Callable[[str, str], None],
) -> None:
    """acked-everywhere, list and history (module doc) on the settled cluster."""
    machine = sim.machine(names[0])
    assert isinstance(machine, ReplicatedNode)
    finals: dict[str, list[Any]] = {}
    holders_of: dict[str, list[NodeId]] = {}
    for name in partitions:
        part = machine.partition_table.get(name)
        if part is None or part.active is None:
            fail("acked-everywhere", f"{name} has no active node at the end")
            return
        view_holders = [part.active, *[n for n in part.holders() if n != part.active]]
        holders_of[name] = view_holders
    acked = [(c, op) for c, op in ops if op.type == OK]
    for key in sorted({k for _, op in ops for k in op.values}):
        name = partition_of(key, partitions)
        active = sim.machine(holders_of[name][0])
        assert isinstance(active, ReplicatedNode)
        finals[key] = list(active.replication.data.values(name).get(key, []))
        for holder in holders_of[name]:
            other = sim.machine(holder)
            assert isinstance(other, ReplicatedNode)
            have = set(other.replication.data.values(name).get(key, []))
            missing = [op.rid for _, op in acked if key in op.values and op.values[key] not in have]
            if missing:
                fail(
                    "acked-everywhere",
                    f"{key} on {holder} ({name}) lacks acknowledged {missing[:5]}",
                )
    written = {(k, v): op for _, op in ops for k, v in op.values.items()}
    for key, values in finals.items():
        seen: set[Any] = set()
        for value in values:
            if value in seen:
                fail("list", f"{key}: {value} appears twice in {values}")
            seen.add(value)
            if (key, value) not in written:
                fail("list", f"{key}: {value} was never written")
        position = {v: i for i, v in enumerate(values)}
        mine = [op for _, op in acked if key in op.values]
        for op in mine:
            if op.values[key] not in position:
                fail("list", f"{key}: acknowledged {op.rid} ({op.values[key]}) is lost")
        for a in mine:
            for b in mine:
                if (
                    a.complete is not None
                    and b.invoke > a.complete
                    and position.get(a.values[key], -1) > position.get(b.values[key], 1 << 60)
                ):
                    fail("list", f"{key}: {a.rid} acknowledged before {b.rid} began, but after it")
    history = [
        Txn([("append", k, v) for k, v in op.values.items()], op.type, c, op.invoke, op.complete)
        for c, op in ops
    ]
    history.append(Txn([("r", k, v) for k, v in finals.items()], OK, "final", sim.now, sim.now))
    result = check_list_append(history, realtime=True)
    if not result.valid:
        fail("history", result.report(limit=2))


def _data_settled(sim: Simulation, names: list[NodeId], clients: list[Client]) -> str | None:
    for client in clients:
        if not client.done:
            op = client.op
            return f"client {client.number} still runs {op.rid if op else '?'}"
    return None


# ---------------------------------------------------------------- one seed
def run_seed(
    seed: int,
    config: ReplicationScenarioConfig | None = None,
    *,
    trace: bool = False,
    on_start: Callable[[Simulation], None] | None = None,
) -> tuple[HaResult, Simulation]:
    """Run one seed: the cluster scenario with replicated nodes and clients, then the checks."""
    cfg = config or ReplicationScenarioConfig()
    if cfg.mutant is not None and cfg.mutant not in MUTANTS:
        raise ValueError(f"unknown mutant {cfg.mutant!r}; known: {MUTANTS}")
    node_class = LocalPromotionNode if cfg.mutant == "local_promotion" else ReplicatedNode
    machine_mutant = cfg.mutant if cfg.mutant in MACHINE_MUTANTS else None
    rep_config = replace(cfg.replication, mutant=machine_mutant)
    promoter = PromoterConfig(retry=cfg.retry)
    layouts = Layouts(cfg.partitions)

    def factory(
        config: ClusterConfig, rng: random.Random, recovered: Mapping[bytes, bytes]
    ) -> Machine:
        return node_class(
            config, rng, recovered, layouts.of(config), promoter, cfg.lease, rep_config
        )

    checker = ReplicationChecker()
    partition_checker = PartitionChecker()
    clients: list[Client] = []
    client_rng = random.Random(seed * 1_000_003 + 17)

    def start_clients(sim: Simulation) -> None:
        names = sorted(sim.nodes)
        partitions = sorted(p.name for p in layouts.first())
        for number in range(1, cfg.workload.clients + 1):
            rng = random.Random(client_rng.getrandbits(64))
            client = Client(number, sim, rng, names, partitions, cfg.workload, cfg.cluster.heal_at)
            clients.append(client)
            client.start()

    def start(sim: Simulation) -> None:
        partition_checker.attach(sim)
        checker.attach(sim)
        sim.at(cfg.clients_start, lambda: start_clients(sim))
        if on_start is not None:
            on_start(sim)

    result, sim = run_cluster(seed, cfg.cluster, factory, trace=trace, on_start=start)
    names = result.nodes
    layout = layouts.first()
    partitions = sorted(p.name for p in layout)
    healed_after: float | None = None
    fails: list[Violation] = []

    def fail(invariant: str, detail: str) -> None:
        if len(fails) < 20:
            fails.append(Violation(sim.now, invariant, detail))

    if result.ok:
        why = run_until_settled(
            sim,
            cfg.settle_within,
            lambda: settled(sim, names, layout) or _data_settled(sim, names, clients),
        )
        if why is not None:
            fail("heal", f"not settled {cfg.settle_within}s after the cluster agreed: {why}")
        else:
            healed_after = sim.now - cfg.cluster.heal_at
            ops = [(c.number, op) for c in clients for op in c.all_ops()]
            check_final(sim, names, partitions, ops, fail)
    for client in clients:
        for error in client.errors[:3]:
            fail("client", error)
    violations = result.violations + partition_checker.violations + checker.violations + fails
    all_ops = [op for c in clients for op in c.all_ops()]
    stats = {
        **result.stats,
        "failovers": partition_checker.failovers,
        "restores": partition_checker.restores,
        "drops": len(checker.drops),
        "acks": checker.acks,
        "acked_ops": sum(1 for op in all_ops if op.type == OK),
        "txns": sum(1 for op in all_ops if op.kind == "txn" and op.type == OK),
        "ops": len(all_ops),
        "stale_refused": checker.stale_refused,
        "takeovers": list(checker.takeovers),
        "settled_after": healed_after,
    }
    line = (
        f"seed {seed}: {'ok' if not violations else 'FAIL'} nodes={len(names)} "
        f"faults={len(result.faults)} acked={stats['acked_ops']}/{stats['ops']} "
        f"txns={stats['txns']} failovers={stats['failovers']} drops={stats['drops']} "
        f"events={stats['events']} wall={stats['wall_time']:.2f}s"
    )
    return HaResult(seed, not violations, violations, line, stats), sim


__all__ = [
    "MUTANTS",
    "ReplicationChecker",
    "ReplicationScenarioConfig",
    "check_final",
    "run_seed",
]
