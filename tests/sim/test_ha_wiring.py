"""What the real node adds around the HA cluster node, on three simulated nodes (ha.md 11a).

* ``pt.acting`` notifications follow :meth:`HaClusterNode.acting` exactly: after
  every event, the last set a node announced is the set it acts for (the data
  plane's partition view is built from them);
* operators' ``{"op": "partition"}`` requests are answered once the entry is
  applied, and a rejection comes back with the table's reason;
* the status at a request's time reports ``acting`` with ``now``/``acting_until``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from nonstop.cluster.node import ClusterConfig
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.failover import PromoterConfig
from nonstop.ha.lease import LeaseConfig
from nonstop.ha.policies import SYNC, PartitionDef
from nonstop.runtime.interface import Action, Event, Notify
from nonstop.sim.core import Simulation

pytestmark = pytest.mark.timeout(60)

NAMES = ["n1", "n2", "n3"]
LAYOUT = [
    PartitionDef(f"P{i}", ((NAMES[i], SYNC), (NAMES[(i + 1) % 3], SYNC)), "static")
    for i in range(3)
]


def build(
    sim_cluster: Any, seed: int = 3
) -> tuple[Simulation, list[tuple[str, float, frozenset[str]]]]:
    sim = Simulation(seed)
    announced: list[tuple[str, float, frozenset[str]]] = []
    mismatches: list[Any] = []

    def watch(sim: Simulation, node: str, event: Event, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Notify) and a.kind == "pt.acting":
                announced.append((node, sim.now, frozenset(a.data["acting"])))
        machine = sim.machine(node)
        if isinstance(machine, HaClusterNode):
            truth = frozenset(
                p for p in machine.partition_table.partitions if machine.acting(sim.now, p)
            )
            if truth != machine.acting_set:
                mismatches.append((node, sim.now, sorted(truth), sorted(machine.acting_set)))

    sim.observers.append(watch)
    sim.mismatches = mismatches  # type: ignore[attr-defined]
    sim_cluster.add(sim, NAMES, make_node)
    return sim, announced


def make_node(cfg: ClusterConfig, rng: random.Random, rec: Mapping[bytes, bytes]) -> HaClusterNode:
    return HaClusterNode(cfg, rng, rec, LAYOUT, PromoterConfig(retry=0.3), LeaseConfig(0.6, 0.0))


def ha(sim: Simulation, name: str) -> HaClusterNode:
    m = sim.machine(name)
    assert isinstance(m, HaClusterNode)
    return m


def ask(sim: Simulation, node: str, payload: dict[str, Any], within: float = 3.0) -> Any:
    rid = sim.request(node, payload)
    sim.run_for(within, stop=lambda: sim.requests[rid].replied_at is not None)
    return sim.requests[rid].reply


def test_acting_announcements_follow_the_leases_through_a_crash(sim_cluster: Any) -> None:
    sim, announced = build(sim_cluster)
    sim.run_until(3.0)
    assert {n: ha(sim, n).acting_set for n in NAMES} == {
        "n1": {"P0"},
        "n2": {"P1"},
        "n3": {"P2"},
    }
    sim.crash("n1")
    sim.run_for(3.0)
    assert ha(sim, "n2").acting_set == {"P0", "P1"}
    # The node announced exactly what it acts for after every event it handled: the
    # wake-up timer covers the end of the wait for the old lease.
    mismatches = sim.mismatches  # type: ignore[attr-defined]
    # A lease lapsing by time alone is seen at the node's next event: allow none other.
    assert not [m for m in mismatches if set(m[2]) - set(m[3])], mismatches[:5]
    n2 = [(t, a) for n, t, a in announced if n == "n2"]
    assert n2[-1][1] == {"P0", "P1"}
    took_over = next(t for t, a in n2 if "P0" in a)
    assert took_over > 3.0 + 0.6  # not before the lease n1 may have held


def test_operator_define_enable_disable_and_rejections(sim_cluster: Any) -> None:
    sim, _ = build(sim_cluster)
    sim.run_until(3.0)
    bad = ask(sim, "n2", {"op": "partition", "do": "define", "p": "X", "nodes": [["n9", SYNC]]})
    assert bad["error"] == "Rejected" and "'n9'" in bad["message"], bad
    style = ask(sim, "n2", {"op": "partition", "do": "define", "p": "X", "nodes": [["n1", "x"]]})
    assert style["error"] == "Rejected" and "style 'x'" in style["message"], style
    ok = ask(
        sim,
        "n2",
        {"op": "partition", "do": "define", "p": "X", "nodes": [["n2", SYNC], ["n3", SYNC]]},
    )
    assert ok["ok"] and ok["partition"]["state"] == "Initial", ok
    clash = ask(
        sim,
        "n1",
        {"op": "partition", "do": "enable", "p": "nope"},
    )
    assert clash["error"] == "Rejected" and "'nope' is not defined" in clash["message"]
    on2 = ask(sim, "n2", {"op": "partition", "do": "enable", "p": "X"})
    assert on2["partition"]["active"] == "n2" and on2["partition"]["state"] == "Active"
    on3 = ask(sim, "n3", {"op": "partition", "do": "enable", "p": "X"})
    assert on3["ok"]
    sim.run_for(1.0)
    part = ha(sim, "n1").partition_table.get("X")
    assert part is not None and part.current == ["n2", "n3"] and part.state == "Active"
    # Disabling the active hands it to the next in-sync node; the last copy is refused.
    off2 = ask(sim, "n2", {"op": "partition", "do": "disable", "p": "X"})
    assert off2["partition"]["active"] == "n3"
    last = ask(sim, "n3", {"op": "partition", "do": "disable", "p": "X"})
    assert last["error"] == "Rejected" and "last in-sync copy" in last["message"], last
    refused = ask(sim, "n2", {"op": "partition", "do": "disable", "p": "nope"})
    assert refused["error"] == "Rejected"
    assert ha(sim, "n2").restorer.held == {"X"}  # a refused disable holds nothing off
    # A configured partition an operator disabled stays disabled (the restorer holds off).
    off = ask(sim, "n2", {"op": "partition", "do": "disable", "p": "P1"})
    assert off["ok"] and off["partition"]["active"] == "n3"
    sim.run_for(2.0)
    p1 = ha(sim, "n1").partition_table.get("P1")
    assert p1 is not None and p1.current == ["n3"] and p1.status["n2"] == "LocalDisabled"
    back = ask(sim, "n2", {"op": "partition", "do": "enable", "p": "P1"})
    assert back["ok"]
    sim.run_for(2.0)
    p1 = ha(sim, "n1").partition_table.get("P1")
    assert p1 is not None and p1.active == "n2" and p1.current == ["n2", "n3"]


def test_status_reports_acting_at_the_request_time(sim_cluster: Any) -> None:
    sim, _ = build(sim_cluster)
    sim.run_until(3.0)
    status = ask(sim, "n3", {"op": "status"})
    assert status["acting"] == ["P2"]
    assert status["now"] <= status["acting_until"] <= status["now"] + 0.6
    names = [p["name"] for p in status["partitions"]]
    assert names == ["P0", "P1", "P2"]
    assert all(isinstance(p["location"], int) for p in status["partitions"])


def test_a_node_without_quorum_shows_its_partitions_unavailable_and_acts_for_none(
    sim_cluster: Any,
) -> None:
    sim, _ = build(sim_cluster)
    sim.run_until(3.0)
    sim.crash("n1")
    sim.crash("n2")
    sim.run_for(3.0)
    status = ask(sim, "n3", {"op": "status"})
    assert status["quorum"] == "Disabled"
    assert status["acting"] == []
    assert {p["state"] for p in status["partitions"]} == {"Unavailable"}
    assert "Active" in {p["table_state"] for p in status["partitions"]}
