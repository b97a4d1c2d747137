"""The data source against a real 3-node cluster (node processes with the data service)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nonstop.admin.owned import OwnedCluster
from nonstop.client.bulk import BulkClient, cluster_nodes
from tests.spark.conftest import ROOT, wait_until

ITEM = "pipe.Item"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[OwnedCluster]:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    oc = OwnedCluster(tmp_path / "c", 3, apps=["tests.spark.model"], env=env)
    try:
        oc.start_all(timeout=60)
        yield oc
    finally:
        oc.close()


def read(spark: Any, addresses: str, **options: str) -> Any:
    r = spark.read.format("nonstop").option("cluster", addresses).option("type", ITEM)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_spark_on_a_three_node_cluster(spark: Any, cluster: OwnedCluster) -> None:
    addresses = ",".join(cluster.addresses)
    nodes = cluster_nodes(addresses)
    assert [n["name"] for n in nodes] == ["A", "B", "C"] and all(n["up"] for n in nodes)
    rows = [(f"c{i:05}", i) for i in range(3000)]
    df = spark.createDataFrame(rows, "sku string, qty long").repartition(3)
    df.write.format("nonstop").option("cluster", addresses).option("type", ITEM).mode(
        "append"
    ).save()
    held = {}
    for n in nodes:
        with BulkClient(n["address"]) as c:
            held[n["name"]] = c.call("bulk.plan", type=ITEM)["count"]
    assert sum(held.values()) == 3000 and min(held.values()) > 500  # spread by key
    back = read(spark, addresses, splits="2")
    assert back.rdd.getNumPartitions() == 6
    assert sorted((r.sku, r.qty) for r in back.select("sku", "qty").collect()) == rows
    assert read(spark, addresses, nodes="B").count() == held["B"]
    # Overwrite: per node, each node swaps in one transaction.
    new = spark.createDataFrame([(f"n{i}", 1) for i in range(900)], "sku string, qty long")
    new.write.format("nonstop").option("cluster", addresses).option("type", ITEM).mode(
        "overwrite"
    ).save()
    assert sorted(r.sku for r in read(spark, addresses).collect()) == sorted(
        f"n{i}" for i in range(900)
    )
    after = {}
    for n in nodes:
        with BulkClient(n["address"]) as c:
            after[n["name"]] = c.call("bulk.plan", type=ITEM)["count"]
    # A node down: reads and writes refuse (its objects would be missed), naming it.
    cluster.kill("C")
    survivor = cluster.address("A")

    def c_down() -> bool:
        return any(n["name"] == "C" and not n["up"] for n in cluster_nodes(survivor))

    assert wait_until(c_down, 15)
    with pytest.raises(Exception, match=r"C of the cluster .* down"):
        read(spark, survivor).count()
    more = spark.createDataFrame([("late", 1)], "sku string, qty long")
    with pytest.raises(Exception, match=r"C of the cluster .* down"):
        more.write.format("nonstop").option("cluster", survivor).option("type", ITEM).mode(
            "append"
        ).save()
    assert read(spark, survivor, nodes="A,B").count() == after["A"] + after["B"]
    cluster.restart("C")
    assert read(spark, addresses).count() == 900
