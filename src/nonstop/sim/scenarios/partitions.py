"""The partition-table scenario: HA cluster nodes under the nemesis (ha.md section 11).

One seed = one run of the cluster scenario (:mod:`nonstop.sim.scenarios.cluster_log`:
its world, workload, nemesis, convergence and log checks) whose nodes are
:class:`~nonstop.ha.cluster_node.HaClusterNode`: each registers the partition
table, defines and enables its partitions (a dynamic policy of
``partitions`` partitions with one sync replica over every node, plus one
static partition with a sync and an async replica), the leader's promoter
fails partitions over, and active nodes report restores.  The partition
checker (:class:`PartitionChecker`) looks at every node's table after every
event:

* **table** -- every node's table is the same at the same applied log index;
* **one-active** -- no two tables (any node, any time) name different active
  nodes or current lists for the same (partition, epoch);
* **epoch** -- within one life of a node, a partition's epoch never goes down;
* **one-acting** -- at no instant do two nodes *act* for one partition (may
  acknowledge: quorum, active in their table, lease held, previous active's
  lease waited out -- ha.md section 8, :mod:`nonstop.ha.lease`): a node's
  answer is recorded at each of its events with the time its lease runs out,
  and compared with every other live node's answer still in force;
* **heal** (after the cluster converged) -- within ``partitions_within``
  virtual seconds, every partition is Active on every node with a live active
  node and every listed node back in sync (failover and restore both done).

Mutants (tests/sim/test_partitions.py): ``local_promotion`` applies the
failover on the leader's own table without a log entry; ``no_epoch_bump``
fails over without bumping the epoch; ``no_lease_wait`` lets a new active
node act before the previous one's lease ran out; ``snapshot_keeps_acting``
lets a node that installs a snapshot go on acting for every partition it is
active for in it, even one that changed hands inside the snapshot (the
keeper's ``(active, epoch, changed)`` comparison removed);
``release_while_waiting`` lets a handover's old active node send ``released``
even while it was itself still waiting out its predecessor's lease (so the new
active node may act beside that predecessor).  The checker must catch each.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.cluster.node import ClusterConfig
from nonstop.cluster.raft import ROLE_LEADER
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.failover import PromoterConfig
from nonstop.ha.lease import LeaseConfig, LeaseKeeper
from nonstop.ha.partition_table import ACTIVE, Partition, PartitionTable
from nonstop.ha.policies import ASYNC, SYNC, Distribution, PartitionDef, Policy
from nonstop.runtime.interface import Action, Event, Machine, NodeId
from nonstop.sim.checker import OnlineChecker, Violation
from nonstop.sim.core import Simulation
from nonstop.sim.scenarios import cluster_log

MUTANTS = (
    "local_promotion",
    "no_epoch_bump",
    "no_lease_wait",
    "snapshot_keeps_acting",
    "release_while_waiting",
)


@dataclass(slots=True)
class PartitionsConfig:
    """Knobs of a partitions run (the cluster scenario's own in ``cluster``)."""

    cluster: cluster_log.ScenarioConfig = field(
        default_factory=lambda: cluster_log.ScenarioConfig(
            heal_at=4.0, membership_probability=0.15, client_interval=0.1
        )
    )
    partitions: int = 4
    partitions_within: float = 8.0
    retry: float = 0.3
    lease: LeaseConfig = field(default_factory=lambda: LeaseConfig(lease=0.6, drift=0.0))
    """Simulated clocks are exact: no drift margin (the real default keeps one)."""
    mutant: str | None = None


def layout_for(names: list[NodeId], partitions: int) -> list[PartitionDef]:
    """The dynamic policy over every node, plus a static partition with an async replica."""
    names = sorted(names)
    static = PartitionDef("S", ((names[-1], SYNC), (names[0], SYNC), (names[1], ASYNC)), "pinned")
    dist = Distribution(
        {
            "default": Policy("default", partitions=partitions),
            "pinned": Policy("pinned", kind="static", static=(static,)),
        }
    )
    dist.validate(names)
    return dist.layout(names)


# ---------------------------------------------------------------- mutants
class _NoEpochBumpTable(PartitionTable):
    """Broken on purpose: a failover keeps the epoch (so one epoch names two actives)."""

    def _failover(self, index: int, part: Partition, dead: list[str]) -> list[Action]:
        actions = super()._failover(index, part, dead)
        part.epoch -= 1
        return actions


class _NoEpochBumpNode(HaClusterNode):
    def _make_table(self) -> PartitionTable:
        return _NoEpochBumpTable(members=lambda: self.view_members, live=lambda: self.view_live)


class _LocalPromotionNode(HaClusterNode):
    """Broken on purpose: the leader applies its failovers to its own table, not the log."""

    def _ha_proposals(self, now: float) -> list[Action]:
        if self.enabled and self.raft.role == ROLE_LEADER:
            for entry in self.promoter.proposals(now, self.view_live):
                if entry["pt"] == "failover":
                    self.partition_table.apply(self.applied_index, {**entry, "r": [self.name, 0]})
        return super()._ha_proposals(now)


class _NoLeaseWaitNode(HaClusterNode):
    """Broken on purpose: a new active node acts at once, without waiting out the old lease."""

    def _make_leases(self, config: LeaseConfig | None) -> LeaseKeeper:
        return LeaseKeeper(
            self.name, self.incarnation, self.partition_table, config, wait_for_previous=False
        )


class _SnapshotKeepsActingKeeper(LeaseKeeper):
    """Broken on purpose: a snapshot never makes an active node wait."""

    def on_snapshot(self, now: float) -> None:
        self._snapshot_at = now
        for name, part in self.table.partitions.items():
            if part.active == self.me:
                self._acting_from.setdefault(name, now)


class _SnapshotKeepsActingNode(HaClusterNode):
    def _make_leases(self, config: LeaseConfig | None) -> LeaseKeeper:
        return _SnapshotKeepsActingKeeper(self.name, self.incarnation, self.partition_table, config)


class _ReleaseWhileWaitingNode(HaClusterNode):
    """Broken on purpose: a handover ends the new active node's wait even when the old
    active node never acted (it was waiting for its own predecessor's lease)."""

    def _make_leases(self, config: LeaseConfig | None) -> LeaseKeeper:
        return LeaseKeeper(
            self.name, self.incarnation, self.partition_table, config, release_unless_acting=True
        )


_NODE_CLASSES: dict[str | None, type[HaClusterNode]] = {
    None: HaClusterNode,
    "no_epoch_bump": _NoEpochBumpNode,
    "local_promotion": _LocalPromotionNode,
    "no_lease_wait": _NoLeaseWaitNode,
    "snapshot_keeps_acting": _SnapshotKeepsActingNode,
    "release_while_waiting": _ReleaseWhileWaitingNode,
}


# ---------------------------------------------------------------- checker
@dataclass(slots=True)
class PartitionChecker(OnlineChecker):
    """The partition invariants, checked after every event (module doc)."""

    at_index: dict[int, tuple[bytes, NodeId]] = field(default_factory=dict)
    epochs: dict[tuple[str, int], tuple[Any, ...]] = field(default_factory=dict)
    last: dict[NodeId, tuple[int, int]] = field(default_factory=dict)  # incarnation, index
    life_epochs: dict[tuple[NodeId, int, str], int] = field(default_factory=dict)
    acting: dict[str, dict[NodeId, tuple[int, float]]] = field(default_factory=dict)
    """partition -> node -> (life, until): who may acknowledge, as of its last event."""
    acting_checks: int = 0
    orphaned: dict[str, float] = field(default_factory=dict)
    """partition -> when the node acting for it crashed (until another node acts)."""
    takeovers: list[float] = field(default_factory=list)
    """Virtual seconds from the crash of a partition's acting node to a new node acting."""
    failovers: int = 0
    restores: int = 0

    def on_fault(self, sim: Simulation, what: str, details: dict[str, Any]) -> None:
        """A crash of an acting node starts a takeover clock for its partitions."""
        if what != "crash":
            return
        node = details.get("node")
        for name, holders in self.acting.items():
            record = holders.pop(node, None) if isinstance(node, str) else None
            if record is not None and record[1] > sim.now and name not in self.orphaned:
                self.orphaned[name] = sim.now

    def observe(self, sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        for action in actions:
            kind = getattr(action, "kind", None)
            if kind == "pt.changed":
                data = getattr(action, "data", {})
                if data.get("kind") == "failover":
                    self.failovers += 1
                elif data.get("kind") == "restored":
                    self.restores += 1
        machine = sim.machine(node)
        if not isinstance(machine, HaClusterNode):
            return
        # The node's incarnation, not id(machine): a restarted node's new machine may be
        # allocated where the old one was (seed 3301477 failed once, in one campaign
        # process only: a restart taken for the same life, its rebuilt table for an
        # epoch going back).
        life = sim.nodes[node].incarnation
        self._check_acting(sim, node, life, machine)
        index = machine.applied_index
        if self.last.get(node) == (life, index):
            return
        self.last[node] = (life, index)
        table = machine.partition_table
        digest = table.digest()
        seen = self.at_index.get(index)
        if seen is None:
            self.at_index[index] = (digest, node)
        elif seen[0] != digest:
            self.fail(sim, "table", f"{node} and {seen[1]} differ at log index {index}")
        for name, part in table.partitions.items():
            who = (part.active, tuple(part.current))
            first = self.epochs.setdefault((name, part.epoch), who)
            if first != who:
                self.fail(
                    sim,
                    "one-active",
                    f"{name} epoch {part.epoch}: {node} has active {who}, another {first}",
                )
            key = (node, life, name)
            if part.epoch < self.life_epochs.get(key, 0):
                self.fail(sim, "epoch", f"{name} on {node}: epoch went back to {part.epoch}")
            self.life_epochs[key] = part.epoch

    def _check_acting(
        self, sim: Simulation, node: NodeId, life: int, machine: HaClusterNode
    ) -> None:
        now = sim.now
        for name in machine.partition_table.partitions:
            holders = self.acting.setdefault(name, {})
            if not machine.acting(now, name):
                holders.pop(node, None)
                continue
            holders[node] = (life, machine.leases.acting_until(name))
            self.acting_checks += 1
            crashed_at = self.orphaned.pop(name, None)
            if crashed_at is not None:
                self.takeovers.append(now - crashed_at)
            for other, (other_life, until) in holders.items():
                if other == node or until <= now:
                    continue
                other_machine = sim.machine(other)
                if other_machine is None or sim.nodes[other].incarnation != other_life:
                    continue  # crashed since: it acts no more
                self.fail(
                    sim,
                    "one-acting",
                    f"{name}: {node} and {other} may both acknowledge (until {until:.3f})",
                )


def settled(sim: Simulation, names: list[NodeId], layout: list[PartitionDef]) -> str | None:
    """None when every node sees every partition Active, live active, all listed in sync."""
    for name in names:
        machine = sim.machine(name)
        if not isinstance(machine, HaClusterNode) or not sim.nodes[name].up:
            return f"{name} is not running"
        for pdef in layout:
            part = machine.partition_table.get(pdef.name)
            if part is None:
                return f"{pdef.name} is not defined on {name}"
            if part.state != ACTIVE or part.active is None:
                return f"{pdef.name} is {part.state} on {name}"
            if part.current != pdef.node_names() or part.copying:
                return f"{pdef.name} on {name}: current {part.current} copying {part.copying}"
    return None


@dataclass(slots=True)
class HaResult:
    """One seed of an HA scenario (this one, replication's): verdict, summary line, counts."""

    seed: int
    ok: bool
    violations: list[Violation]
    summary_line: str
    stats: dict[str, Any]

    def summary(self) -> str:
        return self.summary_line


class Layouts:
    """The partition layout of each cluster a run builds (by its sorted names), made once:
    every node of a cluster gets the same list."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.by_names: dict[tuple[NodeId, ...], list[PartitionDef]] = {}

    def of(self, config: ClusterConfig) -> list[PartitionDef]:
        names = tuple(sorted({config.name, *config.static_peers}))
        if names not in self.by_names:
            self.by_names[names] = layout_for(list(names), self.partitions)
        return self.by_names[names]

    def first(self) -> list[PartitionDef]:
        """The run's layout (one cluster per run); empty before any node was built."""
        return next(iter(self.by_names.values()), [])


NodeMaker = Callable[[ClusterConfig, random.Random, Mapping[bytes, bytes]], Machine]


def run_cluster(
    seed: int,
    cluster: cluster_log.ScenarioConfig,
    factory: NodeMaker,
    *,
    trace: bool,
    on_start: Callable[[Simulation], None],
) -> tuple[cluster_log.RunResult, Simulation]:
    """The cluster scenario on a copy of ``cluster`` whose nodes ``factory`` builds."""
    cluster_cfg = cluster_log.ScenarioConfig(
        **{k: getattr(cluster, k) for k in cluster_log.ScenarioConfig.__dataclass_fields__}
    )
    cluster_cfg.node_factory = factory
    return cluster_log.run_seed(seed, cluster_cfg, trace=trace, digest=trace, on_start=on_start)


def run_until_settled(
    sim: Simulation, within: float, unsettled: Callable[[], str | None]
) -> str | None:
    """Run on in 50 ms steps until ``unsettled()`` is None or ``within`` seconds passed;
    returns its last answer (None: settled)."""
    deadline = sim.now + within
    why = unsettled()
    while why is not None and sim.now < deadline:
        sim.run_for(0.05)
        why = unsettled()
    return why


def run_seed(
    seed: int,
    config: PartitionsConfig | None = None,
    *,
    trace: bool = False,
    on_start: Callable[[Simulation], None] | None = None,
) -> tuple[HaResult, Simulation]:
    """Run one seed: the cluster scenario with HA nodes, then the partition checks."""
    cfg = config or PartitionsConfig()
    node_class = _NODE_CLASSES[cfg.mutant]
    promoter = PromoterConfig(retry=cfg.retry)
    layouts = Layouts(cfg.partitions)

    def factory(
        config: ClusterConfig, rng: random.Random, recovered: Mapping[bytes, bytes]
    ) -> Machine:
        return node_class(config, rng, recovered, layouts.of(config), promoter, cfg.lease)

    checker = PartitionChecker()

    def start(sim: Simulation) -> None:
        checker.attach(sim)
        if on_start is not None:
            on_start(sim)

    result, sim = run_cluster(seed, cfg.cluster, factory, trace=trace, on_start=start)
    names = result.nodes
    layout = layouts.first()
    healed_after: float | None = None
    if result.ok:
        why = run_until_settled(sim, cfg.partitions_within, lambda: settled(sim, names, layout))
        if why is not None:
            checker.fail(sim, "heal", f"partitions not settled: {why}")
        else:
            # An upper bound: the cluster scenario first waits for the log to agree and for a
            # last proposal to be applied everywhere, and only then is this first checked.
            healed_after = sim.now - cfg.cluster.heal_at
    violations = result.violations + checker.violations
    stats = {
        **result.stats,
        "failovers": checker.failovers,
        "restores": checker.restores,
        "acting_checks": checker.acting_checks,
        "takeovers": list(checker.takeovers),
        "partitions_settled_after": healed_after,
    }
    line = (
        f"seed {seed}: {'ok' if not violations else 'FAIL'} nodes={len(names)} "
        f"faults={len(result.faults)} failovers={checker.failovers} "
        f"restores={checker.restores} events={stats['events']} "
        f"wall={stats['wall_time']:.2f}s"
    )
    return HaResult(seed, not violations, violations, line, stats), sim


__all__ = [
    "MUTANTS",
    "HaResult",
    "Layouts",
    "PartitionChecker",
    "PartitionsConfig",
    "layout_for",
    "run_cluster",
    "run_seed",
    "run_until_settled",
    "settled",
]
