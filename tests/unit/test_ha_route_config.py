"""The ``ha.data`` switch: routing by partition, its start-time refusals, the node's placement."""

from __future__ import annotations

from typing import Any

import pytest

import nonstop
from nonstop import errors
from nonstop.dataplane.placement import BindingPlacement, routing_key
from nonstop.ha.mapper import ConsistentHashMapper
from nonstop.model.managed import type_info
from nonstop.node.config import ConfigError, from_mapping


class RouteAccount(nonstop.Managed):
    number: str = nonstop.key(unique=True)
    balance: int = 0


class RouteNote(nonstop.Managed):
    text: str = ""


class RouteTwoKeys(nonstop.Managed):
    a: str = nonstop.key(unique=True)
    b: str = nonstop.key(unique=True)


ZERO = {"policies": {"default": {"replicas": 0}}}


def test_the_switch_defaults_to_routing_by_partition_with_replicas() -> None:
    # HA by default (issue 10): any node config, not only `nonstop local up`'s.
    ha = from_mapping({"members": ["A"]}).ha
    assert ha.data == "partitions" and ha.replicating


OFF = {"data": "partitions", "replicate_data": False}
"""Routing by partition with sync replication of data turned off."""


@pytest.mark.parametrize(
    ("ha", "culprit"),
    [
        (OFF, "policy 'default' keeps 2 copies"),
        (
            {**OFF, "policies": {"default": {"replicas": 0, "async_replicas": 1}}},
            "policy 'default' keeps 2 copies",
        ),
        (
            {
                **OFF,
                "policies": {
                    "default": {"replicas": 0},
                    "pinned": {"partitions_static": {"g": [["A", "sync"], ["B", "sync"]]}},
                },
            },
            "policy 'pinned' keeps 2 copies",
        ),
    ],
)
def test_partitions_without_replication_refuse_any_policy_with_replicas_in_one_line(
    ha: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(ConfigError) as info:
        from_mapping({"members": ["A", "B"], "ha": ha})
    message = str(info.value)
    assert culprit in message and "sync replication of data is off" in message
    assert "set replicas = 0" in message and "\n" not in message.strip()


def test_partitions_with_sync_replicas_start_and_replicate() -> None:
    cfg = from_mapping({"members": ["A", "B"], "ha": {"data": "partitions"}})
    assert cfg.ha.replicating
    with pytest.raises(ConfigError, match="async replicas"):
        from_mapping(
            {
                "members": ["A", "B"],
                "ha": {"data": "partitions", "policies": {"default": {"async_replicas": 1}}},
            }
        )


def test_partitions_with_replicas_zero_start() -> None:
    cfg = from_mapping({"members": ["A", "B"], "ha": {"data": "partitions", **ZERO}})
    assert cfg.ha.data == "partitions"


def test_binding_placement_maps_a_unique_key_as_the_hash_mapper_does() -> None:
    cfg = from_mapping({"members": ["A", "B"], "ha": {"data": "partitions", **ZERO}})
    placement = BindingPlacement(cfg.ha.distribution(cfg.members))
    name = type_info(RouteAccount).name
    assert placement.unique_field(name) == "number"
    parts = [f"default.{i}" for i in range(16)]
    key = routing_key("acc-17")
    expected = ConsistentHashMapper().partition_for(key, parts)
    assert placement.partition_for(name, key) == expected
    # Equal keys place alike; no unique key: the binding's mapper (hash of None).
    assert placement.partition_for(name, routing_key("acc-17")) == expected
    note = type_info(RouteNote).name
    assert placement.unique_field(note) is None
    assert placement.partition_for(note, None) in parts
    with pytest.raises(errors.UnknownType):
        placement.partition_for("no.such.Type", None)
    # A bulk batch's column in one pass: as key by key.
    keys = [routing_key(f"acc-{i}") for i in range(300)]
    assert placement.partitions_for(name, keys) == [placement.partition_for(name, k) for k in keys]
    assert placement.partitions_for(name, []) == []


def test_a_binding_that_could_repeat_a_unique_value_is_refused_at_start() -> None:
    cfg = from_mapping(
        {
            "members": ["A"],
            "ha": {
                "data": "partitions",
                **ZERO,
                "bindings": {"RouteAccount": {"mapper": "round_robin"}},
            },
        }
    )
    placement = BindingPlacement(cfg.ha.distribution(cfg.members))
    with pytest.raises(errors.SchemaError, match="RouteAccount"):
        placement.check_bindings([type_info(RouteAccount)])
    with pytest.raises(errors.SchemaError, match="2 unique keys"):
        placement.check_bindings([type_info(RouteTwoKeys)])
    placement.check_bindings([type_info(RouteNote)])  # no unique key: fine


def test_transactional_replays_not_active_as_the_wire_raises_it(tmp_path: Any) -> None:
    from nonstop.model.wire import error_out, raise_error

    attempts = []

    @nonstop.transactional
    def once_refused(tx: nonstop.Transaction) -> int:
        attempts.append(1)
        if len(attempts) == 1:
            # What a client hears from a node that no longer acts for the partition.
            raise_error(error_out(errors.NotActive("n2 does not act for default.3 now")))
        return len(attempts)

    db = nonstop.open(str(tmp_path / "db"))
    try:
        assert once_refused(db) == 2
    finally:
        db.close()
