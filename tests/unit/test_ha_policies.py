"""Policies and bindings (D2, D3, D4): layouts, inheritance, validation naming the culprit."""

from __future__ import annotations

from typing import Any

import pytest

from nonstop.ha.mapper import MapperError
from nonstop.ha.policies import (
    ASYNC,
    SYNC,
    Binding,
    Distribution,
    DistributionError,
    PartitionDef,
    Policy,
    distribution_from_config,
    dynamic_layout,
)


def test_default_is_16_dynamic_partitions_with_one_sync_replica_spread_evenly() -> None:
    dist = Distribution()
    dist.validate()
    parts = dist.layout(["c", "a", "b"])
    assert len(parts) == 16
    assert all(len(p.nodes) == 2 and p.nodes[1][1] == SYNC for p in parts)
    actives: dict[str, int] = {}
    for p in parts:
        assert p.nodes[0][0] != p.nodes[1][0]
        actives[p.nodes[0][0]] = actives.get(p.nodes[0][0], 0) + 1
    assert max(actives.values()) - min(actives.values()) <= 1
    assert parts[0] == PartitionDef("default.0", (("a", SYNC), ("b", SYNC)), "default")


def test_dynamic_layout_caps_replicas_by_nodes_and_marks_async() -> None:
    policy = Policy("p", partitions=2, replicas=1, async_replicas=1)
    assert dynamic_layout(policy, ["x", "y", "z"])[1].nodes == (
        ("y", SYNC),
        ("z", SYNC),
        ("x", ASYNC),
    )
    assert dynamic_layout(policy, ["x"])[0].nodes == (("x", SYNC),)
    with pytest.raises(DistributionError, match="no nodes"):
        dynamic_layout(policy, [])


class Base:
    pass


class Sub(Base):
    pass


class SubSub(Sub):
    pass


class Mine:
    def partition_for(self, key: Any, partitions: Any) -> str:
        return sorted(partitions)[0]


def test_bindings_are_inherited_and_overridable() -> None:
    static = Policy("pinned", kind="static", static=(PartitionDef("P1", (("a", SYNC),), "pinned"),))
    dist = Distribution(
        {"default": Policy("default", partitions=4), "pinned": static},
        {"Base": Binding("Base", "pinned"), "SubSub": Binding("SubSub", "default", Mine)},
    )
    dist.validate(["a", "b"])
    assert dist.binding_for(Sub).type_name == "Base"
    assert dist.partition_for(Sub, "k", ["a", "b"]) == "P1"
    assert dist.partition_for(SubSub, "k", ["a", "b"]) == "default.0"
    assert dist.binding_for(int).policy == "default"  # unbound: the default policy


def test_bad_input_names_the_culprit() -> None:
    with pytest.raises(DistributionError, match="type Account is bound to unknown policy 'gold'"):
        Distribution(bindings={"Account": Binding("Account", "gold")}).validate()
    static = Policy(
        "s", kind="static", static=(PartitionDef("P", (("a", SYNC), ("zz", SYNC)), "s"),)
    )
    with pytest.raises(DistributionError, match="partition 'P': node 'zz' is not a node"):
        Distribution({"default": Policy("default"), "s": static}).validate(["a", "b"])
    clash = Policy(
        "default2", kind="static", static=(PartitionDef("default.1", (("a", SYNC),), "x"),)
    )
    with pytest.raises(DistributionError, match=r"'default\.1' is defined by policies"):
        Distribution({"default": Policy("default"), "default2": clash}).validate()
    with pytest.raises(DistributionError, match="replicas must be an integer >= 0"):
        Distribution({"default": Policy("default", replicas=-1)}).validate()
    with pytest.raises(DistributionError, match="the default policy 'x'"):
        Distribution(default_policy="x").validate()
    with pytest.raises(DistributionError, match=r"mapper 'no\.such\.module:M' not found"):
        Distribution(bindings={"T": Binding("T", mapper="no.such.module:M")}).validate()
    with pytest.raises(DistributionError, match="has no partition_for"):
        Distribution(bindings={"T": Binding("T", mapper=object())}).validate()
    with pytest.raises(DistributionError, match="ring size"):
        Distribution(bindings={"T": Binding("T", ring_size=0)}).validate()
    with pytest.raises(DistributionError, match="node a is listed twice"):
        Policy(
            "s", kind="static", static=(PartitionDef("P", (("a", SYNC), ("a", SYNC)), "s"),)
        ).check()
    with pytest.raises(DistributionError, match="style 'fast'"):
        Policy("s", kind="static", static=(PartitionDef("P", (("a", "fast"),), "s"),)).check()


def test_a_broken_mapper_is_an_error_at_create() -> None:
    class Broken:
        def partition_for(self, key: Any, partitions: Any) -> str:
            return "elsewhere"

    dist = Distribution(bindings={"Base": Binding("Base", mapper=Broken)})
    dist.validate()
    with pytest.raises(MapperError, match="mapper Broken of type Sub returned 'elsewhere'"):
        dist.partition_for(Sub, "k", ["a"])


def test_from_config_toml_shape() -> None:
    dist = distribution_from_config(
        {
            "policies": {
                "default": {"partitions": 8, "replicas": 2},
                "pinned": {"partitions_static": {"P1": [["a", "sync"], ["b", "async"]]}},
            },
            "bindings": {"Account": {"policy": "pinned", "mapper": "round_robin"}},
        }
    )
    assert dist.policies["pinned"].kind == "static"
    assert dist.policies["default"].replicas == 2
    assert [p.name for p in dist.layout(["a", "b", "c"])][-1] == "P1"
    with pytest.raises(DistributionError, match="unknown settings \\['replica'\\]"):
        distribution_from_config({"policies": {"default": {"replica": 2}}})
    with pytest.raises(DistributionError, match="bound to unknown policy"):
        distribution_from_config({"bindings": {"A": {"policy": "nope"}}})
