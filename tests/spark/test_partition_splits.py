"""J1: under partition routing a Spark read plans one split per partition (issue 10).

A real 3-node cluster with ``[ha] data = "partitions"`` (one copy per partition):
objects created by clients and objects loaded by Spark live in partitions.  The
plan has one split per partition of the current table, each on the partition's
active node (splits over a node's own location only where objects from before
the switch remain: ``test_read_plan.py``); the read returns every object once.
With a node killed, its partitions have no active node: the read fails naming
them (never silently short).  Node routing keeps node splits
(``test_read_plan.py``; every other pipeline test reads that way).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop.admin.owned import OwnedCluster
from nonstop.bulk.handlers import encode_rows
from nonstop.client.bulk import BulkClient
from nonstop.errors import BadArgument, Unavailable
from nonstop.spark.read_plan import location_range, plan_reads
from nonstop.spark.schema import Options
from tests.spark.conftest import ROOT, wait_until
from tests.spark.model import Item

pytestmark = pytest.mark.timeout(300)

ITEM = "pipe.Item"
PARTITIONS = 16
PARTITION_ROUTING = {"data": "partitions", "policies": {"default": {"replicas": 0}}}


def _cluster(folder: Path, ha: dict[str, Any] | None) -> OwnedCluster:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    options = {"ha": ha} if ha else None
    return OwnedCluster(folder, 3, apps=["tests.spark.model"], options=options, env=env)


@pytest.fixture
def partitioned(tmp_path: Path) -> Iterator[OwnedCluster]:
    oc = _cluster(tmp_path / "c", PARTITION_ROUTING)
    try:
        oc.start_all(timeout=90)
        assert wait_until(lambda: _all_acting(oc, "ABC") is not None, 60)
        yield oc
    finally:
        oc.close()


def _status(address: str) -> dict[str, Any]:
    with BulkClient(address, timeout=10) as c:
        return c.call("status")  # type: ignore[no-any-return]


def _all_acting(oc: OwnedCluster, names: str) -> dict[str, dict[str, Any]] | None:
    """The partition table once every partition's active node (among ``names``) acts for it."""
    parts = {p["name"]: p for p in _status(oc.address(names[0]))["partitions"]}
    if len(parts) != PARTITIONS:
        return None
    acting = {n: set(_status(oc.address(n))["acting"]) for n in names}
    for name, part in parts.items():
        if part["active"] not in acting or name not in acting[part["active"]]:
            return None
    return parts


def _options(oc: OwnedCluster) -> Options:
    return Options.parse({"cluster": ",".join(oc.addresses), "type": ITEM})


def _version() -> int:
    from nonstop.model.managed import type_info

    return type_info(Item).version


def _read(spark: Any, oc: OwnedCluster) -> list[tuple[str, int]]:
    df = spark.read.format("nonstop").option("cluster", ",".join(oc.addresses))
    rows = df.option("type", ITEM).load().select("sku", "qty").collect()
    return sorted((r.sku, r.qty) for r in rows)


def test_one_split_per_partition_on_its_active_node(spark: Any, partitioned: OwnedCluster) -> None:
    oc = partitioned
    created = [(f"p{i:03}", i) for i in range(120)]
    db = nonstop.connect(",".join(oc.addresses))
    try:
        with db.transaction() as tx:
            for sku, qty in created:
                tx.create(Item, sku=sku, qty=qty)
    finally:
        db.close()
    table = _all_acting(oc, "ABC")
    assert table is not None
    by_location = {p["location"]: p for p in table.values()}

    splits = plan_reads(_options(oc), ITEM, _version())
    # Nothing loaded by Spark yet: exactly one split per partition, on its active node.
    assert len(splits) == PARTITIONS
    assert sorted(s.partition or "" for s in splits) == sorted(table)
    for s in splits:
        part = table[s.partition or ""]
        assert (s.node, s.address, s.epoch) == (
            part["active"],
            oc.address(part["active"]),
            part["epoch"],
        )
        assert (s.lo, s.hi) == location_range(part["location"])
    assert {s.node for s in splits} == {"A", "B", "C"}

    # Rows a Spark load writes go to the partitions their keys map to (data-path.md
    # §6.5): still one split per partition, and the read returns every object once.
    loaded = [(f"s{i:03}", 1000 + i) for i in range(90)]
    df = spark.createDataFrame(loaded, "sku string, qty long")
    df.write.format("nonstop").option("cluster", ",".join(oc.addresses)).option("type", ITEM).mode(
        "append"
    ).save()
    splits = plan_reads(_options(oc), ITEM, _version())
    assert len(splits) == PARTITIONS and all(s.partition is not None for s in splits)
    assert all(s.lo is not None and int.from_bytes(s.lo[:8]) in by_location for s in splits)
    assert _read(spark, oc) == sorted(created + loaded)
    # bulk.upsert, which would create outside the partitions, is refused.
    rows = encode_rows({"sku": ["x"], "qty": [1]})
    with BulkClient(oc.address("B"), timeout=60) as c, pytest.raises(BadArgument):
        c.call("bulk.upsert", type=ITEM, rows=rows, format="columns", key="sku", tag="load/1")

    # A node killed: its partitions have no active node; the plan says which.
    oc.kill("C")
    lost = sorted(name for name, p in table.items() if p["active"] == "C")
    assert lost

    def c_down() -> bool:
        return not any(n == "C" for n in _up_names(oc.address("A")))

    assert wait_until(c_down, 30)
    with pytest.raises(Unavailable) as info:
        plan_reads(
            Options.parse({"cluster": ",".join(oc.address(n) for n in "AB"), "type": ITEM}),
            ITEM,
            _version(),
        )
    message = str(info.value)
    assert "node(s) C are down" in message
    assert all(name in message for name in lost), message


def _up_names(address: str) -> list[str]:
    with BulkClient(address, timeout=10) as c:
        return [n["name"] for n in c.call("nodes")["nodes"] if n["up"]]
