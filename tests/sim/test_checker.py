"""The checkers catch broken machines: unit cases, then a real broken node under the nemesis."""

from __future__ import annotations

import pytest

from nonstop.cluster.node import ClusterNode
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Notify,
    Persist,
    Persisted,
    Reply,
    Send,
    TimerFired,
)
from nonstop.sim.checker import ClusterChecker
from nonstop.sim.core import DiskConfig, Simulation
from nonstop.sim.scenarios.cluster_log import ScenarioConfig, run_seed

pytestmark = pytest.mark.timeout(180)

SAFETY = {"durability", "log-prefix", "election-safety", "log-order", "views"}


def feed(checker: ClusterChecker, sim: Simulation, node: str, actions: list[Action], event=None):
    checker.observe(sim, node, event or TimerFired(sim.now, "x"), actions)


def applied(index: int, digest: str, value=None, kind="cmd") -> Notify:
    return Notify(
        "applied", {"index": index, "term": 1, "kind": kind, "value": value, "digest": digest}
    )


def fresh() -> tuple[ClusterChecker, Simulation]:
    return ClusterChecker(), Simulation(0)


def test_two_leaders_in_one_term_is_caught():
    checker, sim = fresh()
    feed(checker, sim, "n1", [Notify("role", {"role": "leader", "term": 3})])
    feed(checker, sim, "n2", [Notify("role", {"role": "leader", "term": 4})])
    assert checker.violations == []
    feed(checker, sim, "n3", [Notify("role", {"role": "leader", "term": 3})])
    assert [v.invariant for v in checker.violations] == ["election-safety"]


def test_divergent_history_is_caught():
    checker, sim = fresh()
    feed(checker, sim, "n1", [applied(1, "aa"), applied(2, "bb")])
    feed(checker, sim, "n2", [applied(1, "aa")])
    assert checker.violations == []
    feed(checker, sim, "n2", [applied(2, "cc")])
    assert [v.invariant for v in checker.violations] == ["log-prefix"]


def test_applying_backwards_is_caught_but_a_restart_may_reapply():
    checker, sim = fresh()
    feed(checker, sim, "n1", [applied(1, "aa"), applied(2, "bb")])
    checker.on_fault(sim, "start", {"node": "n1"})  # a new incarnation starts over
    feed(checker, sim, "n1", [applied(1, "aa")])
    assert checker.violations == []
    feed(checker, sim, "n1", [applied(1, "aa")])
    assert [v.invariant for v in checker.violations] == ["log-order"]


def test_a_view_id_with_two_member_sets_is_caught():
    checker, sim = fresh()
    feed(checker, sim, "n1", [applied(1, "a", {"view_id": 1, "members": ["n1", "n2"]}, "config")])
    feed(checker, sim, "n2", [applied(5, "b", {"view_id": 1, "members": ["n1"]}, "config")])
    assert {v.invariant for v in checker.violations} == {"views"}


def test_acting_while_disabled_is_caught():
    checker, sim = fresh()
    feed(checker, sim, "n1", [Notify("quorum", {"state": "Disabled", "old": "Active"})])
    kar = Send("n2", {"k": "fd", "en": False, "b": {"t": "kar", "n": 1}})
    feed(checker, sim, "n1", [kar])
    feed(checker, sim, "n1", [Notify("proposed", {"index": 4, "term": 2})])
    request = ClientRequest(sim.now, 7, {"op": "propose", "value": 1})
    feed(checker, sim, "n1", [Reply(7, {"ok": True, "index": 4, "term": 2})], request)
    assert [v.invariant for v in checker.violations] == ["disabled-acts"] * 3
    # the right answer is accepted, and status is fine while Disabled
    checker.violations.clear()
    request = ClientRequest(sim.now, 8, {"op": "propose", "value": 1})
    feed(checker, sim, "n1", [Reply(8, {"error": "QuorumLost", "message": "x"})], request)
    status = ClientRequest(sim.now, 9, {"op": "status"})
    feed(checker, sim, "n1", [Reply(9, {"quorum": "Disabled"})], status)
    assert checker.violations == []
    assert checker.refused_while_disabled == 1


def test_an_acknowledged_value_missing_from_the_log_is_caught():
    checker, sim = fresh()
    rid = sim.request("n1", {"op": "propose", "value": "v1"})
    feed(checker, sim, "n1", [Reply(rid, {"ok": True, "index": 3, "term": 1})])
    feed(checker, sim, "n2", [applied(3, "x", {"id": [], "v": "other"})])
    assert [v.invariant for v in checker.violations] == ["durability"]
    checker2, sim2 = fresh()
    rid = sim2.request("n1", {"op": "propose", "value": "v1"})
    feed(checker2, sim2, "n1", [Reply(rid, {"ok": True, "index": 3, "term": 1})])
    checker2.final(sim2, ["n1"], {"n1": 2})
    assert {v.invariant for v in checker2.violations} == {"durability"}


class AckBeforePersist(ClusterNode):
    """A deliberately broken node: it treats every write as durable the moment it asks for it.

    The writes still go to disk, a little later -- exactly the bug of a store
    that acknowledges before fsync.  A crash in between loses votes and log
    entries the rest of the cluster already counted on.
    """

    def handle(self, event: Event) -> list[Action]:
        out: list[Action] = []
        queue = list(super().handle(event))
        while queue:
            action = queue.pop(0)
            out.append(action)
            if isinstance(action, Persist):
                queue.extend(super().handle(Persisted(event.now, action.token)))
        return out


def test_a_node_that_acks_before_persisting_is_caught_and_the_real_one_is_not():
    disk = DiskConfig(sync_min=0.05, sync_max=0.3, torn_on_crash=False)
    broken = ScenarioConfig(
        fault_kinds=("crash",),
        fault_rate=5.0,
        disk=disk,
        node_factory=AckBeforePersist,
        max_events=60_000,
    )
    correct = ScenarioConfig(fault_kinds=("crash",), fault_rate=5.0, disk=disk)
    caught = None
    for seed in range(60):
        result, _ = run_seed(seed, broken)
        found = {v.invariant for v in result.violations} & SAFETY
        if found:
            caught = (seed, found)
            break
    assert caught is not None, "the checker missed a node that acks before fsync"
    seed = caught[0]
    # the same fault schedule with the real node is fine
    assert run_seed(seed, correct)[0].ok


class IgnoresQuorum(ClusterNode):
    """A deliberately broken node: it keeps accepting work after losing quorum (D16)."""

    @property
    def enabled(self) -> bool:
        return True


def test_a_node_that_ignores_quorum_loss_is_caught_and_the_real_one_refuses_work():
    kinds = ("partition", "one_way")
    broken = ScenarioConfig(fault_kinds=kinds, node_factory=IgnoresQuorum)
    caught = None
    for seed in range(30):
        result, _ = run_seed(seed, broken)
        if any(v.invariant == "disabled-acts" for v in result.violations):
            caught = seed
            break
    assert caught is not None, "the checker missed a node acting while Disabled"
    result, _ = run_seed(caught, ScenarioConfig(fault_kinds=kinds))
    assert result.ok, result.violations
    assert result.stats["refused_while_disabled"] > 0  # the real node was asked, and refused


def test_a_skipped_or_different_liveness_view_is_caught():
    """Views (config and liveness entries) must be applied consecutively, identically."""
    checker, sim = fresh()
    v1 = {"view_id": 1, "members": ["n1", "n2"], "live": ["n1", "n2"]}
    v2 = {"view_id": 2, "members": ["n1", "n2"], "live": ["n1"]}
    v3 = {"view_id": 3, "members": ["n1", "n2"], "live": ["n1", "n2"]}
    feed(checker, sim, "n1", [applied(1, "a", v1, "config"), applied(2, "b", v2, "view")])
    assert checker.violations == []
    feed(checker, sim, "n2", [applied(1, "a", v1, "config"), applied(3, "c", v3, "view")])
    assert [v.invariant for v in checker.violations] == ["views"]  # n2 skipped view 2
    checker, sim = fresh()
    feed(checker, sim, "n1", [applied(2, "b", v2, "view")])
    feed(checker, sim, "n2", [applied(2, "b", {**v2, "live": ["n2"]}, "view")])
    assert [v.invariant for v in checker.violations] == ["views"]  # same id, other live set
