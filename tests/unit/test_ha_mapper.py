"""Mappers (D3): stable consistent hashing, round robin, custom and broken mappers."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from nonstop.ha.mapper import (
    ConsistentHashMapper,
    MapperError,
    RoundRobinMapper,
    map_object,
    stable_hash,
)

PARTS = [f"p{i}" for i in range(8)]


def test_equal_keys_map_alike_and_spread_evenly() -> None:
    mapper = ConsistentHashMapper()
    counts = Counter(mapper.partition_for(f"acct-{i}", PARTS) for i in range(20_000))
    assert set(counts) == set(PARTS)
    assert max(counts.values()) / min(counts.values()) <= 1.5
    assert mapper.partition_for("acct-7", PARTS) == ConsistentHashMapper().partition_for(
        "acct-7", list(reversed(PARTS))
    )


def test_hash_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = "from nonstop.ha.mapper import stable_hash; print(stable_hash(['k', 1, b'x']))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PYTHONPATH": ":".join(sys.path)},
    ).stdout
    assert int(out) == stable_hash(["k", 1, b"x"])


def test_a_new_partition_moves_about_its_share_of_keys() -> None:
    mapper = ConsistentHashMapper()
    keys = [f"k{i}" for i in range(10_000)]
    before = {k: mapper.partition_for(k, PARTS) for k in keys}
    after = {k: mapper.partition_for(k, [*PARTS, "p8"]) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert all(after[k] == "p8" for k in moved)  # keys only move to the new partition
    assert len(moved) / len(keys) <= 1 / 9 + 0.05


def test_ring_size_is_configurable_and_validated() -> None:
    small = ConsistentHashMapper(ring_size=16)
    assert len(small.ring(PARTS)) == 16
    assert small.slot_of("x") < 16
    for bad in (0, -1, 1.5, True):
        with pytest.raises(MapperError, match="ring size"):
            ConsistentHashMapper(ring_size=bad)  # type: ignore[arg-type]
    with pytest.raises(MapperError, match="no partitions"):
        small.partition_for("x", [])


def test_round_robin_spreads_over_partitions() -> None:
    mapper = RoundRobinMapper()
    got = [mapper.partition_for(None, ["b", "a", "c"]) for _ in range(6)]
    assert got == ["a", "b", "c", "a", "b", "c"]
    with pytest.raises(MapperError):
        mapper.partition_for(None, [])


class Raising:
    def partition_for(self, key: Any, partitions: Any) -> str:
        raise KeyError("boom")


class Unknown:
    def partition_for(self, key: Any, partitions: Any) -> str:
        return "nowhere"


class Custom:
    def partition_for(self, key: Any, partitions: Any) -> str:
        return sorted(partitions)[-1]


def test_map_object_names_the_culprit() -> None:
    with pytest.raises(MapperError, match="mapper Raising of type Account raised KeyError"):
        map_object(Raising(), "Account", "k", PARTS)
    with pytest.raises(MapperError, match="mapper Unknown of type Account returned 'nowhere'"):
        map_object(Unknown(), "Account", "k", PARTS)
    assert map_object(Custom(), "Account", "k", PARTS) == "p7"


def test_a_column_maps_as_its_keys_one_by_one() -> None:
    # (The bulk path maps a batch's routing keys in one pass: partitions_for.)
    mapper = ConsistentHashMapper()
    keys: list[Any] = [f"k{i}".encode() for i in range(500)] + [7, "x", b"", None, [1, "a"]]
    assert mapper.partitions_for(keys, PARTS) == [mapper.partition_for(k, PARTS) for k in keys]
    assert mapper.partitions_for([], PARTS) == []
