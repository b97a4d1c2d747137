"""The ``[ha]`` configuration of a node, its layout, and the data plane's partition view."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from nonstop.dataplane.service import partition_views
from nonstop.dataplane.view import ClusterView
from nonstop.ha.partition_table import Partition, PartitionTable, partition_location
from nonstop.node.config import ConfigError, from_mapping
from nonstop.node.machine import ha_cluster_factory


def layout_of(settings: dict[str, Any]) -> list[Any]:
    factory = ha_cluster_factory(from_mapping(settings))
    return list(factory.keywords["layout"])  # type: ignore[attr-defined]


def test_default_is_one_dynamic_policy_of_16_partitions_with_one_sync_replica() -> None:
    cfg = from_mapping({"members": ["A", "B", "C"]})
    dist = cfg.ha.distribution(cfg.members)
    assert list(dist.policies) == ["default"]
    layout = layout_of({"members": ["A", "B", "C"]})
    assert len(layout) == 16
    assert all(len(p.nodes) == 2 and {s for _, s in p.nodes} == {"sync"} for p in layout)
    firsts = [p.nodes[0][0] for p in layout]
    assert {n: firsts.count(n) for n in "ABC"} == {"A": 6, "B": 5, "C": 5}
    lease = ha_cluster_factory(cfg).keywords["lease"]  # type: ignore[attr-defined]
    assert (lease.lease, lease.drift) == (0.6, 0.05)


def test_static_policy_binding_and_settings() -> None:
    settings = {
        "members": ["A", "B", "C"],
        "ha": {
            # The table (not the data) may name async replicas: routing by node, since
            # routing by partition refuses them until they are fed (D11).
            "data": "nodes",
            "lease": 1.2,
            "drift": 0.1,
            "policies": {
                "pinned": {"partitions_static": {"gold": [["C", "sync"], ["A", "async"]]}},
                "default": {"partitions": 4, "replicas": 2},
            },
            "bindings": {
                "Account": {"policy": "pinned", "mapper": "round_robin"},
                "Order": {"mapper": "hash", "ring_size": 64},
            },
        },
    }
    layout = {p.name: p for p in layout_of(settings)}
    assert sorted(layout) == ["default.0", "default.1", "default.2", "default.3", "gold"]
    assert layout["gold"].nodes == (("C", "sync"), ("A", "async"))
    assert len(layout["default.0"].nodes) == 3
    lease = ha_cluster_factory(from_mapping(settings)).keywords["lease"]  # type: ignore[attr-defined]
    assert (lease.lease, lease.drift) == (1.2, 0.1)


def test_a_joining_node_hosts_only_static_partitions_that_list_it() -> None:
    settings = {"ha": {"policies": {"p": {"partitions_static": {"solo": [["D", "sync"]]}}}}}
    assert [p.name for p in layout_of(settings)] == ["solo"]


@pytest.mark.parametrize(
    ("settings", "culprit"),
    [
        ({"ha": {"bindings": {"Account": {"policy": "nope"}}}}, "unknown policy 'nope'"),
        (
            {
                "members": ["A", "B"],
                "ha": {
                    "policies": {"p": {"partitions_static": {"x": [["A", "sync"], ["Z", "sync"]]}}}
                },
            },
            "node 'Z' is not a node of the cluster",
        ),
        (
            {"ha": {"policies": {"p": {"partitions_static": {"x": [["A", "often"]]}}}}},
            "node A has style 'often'",
        ),
        ({"ha": {"policies": {"p": {"kind": "elastic"}}}}, "ha.policies.p.kind"),
        ({"ha": {"policies": {"p": {"replica": 2}}}}, "did you mean 'replicas'"),
        ({"ha": {"policies": {"p": {"partitions": 0}}}}, "ha.policies.p.partitions"),
        ({"ha": {"bindings": {"T": {"mapper": "nocolon"}}}}, "mapper 'nocolon'"),
        ({"ha": {"lease": 0}}, "'ha.lease' must be greater than 0"),
        ({"ha": {"default_policy": "gold"}}, "default policy 'gold' is not defined"),
        (
            {
                "ha": {
                    "policies": {
                        "p": {"kind": "dynamic", "partitions_static": {"x": [["A", "sync"]]}}
                    }
                }
            },
            "a dynamic policy lists no partitions",
        ),
    ],
)
def test_bad_ha_settings_are_one_line_naming_the_culprit(
    settings: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping(settings)
    message = str(info.value)
    assert culprit in message, message
    assert "\n" not in message


def test_a_mapper_that_does_not_resolve_stops_the_node_at_start() -> None:
    cfg = from_mapping({"ha": {"bindings": {"Account": {"mapper": "no_such_mod_q:Mapper"}}}})
    with pytest.raises(ConfigError, match="binding of Account: mapper 'no_such_mod_q:Mapper'"):
        ha_cluster_factory(cfg)


def test_partition_location_is_the_agreed_function() -> None:
    name = "default.3"
    digest = hashlib.blake2b(b"nonstop/partition/" + name.encode(), digest_size=8).digest()
    assert partition_location(name) == int.from_bytes(digest, "big")
    assert partition_location("default.3") != partition_location("default.4")


def test_partition_view_of_the_data_plane() -> None:
    table = PartitionTable(members=lambda: ["A", "B"], live=lambda: ["A", "B"])
    table.partitions["P"] = Partition(
        "P", "default", [["A", "sync"], ["B", "async"]], current=["A", "B"], active="A", epoch=4
    )
    table.partitions["Q"] = Partition("Q", "default", [["B", "sync"]])
    views = partition_views(table, frozenset({"P"}))
    assert views["P"].location == partition_location("P")
    assert (views["P"].active, views["P"].epoch, views["P"].acting) == ("A", 4, True)
    assert views["P"].current == (("A", "sync"), ("B", "async"))
    assert (views["Q"].active, views["Q"].current, views["Q"].acting) == (None, (), False)
    view = ClusterView("A", ["A", "B"], ["A"], partitions=views)
    assert view.partitions["P"].acting and not view.partitions["Q"].acting
    assert ClusterView("A").partitions == {}


def test_the_service_rebuilds_the_partition_view_only_when_table_or_acting_changed(
    tmp_path: Any,
) -> None:
    from types import SimpleNamespace

    import nonstop
    from nonstop.dataplane.service import DataService, ServiceConfig

    db = nonstop.open(tmp_path / "store", durability="none")
    try:
        table = PartitionTable(members=lambda: ["B"], live=lambda: ["B"])
        table.partitions["P"] = Partition("P", "default", [["B", "sync"]], ["B"], active="B")
        cluster = SimpleNamespace(
            partition_table=table,
            table_version=1,
            acting_set=frozenset(),
            view_members=["B"],
            quorum_state="Active",
        )
        runtime = SimpleNamespace(
            name="B",
            hello=SimpleNamespace(location=7, address="127.0.0.1:1"),
            peers={},
            machine=cluster,
            connected=lambda name: False,
        )

        async def check() -> None:  # the service reads the running loop's clock
            svc = DataService(runtime, db, ServiceConfig())
            first = svc._cluster_changed().partitions
            assert not first["P"].acting
            assert svc._cluster_changed().partitions is first  # nothing changed: no rebuild
            cluster.acting_set = frozenset({"P"})
            second = svc._cluster_changed().partitions
            assert second is not first and second["P"].acting
            table.partitions["P"].epoch = 2
            cluster.table_version = 2
            third = svc._cluster_changed().partitions
            assert third is not second and third["P"].epoch == 2

        asyncio.run(check())
    finally:
        db.close()


def test_ha_defaults_equal_the_ha_layers_defaults() -> None:
    from nonstop.ha.failover import PromoterConfig
    from nonstop.ha.lease import LeaseConfig
    from nonstop.ha.mapper import DEFAULT_RING_SIZE
    from nonstop.ha.policies import Binding, Policy
    from nonstop.node.config import HaBindingSection, HaPolicySection, HaSection

    ha = HaSection()
    assert (ha.lease, ha.drift) == (LeaseConfig().lease, LeaseConfig().drift)
    assert ha.retry == PromoterConfig().retry
    section, policy = HaPolicySection(), Policy("default")
    for key in ("partitions", "replicas", "async_replicas", "batch"):
        assert getattr(section, key) == getattr(policy, key), key
    binding, bound = HaBindingSection(), Binding("T")
    assert (binding.policy, binding.mapper, binding.ring_size) == (
        bound.policy,
        bound.mapper,
        DEFAULT_RING_SIZE,
    )


def test_acting_view_is_json_before_the_first_lease() -> None:
    """Before its first accepted lease renewal a node's lease ends at -inf: the status
    (served as JSON by the admin API) says None, not a float JSON cannot carry."""
    import json
    import random

    from nonstop.cluster.node import ClusterConfig
    from nonstop.ha.cluster_node import HaClusterNode

    node = HaClusterNode(
        ClusterConfig(name="A", address="127.0.0.1:1", store_timestamp=1, members=["A"]),
        random.Random(0),
        {},
        layout=[],
    )
    view = node.acting_view(0.0)
    assert view["acting_until"] is None and view["acting"] == []
    json.dumps(view, allow_nan=False)
