"""A data directory keeps the data routing it was made with (node/datadir.py).

Routing by partition is the default of a node config; a directory made under routing
by node (explicitly, or by an earlier version's default) must not be read by
partition, where its references would point at the wrong place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nonstop.node.config import ConfigError, from_mapping
from nonstop.node.datadir import DataDir


def _config(**ha: Any) -> Any:
    return from_mapping({"name": "A", "members": ["A"], **({"ha": ha} if ha else {})})


def _open(path: Path, cfg: Any) -> dict[str, Any]:
    store, _ = DataDir(path).open_identity(cfg)
    try:
        return store.read_meta()
    finally:
        store.close()


def test_a_new_directory_records_the_default_routing_by_partition(tmp_path: Path) -> None:
    assert _config().ha.data == "partitions"
    assert _open(tmp_path, _config())["routing"] == "partitions"
    assert _open(tmp_path, _config(data="partitions"))["routing"] == "partitions"


def test_a_directory_routed_by_node_refuses_the_default(tmp_path: Path) -> None:
    _open(tmp_path, _config(data="nodes"))
    with pytest.raises(ConfigError) as err:
        _open(tmp_path, _config())
    text = str(err.value)
    assert "routed by node" in text and "the default" in text
    assert '[ha] data = "nodes"' in text
    assert _open(tmp_path, _config(data="nodes"))["routing"] == "nodes"


def test_a_directory_routed_by_partition_refuses_routing_by_node(tmp_path: Path) -> None:
    _open(tmp_path, _config())
    with pytest.raises(ConfigError, match='set \\[ha\\] data = "partitions"'):
        _open(tmp_path, _config(data="nodes"))


def _made_before_the_record(path: Path, cfg: Any) -> None:
    """A directory as an earlier version left it: an identity without ``routing``."""
    store, _ = DataDir(path).open_identity(cfg)
    try:
        with store.env.begin(write=True, db=store._meta) as txn:
            assert txn.delete(b"routing")
    finally:
        store.close()


def test_an_older_directory_without_a_record_was_routed_by_node(tmp_path: Path) -> None:
    _made_before_the_record(tmp_path, _config(data="nodes"))
    with pytest.raises(ConfigError, match="routed by node by default"):
        _open(tmp_path, _config())
    # Saying so keeps it, and records it.
    assert _open(tmp_path, _config(data="nodes"))["routing"] == "nodes"


def test_an_older_directory_whose_config_said_partitions_keeps_them(tmp_path: Path) -> None:
    # `nonstop local up` wrote ha.data = "partitions" into the configs it made.
    _made_before_the_record(tmp_path, _config(data="partitions"))
    assert _open(tmp_path, _config(data="partitions"))["routing"] == "partitions"
    assert _open(tmp_path, _config())["routing"] == "partitions"
