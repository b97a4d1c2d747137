"""Spark plans follow the cluster's current members (issue 12).

A node that left the cluster (``leave``, then stopped) is still known to its
former peers, as down; reads and writes must not wait for it, or refuse
because of it: they go to the members only -- under routing by partition (the
default), to the partitions' active nodes among them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nonstop.admin.owned import OwnedCluster
from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.spark.source import home
from tests.spark.conftest import ROOT, wait_until

ITEM = "pipe.Item"


def four_nodes(folder: Path, options: dict[str, Any] | None = None) -> Iterator[OwnedCluster]:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    oc = OwnedCluster(folder, 4, apps=["tests.spark.model"], env=env, options=options)
    try:
        oc.start_all(timeout=90)
        yield oc
    finally:
        oc.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[OwnedCluster]:
    yield from four_nodes(tmp_path / "c")


@pytest.fixture
def node_routed(tmp_path: Path) -> Iterator[OwnedCluster]:
    yield from four_nodes(tmp_path / "c", {"ha": {"data": "nodes"}})


def members(address: str) -> list[str]:
    with BulkClient(address) as c:
        return list(c.call("status")["members"])


def leave_and_kill_d(cluster: OwnedCluster) -> str:
    """D leaves the cluster and is killed; the others see it down.  Returns A's address."""
    a = cluster.address("A")
    with BulkClient(a, timeout=60) as c:
        c.call("leave", name="D")
    assert wait_until(lambda: members(a) == ["A", "B", "C"], 30)
    cluster.kill("D")
    assert wait_until(lambda: any(n["name"] == "D" and not n["up"] for n in cluster_nodes(a)), 15)
    return a


def test_reads_and_writes_follow_the_members_after_a_node_left(
    spark: Any, cluster: OwnedCluster
) -> None:
    # Routing by partition (the default): D's partitions had in-sync copies on the others,
    # so it may leave; they fail over, and the plans go to the members' partitions.
    a = leave_and_kill_d(cluster)
    cluster.wait_served(timeout=30)
    addresses = ",".join(cluster.address(n) for n in "ABCD")  # D's address too: as configured
    rows = [(f"m{i:04}", i) for i in range(600)]
    frame = "sku string, qty long"
    spark.createDataFrame(rows, frame).repartition(2).write.format("nonstop").option(
        "cluster", addresses
    ).option("type", ITEM).mode("append").save()
    df = spark.read.format("nonstop").option("cluster", addresses).option("type", ITEM).load()
    assert sorted((r.sku, r.qty) for r in df.select("sku", "qty").collect()) == rows
    # Every row is in a partition a member acts for, each once; D acts for none.
    with BulkClient(a) as c:
        actives = {p["active"] for p in c.call("status")["partitions"]}
    assert actives <= {"A", "B", "C"}, actives
    held = 0
    for name in "ABC":
        with BulkClient(cluster.address(name)) as c:
            held += sum(c.call("partition.objects")["counts"].values())
    assert held == len(rows)


@pytest.mark.long  # the same plus an overwrite, routing by node: `make test-long`
def test_under_node_routing_reads_writes_and_overwrites_follow_the_members(
    spark: Any, node_routed: OwnedCluster
) -> None:
    # Pinned to routing by node: each key's home is one of the members (``home``), and an
    # overwrite swaps on every member (refused under routing by partition today).
    cluster = node_routed
    leave_and_kill_d(cluster)
    addresses = ",".join(cluster.address(n) for n in "ABCD")  # D's address too: as configured
    rows = [(f"m{i:04}", i) for i in range(600)]
    frame = "sku string, qty long"
    spark.createDataFrame(rows, frame).repartition(2).write.format("nonstop").option(
        "cluster", addresses
    ).option("type", ITEM).mode("append").save()
    df = spark.read.format("nonstop").option("cluster", addresses).option("type", ITEM).load()
    assert sorted((r.sku, r.qty) for r in df.select("sku", "qty").collect()) == rows
    # Each key at its home among the three members.
    names = ["A", "B", "C"]
    for name in names:
        with BulkClient(cluster.address(name)) as c:
            held = c.call("bulk.plan", type=ITEM)["count"]
        assert held == sum(1 for k, _ in rows if names[home(k, 3)] == name)
    # An overwrite swaps on the members in one transaction.
    new = [(f"w{i:03}", 1) for i in range(90)]
    spark.createDataFrame(new, frame).write.format("nonstop").option("cluster", addresses).option(
        "type", ITEM
    ).mode("overwrite").save()
    back = spark.read.format("nonstop").option("cluster", addresses).option("type", ITEM).load()
    assert wait_until(lambda: sorted(r.sku for r in back.collect()) == [k for k, _ in new], 10)
