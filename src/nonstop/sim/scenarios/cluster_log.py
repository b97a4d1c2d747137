"""The cluster scenario: ClusterNodes under a nemesis, a client workload, checkers.

One seed = one run of :func:`run_seed`:

1. draw the shape from the seed: 3-5 nodes, network loss/duplication/reorder
   rates, sometimes a node that joins later (Raft AddServer through its own
   join request), sometimes weighted votes;
2. start the founders, let them elect a leader, run a client that proposes
   unique values (following ``NotLeader`` hints) and asks for ``status``;
3. the nemesis crashes, pauses, partitions (both ways and one way) and drops
   messages until ``heal_at``; then heals everything;
4. liveness: within ``converge_within`` virtual seconds every node must be up
   with quorum Active, agree on one leader and one view whose members and live
   set are every node, and a last proposal must commit and be applied by every
   node;
5. the checkers (:mod:`nonstop.sim.checker`) must have seen no violation.

The skeleton shared with the other scenarios (the world drawn from the seed,
the nemesis, the run's guard and counters) is :mod:`nonstop.sim.scenario_base`.

Everything is cheap on purpose (a few virtual seconds, short timeouts scaled
down from the defaults) so that a campaign runs thousands of seeds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.cluster.failure import DetectorConfig
from nonstop.cluster.node import ClusterConfig, ClusterNode
from nonstop.cluster.raft import ROLE_LEADER, RaftConfig
from nonstop.runtime.interface import Machine, NodeId
from nonstop.sim import nemesis
from nonstop.sim.checker import ClusterChecker, Violation
from nonstop.sim.core import Simulation
from nonstop.sim.scenario_base import (
    CommonConfig,
    World,
    install_faults,
    new_world,
    repeat,
    run_stats,
    runaway_fails,
)

NodeFactory = Callable[[ClusterConfig, random.Random, Mapping[bytes, bytes]], Machine]


@dataclass(slots=True)
class ScenarioConfig(CommonConfig):
    """Knobs of a cluster run (defaults: the campaign's; the shared ones in the base)."""

    converge_within: float = 12.0
    joiner_probability: float = 0.3
    weights_probability: float = 0.2
    membership_probability: float = 0.25
    """Probability that an operator removes a founder (``leave``) and adds it back (``join``)."""
    client_interval: float = 0.05
    detector: DetectorConfig = field(
        default_factory=lambda: DetectorConfig(keepalive_interval=0.1, non_response_timeout=0.4)
    )
    raft: RaftConfig | None = None
    """Fixed Raft timing; default: election timeout drawn per seed (0.3, 0.5 or 1.0 s)."""
    snapshot_every: int = 16
    node_factory: NodeFactory | None = None
    """Build a node's machine; default ClusterNode.  Tests plug broken machines in here."""


@dataclass(slots=True)
class _Client:
    """The workload's client: the leader it believes in, how many requests it sent."""

    leader: NodeId
    sent: int = 0


@dataclass(slots=True)
class RunResult:
    """The outcome of one seed."""

    seed: int
    ok: bool
    violations: list[Violation]
    faults: list[nemesis.Fault]
    nodes: list[NodeId]
    digest: str
    stats: dict[str, Any]

    def summary(self) -> str:
        status = "ok" if self.ok else "FAIL"
        s = self.stats
        return (
            f"seed {self.seed}: {status} nodes={len(self.nodes)} faults={len(self.faults)} "
            f"events={s['events']} msgs={s['messages']} acked={s['acked']} "
            f"virtual={s['virtual_time']:.2f}s wall={s['wall_time']:.3f}s"
        )


def run_seed(
    seed: int,
    config: ScenarioConfig | None = None,
    *,
    trace: bool = False,
    digest: bool = True,
    on_start: Callable[[Simulation], None] | None = None,
) -> tuple[RunResult, Simulation]:
    """Run one seed of the cluster scenario; returns the result and the simulation.

    ``on_start(sim)`` is called before anything runs (to attach observers).
    """
    cfg = config or ScenarioConfig()
    world = new_world(seed, cfg, sync_max=(0.004, 0.02, 0.1), trace=trace, digest=digest)
    rng, sim, names = world.rng, world.sim, world.names
    joiner = names[-1] if rng.random() < cfg.joiner_probability else None
    founders = [x for x in names if x != joiner]
    quorum: dict[str, Any] = {"mode": "majority"}
    if rng.random() < cfg.weights_probability:
        quorum["weights"] = {x: rng.choice([1, 1, 2]) for x in names}
    raft = cfg.raft or RaftConfig(
        election_timeout=rng.choice([0.3, 0.5, 0.5, 1.0]), heartbeat_interval=0.05
    )
    addresses = {x: f"sim://{x}" for x in names}
    timestamps = {x: 1_700_000_000 + i for i, x in enumerate(names)}
    factory = cfg.node_factory or ClusterNode

    def make(name: NodeId) -> Callable[[random.Random, Mapping[bytes, bytes]], Machine]:
        node_cfg = ClusterConfig(
            name=name,
            address=addresses[name],
            store_timestamp=timestamps[name],
            members=tuple(founders) if name != joiner else (),
            static_peers={x: a for x, a in addresses.items() if x != name},
            detector=cfg.detector,
            quorum=quorum,
            raft=raft,
            snapshot_every=cfg.snapshot_every,
        )
        return lambda node_rng, recovered: factory(node_cfg, node_rng, recovered)

    checker = ClusterChecker().attach(sim)
    if on_start is not None:
        on_start(sim)
    for name in founders:
        sim.add_node(name, make(name))
    if joiner is not None:
        sim.add_node(joiner, make(joiner), start=False)
        sim.at(rng.uniform(0.5, cfg.heal_at), lambda: sim.start(joiner))

    faults = install_faults(world, names, cfg)

    _schedule_workload(world, founders, addresses, cfg)

    # ------------------------------------------------------------ run
    converged_after: float | None = None
    with runaway_fails(checker, sim):
        converged_after = _drive(sim, checker, names, cfg)
    applied = {x: m.applied_index for x in names if isinstance(m := sim.machine(x), ClusterNode)}
    converged = not any(v.invariant in ("liveness", "runaway") for v in checker.violations)
    checker.final(sim, [x for x in names if sim.nodes[x].up], applied, converged=converged)
    violations = list(checker.violations)
    stats = run_stats(
        world,
        dropped=sim.messages_dropped,
        acked=len(checker.acked),
        leaders=len(checker.leaders),
        refused_while_disabled=checker.refused_while_disabled,
        crashes=sum(node.crashes for node in sim.nodes.values()),
        converged_after=converged_after,
    )
    result = RunResult(seed, not violations, violations, faults, names, sim.trace_digest, stats)
    return result, sim


def _schedule_workload(
    world: World, founders: list[NodeId], addresses: dict[NodeId, str], cfg: ScenarioConfig
) -> None:
    """A client proposing unique values (following ``NotLeader`` hints, sometimes asking for
    ``status``) until the heal; sometimes an operator removes a founder and adds it back."""
    rng, sim, names = world.rng, world.sim, world.names
    client = _Client(leader=founders[0])

    def send_one() -> None:
        up = [x for x in names if sim.nodes[x].up]
        if not up:
            return
        target = client.leader if rng.random() < 0.7 else rng.choice(names)
        client.sent += 1
        if rng.random() < 0.1:
            sim.request(target, {"op": "status"})
        else:
            sim.request(target, {"op": "propose", "value": f"v{client.sent}"})

    def learn() -> None:
        for record in sim.requests.values():
            reply = record.reply
            if isinstance(reply, dict) and reply.get("error") == "NotLeader":
                if reply.get("leader"):
                    client.leader = reply["leader"]
            elif isinstance(reply, dict) and reply.get("ok"):
                client.leader = record.node

    if rng.random() < cfg.membership_probability:
        victim = rng.choice(founders)
        t_leave = rng.uniform(cfg.fault_start, cfg.heal_at - 0.5)
        t_join = t_leave + rng.uniform(0.3, 1.5)

        def leave() -> None:
            sim.request(client.leader, {"op": "leave", "name": victim})

        def join() -> None:
            sim.request(client.leader, {"op": "join", "name": victim, "address": addresses[victim]})

        sim.at(t_leave, leave)
        sim.at(t_join, join)

    repeat(sim, 0.3, cfg.heal_at, cfg.client_interval, send_one, learn)


def _drive(
    sim: Simulation, checker: ClusterChecker, names: list[NodeId], cfg: ScenarioConfig
) -> float | None:
    """Run the fault phase, then demand convergence and one more commit everywhere.

    Returns how long after the heal the cluster agreed (None if it never did).
    """
    sim.run_until(cfg.heal_at)
    deadline = cfg.heal_at + cfg.converge_within

    def converged() -> bool:
        return _agreement(sim, names) is None

    done = False
    next_retry = sim.now + 1.0
    while sim.now < deadline and not done:
        sim.run_for(0.05)
        done = converged()
        if not done and sim.now >= next_retry:
            # The operator notices a node missing from the view and adds it (again).
            next_retry = sim.now + 1.0
            leader = _leader_of(sim, names)
            lm = sim.machine(leader) if leader else None
            if leader is not None and isinstance(lm, ClusterNode):
                for name in names:
                    if name not in lm.view_members and sim.nodes[name].up:
                        address = f"sim://{name}"
                        sim.request(leader, {"op": "join", "name": name, "address": address})
    if not done:
        checker.fail(sim, "liveness", f"no agreement after the heal: {_agreement(sim, names)}")
        return None
    agreed_after = sim.now - cfg.heal_at
    # One more proposal through the agreed leader must commit everywhere.
    leader = _leader_of(sim, names)
    assert leader is not None
    rid = sim.request(leader, {"op": "propose", "value": "final"})
    finished = False
    while sim.now < deadline and not finished:
        sim.run_for(0.05)
        reply = sim.requests[rid].reply
        if isinstance(reply, dict) and reply.get("error") and _agreement(sim, names) is None:
            # Refused or lost (leadership moved right after the agreement): a client retries
            # through the leader everyone now agrees on.
            leader = _leader_of(sim, names)
            assert leader is not None
            rid = sim.request(leader, {"op": "propose", "value": "final"})
            continue
        finished = (
            isinstance(reply, dict)
            and reply.get("ok") is True
            and _all_applied(sim, names, int(reply["index"]))
        )
    if not finished:
        checker.fail(
            sim,
            "liveness",
            f"final proposal on {leader} not applied everywhere: {sim.requests[rid].reply!r}",
        )
    return agreed_after


def _leader_of(sim: Simulation, names: list[NodeId]) -> NodeId | None:
    for name in names:
        m = sim.machine(name)
        if isinstance(m, ClusterNode) and m.raft.role == ROLE_LEADER:
            return name
    return None


def _agreement(sim: Simulation, names: list[NodeId]) -> str | None:
    """None when every node is up, Active, and agrees on leader and view; else why not."""
    leaders: set[Any] = set()
    views: set[int] = set()
    for name in names:
        node = sim.nodes[name]
        m = node.machine
        if not node.up or node.paused or not isinstance(m, ClusterNode):
            return f"{name} is not running"
        if m.quorum_state != "Active":
            return f"{name} quorum is {m.quorum_state}"
        leaders.add(m.raft.leader)
        views.add(m.view)
    if len(leaders) != 1 or None in leaders:
        return f"leaders {sorted(map(str, leaders))}"
    if len(views) != 1:
        return f"views {sorted(views)}"
    leader = next(iter(leaders))
    lm = sim.machine(leader)
    if not isinstance(lm, ClusterNode) or lm.raft.role != ROLE_LEADER:
        return f"{leader} is named leader but is not"
    if set(lm.raft.members) != set(lm.raft.view_members):
        return f"membership change in flight on {leader}"
    if sorted(lm.view_members) != sorted(names):
        return f"view members {lm.view_members} != {names}"
    for name in names:
        m = sim.machine(name)
        if isinstance(m, ClusterNode) and sorted(m.view_live) != sorted(names):
            return f"view {m.view} on {name} has live {m.view_live}, not every node"
    return None


def _all_applied(sim: Simulation, names: list[NodeId], index: int) -> bool:
    for name in names:
        m = sim.machine(name)
        if not isinstance(m, ClusterNode) or m.applied_index < index:
            return False
    return True
