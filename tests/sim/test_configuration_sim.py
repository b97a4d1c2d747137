"""The configuration table on simulated nodes: one state everywhere, kept in snapshots.

Three :class:`ConfiguredClusterNode` machines on the simulator (seeded, lossy
network, disks that lose unsynced writes on a crash).  Changes go to a
follower; every node applies the same table; a node crashed and restarted
rebuilds it from its snapshot (taken every 4 entries) and the entries after
it, and its notifiers hear the active versions again.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from nonstop.cluster.node import ClusterConfig
from nonstop.configuration.cluster_node import ConfiguredClusterNode
from nonstop.configuration.types import Change, ConfigTypes, Veto
from nonstop.ha.failover import PromoterConfig
from nonstop.sim.core import Simulation

pytestmark = pytest.mark.timeout(60)

NAMES = ["n1", "n2", "n3"]


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    max: int


def build(sim_cluster: Any, heard: dict[str, list[tuple[str, str]]]) -> Simulation:
    sim = Simulation(7)
    for name in NAMES:
        types = ConfigTypes()
        limits = types.declare("limits", Limits)

        @limits.audit
        def small(change: Change) -> None:
            if isinstance(change.data, Limits) and change.data.max > 100:
                raise Veto(f"max {change.data.max} is over 100")

        @limits.notifier
        def hear(change: Change, name: str = name) -> None:
            heard.setdefault(name, []).append((change.kind, change.version))

        cfg = sim_cluster.config(name, NAMES, NAMES, snapshot_every=4)
        sim.add_node(name, functools.partial(make_node, cfg, types))
    return sim


def make_node(
    cfg: ClusterConfig, types: ConfigTypes, rng: random.Random, rec: Mapping[bytes, bytes]
) -> ConfiguredClusterNode:
    return ConfiguredClusterNode(cfg, rng, rec, promoter=PromoterConfig(retry=0.3), types=types)


def node(sim: Simulation, name: str) -> ConfiguredClusterNode:
    m = sim.machine(name)
    assert isinstance(m, ConfiguredClusterNode)
    return m


def ask(sim: Simulation, name: str, payload: dict[str, Any]) -> Any:
    rid = sim.request(name, {"op": "config", **payload})
    sim.run_for(3.0, stop=lambda: sim.requests[rid].replied_at is not None)
    return sim.requests[rid].reply


def limits_file(version: str, value: int) -> dict[str, str]:
    text = f'type = "limits"\nname = "orders"\nversion = "{version}"\nmax = {value}\n'
    return {"file": f"orders-{version}.toml", "text": text}


def test_every_node_applies_the_same_table_and_a_restart_keeps_it(sim_cluster: Any) -> None:
    heard: dict[str, list[tuple[str, str]]] = {}
    sim = build(sim_cluster, heard)
    sim.run_until(3.0)
    follower = next(n for n in NAMES if node(sim, n).raft.role != "leader")
    for version, value in (("1", 10), ("2", 20), ("3", 30)):
        reply = ask(sim, follower, {"do": "load", "files": [limits_file(version, value)]})
        assert reply["ok"], reply
    assert ask(
        sim, follower, {"do": "activate", "type": "limits", "name": "orders", "version": "1"}
    )["ok"]
    replaced = ask(
        sim, NAMES[0], {"do": "activate", "type": "limits", "name": "orders", "version": "2"}
    )
    assert replaced["changes"][0]["kind"] == "replace", replaced
    veto = ask(sim, follower, {"do": "load", "files": [limits_file("4", 500)]})
    assert veto == {
        "error": "Rejected",
        "message": "load of limits/orders version 4 vetoed by the audit: max 500 is over 100",
    }
    sim.run_for(1.0)
    tables = {n: node(sim, n).config_table.rows() for n in NAMES}
    assert all(t == tables["n1"] for t in tables.values())
    assert [(r["version"], r["state"]) for r in tables["n1"]] == [
        ("1", "Inactive"),
        ("2", "Active"),
        ("3", "Inactive"),
    ]
    assert all(("replace", "2") in heard[n] for n in NAMES)
    assert node(sim, "n3").snapshots > 0  # the table went through a snapshot

    heard.clear()
    sim.crash("n3")
    sim.run_for(0.5)
    sim.start("n3")
    sim.run_for(3.0)
    assert node(sim, "n3").config_table.rows() == tables["n1"]
    assert ("activate", "2") in heard["n3"]  # its notifiers heard the active version again
