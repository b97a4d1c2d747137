"""Distributed commit with the real cluster log as its decision log (B9, issue 4).

The same bank scenario as ``test_dtx.py`` (``nonstop.sim.scenarios.dtx``), but every
node is a :class:`~nonstop.dtx.clustered.DtxClusterNode`: a Raft member whose
log holds the ``decide``/``forget`` entries, instead of the simulated
``@decisions`` node.  Faults hit the Raft members themselves (a crash or a
partition can cost the quorum and the leader), and besides the dtx invariants
the cluster checker's safety invariants (election safety, log prefix, views,
no acting while Disabled) must hold.  ``python -m nonstop.sim.dtx_campaign --seeds N
--clustered`` runs more seeds.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from test_dtx import (  # the same broken variants (tests/sim is on the path)
    SEMANTIC,
    CommitBeforeDecision,
    CommitOnTimeout,
    GuessAfterRecovery,
    YesBeforeDurable,
)

from nonstop.cluster.node import ClusterConfig
from nonstop.dtx.clustered import DtxClusterNode
from nonstop.dtx.decisions import (
    ABORT,
    COMMIT,
    DECIDED,
    FORGET,
    FORGOT,
    LOG,
    LOOKUP,
    PROPOSE,
    UNKNOWN,
)
from nonstop.runtime.interface import (
    ClientRequest,
    Persist,
    Persisted,
    Received,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.sim.dtx_campaign import CAMPAIGN, DtxOptions
from nonstop.sim.scenarios.dtx import STEPS, ScenarioConfig, run_seed
from nonstop.sim.scenarios.dtx_resource import SimResourceManager

SEEDS = int(os.environ.get("NONSTOP_DTX_CLUSTERED_SEEDS", "50"))
"""50 in ``make test``; ``make test-long`` runs 300 and ``make sim`` runs
``nonstop.sim.dtx_campaign --clustered`` on ``SEEDS`` (1,000 by default)."""
CLUSTERED = ScenarioConfig(clustered=True)


@pytest.mark.timeout(240)
def test_seeds_of_transfers_over_the_raft_decision_log_keep_every_invariant(run_clean):
    started = time.perf_counter()
    outcomes = run_clean(CAMPAIGN, range(SEEDS), DtxOptions(clustered=True))
    elapsed = time.perf_counter() - started
    assert {o.step for o in outcomes} == set(STEPS)
    paths = {k: sum(dict(o.counters)[k] for o in outcomes) for k in dict(outcomes[0].counters)}
    assert paths["committed"] > SEEDS * 5 and paths["audits"] > 0
    assert paths["unavailable"] > 0
    assert paths["asked_then_commit"] > 0 and paths["asked_then_abort"] > 0
    print(f"\n{SEEDS} clustered seeds in {elapsed:.1f}s; paths: {CAMPAIGN.paths(outcomes)}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("step", STEPS[1:])
def test_crash_at_each_step_over_the_raft_decision_log(step):
    """Forced schedules: the coordinator (or a participant) dies at ``step``, 8 seeds each."""
    fired = 0
    failed = []
    for seed in range(8):
        result, _ = run_seed(seed, CLUSTERED, step=step)
        fired += result.stats["crash_fired"] is not None
        if not result.ok:
            failed.append(f"seed {seed}: {result.violations[0]}")
    assert not failed, "\n".join(failed)
    assert fired >= 5, f"the crash at {step} fired on only {fired} of 8 seeds"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("node_class", "step"),
    [
        (CommitOnTimeout, "after_some_prepares"),
        (CommitBeforeDecision, None),
        (GuessAfterRecovery, "after_some_prepares"),
        (YesBeforeDurable, None),
    ],
)
def test_broken_variants_are_caught_over_the_raft_decision_log(node_class, step):
    """The invariants still bite with the real log (the mutations of ``test_dtx.py``)."""
    cfg = ScenarioConfig(node_class=node_class, clustered=True)
    for seed in range(100):
        result, _ = run_seed(seed, cfg, step=step)
        if any(v.invariant in SEMANTIC for v in result.violations):
            return
    pytest.fail(f"{node_class.__name__} was not caught in 100 clustered seeds")


def test_a_clustered_seed_replays_identically():
    a, sim_a = run_seed(5, CLUSTERED, trace=True)
    b, sim_b = run_seed(5, CLUSTERED, trace=True)
    assert sim_a.trace_digest == sim_b.trace_digest
    assert a.summary().split(" wall=")[0] == b.summary().split(" wall=")[0]


# ------------------------------------------------------- the composition, by hand
def _single() -> DtxClusterNode:
    cfg = ClusterConfig(name="a", address="sim://a", store_timestamp=1, members=("a",))
    return DtxClusterNode(cfg, SimResourceManager({"x": 5}, {}), random.Random(1), {})


def _cluster_run(node: DtxClusterNode, actions: list, now: float) -> list:
    """Carry out the cluster's Persists at once (a one-node log commits on its own fsync)."""
    out, queue = [], list(actions)
    while queue:
        action = queue.pop(0)
        if isinstance(action, Persist):
            queue += node.cluster.handle(Persisted(now, action.token))
        else:
            out.append(action)
    return out


def _leader(node: DtxClusterNode) -> float:
    """Drive a one-node cluster (through the composition) until it leads; return the time."""
    now, queue = 0.0, list(node.handle(Started(0.0)))
    while node.cluster.raft.role != "leader" and now < 5:
        timers = []
        while queue:
            action = queue.pop(0)
            assert not (isinstance(action, Send) and action.to == LOG)
            if isinstance(action, Persist):
                queue += node.handle(Persisted(now, action.token))
            elif isinstance(action, SetTimer):
                timers.append(action.name)
        now += 0.5
        for name in timers:
            queue += node.handle(TimerFired(now, name))
    assert node.cluster.raft.role == "leader"
    return now


def test_the_decision_table_in_the_log_answers_first_writer_wins_and_floors():
    node = _single()
    now = _leader(node)
    log = node.decisions

    def ask(payload):
        _cluster_run(node, log.request(now, payload), now)
        return log.take_answers()

    assert ask({"t": PROPOSE, "g": "b.1", "o": ABORT, "n": []}) == [
        {"t": DECIDED, "g": "b.1", "o": ABORT}
    ]
    # First writer wins: a contrary proposal gets the table's outcome.
    assert ask({"t": PROPOSE, "g": "b.1", "o": COMMIT, "n": []}) == [
        {"t": DECIDED, "g": "b.1", "o": ABORT}
    ]
    assert ask({"t": LOOKUP, "g": "b.2"}) == [{"t": UNKNOWN, "g": "b.2", "forgotten": False}]
    # Only a coordinator moves its own floor; its gtids below the floor are then forgotten.
    refused = log.request(now, {"t": FORGET, "c": "b", "f": 5})
    assert [type(a).__name__ for a in refused] == ["Log"]
    assert ask({"t": FORGET, "c": "a", "f": 3}) == [{"t": FORGOT, "c": "a", "f": 3}]
    assert ask({"t": PROPOSE, "g": "a.2", "o": COMMIT, "n": []}) == [
        {"t": UNKNOWN, "g": "a.2", "forgotten": True}
    ]
    assert log.table.decisions == {"b.1": ABORT} and log.table.floors == {"a": 3}


def test_persist_tokens_of_the_two_components_do_not_collide():
    node = _single()
    now = _leader(node)
    run = {"op": "run", "branches": {"a": [["add", "x", -1]]}}
    actions = node.handle(ClientRequest(now, 1, run))
    dtx_tokens = [a.token for a in actions if isinstance(a, Persist)]
    assert dtx_tokens and all(t % 2 == 1 for t in dtx_tokens)
    cluster_tokens = [
        a.token
        for a in node.handle(ClientRequest(now, 2, {"op": "propose", "value": 1}))
        if isinstance(a, Persist)
    ]
    assert cluster_tokens and all(t % 2 == 0 for t in cluster_tokens)


def test_a_peer_cannot_forward_a_request_in_another_nodes_name():
    node = _single()
    _leader(node)
    forged = {"k": "dl", "en": True, "b": {"dl": "forget", "c": "z", "f": 9, "r": ["z", 1]}}
    actions = node.handle(Received(9.0, "y", forged))
    assert not any(isinstance(a, Persist) for a in actions)


def test_decisions_come_back_from_snapshots_in_the_layout_clusters_already_wrote():
    """The table's snapshot value is ``{"d": decisions, "f": floors}`` under ``"dl"``: the
    layout ClusterNode wrote when it hosted the table itself, so existing stores load."""
    import msgpack

    from nonstop.cluster.raft import Entry

    node = _single()
    _leader(node)
    old = {"digest": b"\x01" * 16, "views": [], "dl": {"d": {"b.4": COMMIT}, "f": {"a": 7}}}
    snap = {"state": msgpack.packb(old, use_bin_type=True), "members": ["a"], "view_id": 1}
    node.cluster._apply([Entry(40, 1, "snapshot", snap)])
    assert node.decisions.table.decisions == {"b.4": COMMIT}
    assert node.decisions.table.floors == {"a": 7}
    assert node.decisions.snapshot() == old["dl"]


def test_a_restarted_node_rebuilds_its_decisions_from_its_snapshot_and_log():
    cfg = ClusterConfig(
        name="a", address="sim://a", store_timestamp=1, members=("a",), snapshot_every=3
    )
    disk: dict[bytes, bytes] = {}
    node = DtxClusterNode(cfg, SimResourceManager({"x": 5}, {}), random.Random(1), {})

    def run(actions: list, now: float, *, cluster: bool = False) -> None:
        """Carry out Persists at once (a one-node log commits on its own fsync).

        ``cluster``: the actions came from the cluster node itself, whose tokens the
        composition did not rename.
        """
        handle = node.cluster.handle if cluster else node.handle
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            if isinstance(action, Persist):
                for key, value in action.writes:
                    if value is None:
                        disk.pop(key, None)
                    else:
                        disk[key] = value
                queue += handle(Persisted(now, action.token))

    now = 0.0
    run(node.handle(Started(now)), now)
    while node.cluster.raft.role != "leader":
        now += 0.5
        run(node.handle(TimerFired(now, "raft.election")), now)
    for seq in range(1, 8):
        payload = {"t": PROPOSE, "g": f"b.{seq}", "o": COMMIT if seq % 2 else ABORT, "n": []}
        run(node.decisions.request(now, payload), now, cluster=True)
    run(node.decisions.request(now, {"t": FORGET, "c": "a", "f": 2}), now, cluster=True)
    expected = dict(node.decisions.table.decisions)
    assert len(expected) == 7 and node.cluster.raft.snapshot_index > 0
    node = DtxClusterNode(cfg, SimResourceManager({"x": 5}, disk), random.Random(2), dict(disk))
    run(node.handle(Started(now + 1)), now + 1)
    while node.cluster.raft.role != "leader":
        now += 0.5
        run(node.handle(TimerFired(now, "raft.election")), now)
    assert node.decisions.table.decisions == expected
    assert node.decisions.table.floors == {"a": 2}
