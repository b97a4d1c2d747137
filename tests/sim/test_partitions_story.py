"""One failover and one restore, step by step, on three HA cluster nodes (ha.md sections 6-8).

The random campaign (test_partitions.py) covers the combinations; this test
tells the story of D8 and D9 with the exact states a reader expects: define
and enable on every node, the active node crashes, one committed entry
promotes the replica with epoch + 1 and drops the dead node, the new active
acts only after the old lease ran out, the node returns, is restored and is
active again by priority.
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
P = PartitionDef("P", (("n1", SYNC), ("n2", SYNC), ("n3", SYNC)), "static")
LEASE = LeaseConfig(lease=0.6, drift=0.0)


def build(sim_cluster: Any) -> tuple[Simulation, list[tuple[float, str, dict[str, Any]]]]:
    sim = Simulation(7)
    changes: list[tuple[float, str, dict[str, Any]]] = []

    def watch(sim: Simulation, node: str, event: Event, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Notify) and a.kind == "pt.changed" and node == "n3":
                changes.append((sim.now, a.data["kind"], dict(a.data)))

    sim.observers.append(watch)
    sim_cluster.add(sim, NAMES, make_node)
    return sim, changes


def make_node(cfg: ClusterConfig, rng: random.Random, rec: Mapping[bytes, bytes]) -> HaClusterNode:
    return HaClusterNode(cfg, rng, rec, [P], PromoterConfig(retry=0.3), LEASE)


def ha(sim: Simulation, name: str) -> HaClusterNode:
    m = sim.machine(name)
    assert isinstance(m, HaClusterNode)
    return m


def acting(sim: Simulation) -> list[str]:
    return [n for n in NAMES if sim.nodes[n].up and ha(sim, n).acting(sim.now, "P")]


def test_failover_then_restore_by_priority(sim_cluster: Any) -> None:
    sim, changes = build(sim_cluster)
    sim.run_until(3.0)
    part = ha(sim, "n3").partition_table.get("P")
    assert part is not None
    assert (part.state, part.current, part.copying) == ("Active", NAMES, [])
    first = part.active
    assert first == "n1"  # restored to priority even if another node enabled first
    assert acting(sim) == ["n1"]
    epoch = part.epoch
    status = ha(sim, "n2").status()["partitions"][0]
    assert status["active"] == "n1" and status["status"]["n2"] == "LocalEnabled"

    sim.crash("n1")
    crashed_at = sim.now
    while sim.now < crashed_at + 3.0 and acting(sim) != ["n2"]:
        sim.run_for(0.01)
    took = sim.now - crashed_at
    print(f"takeover {took:.3f}s")
    part = ha(sim, "n3").partition_table.get("P")
    assert part is not None
    assert (part.active, part.current, part.epoch) == ("n2", ["n2", "n3"], epoch + 1)
    failover = [c for c in changes if c[1] == "failover"]
    assert len(failover) == 1  # one committed entry
    # Not before the lease n1 may still have held: 0.6 s from its last renewal.
    assert 0.4 < took < 1.5
    assert ha(sim, "n2").partition_table.leases["n1"] == 1

    sim.restart("n1")
    sim.run_for(3.0)
    part = ha(sim, "n3").partition_table.get("P")
    assert part is not None
    assert (part.active, part.current, part.copying, part.state) == ("n1", NAMES, [], "Active")
    kinds = [c[1] for c in changes if c[0] > crashed_at]
    assert kinds[-2:] == ["enable", "restored"]  # D9: enable (copying), restored (handover)
    sim.run_for(1.0)
    assert acting(sim) == ["n1"]
    tables = {ha(sim, n).partition_table.digest() for n in NAMES}
    assert len(tables) == 1
