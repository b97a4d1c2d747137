"""J1: under routing by partition a Spark load goes to partitions, by the mapper, replicated.

A real 3-node cluster with ``[ha] data = "partitions"``, the default policy (16
partitions, one sync replica) and the experimental replication switch on. A
Spark ``append`` of N rows puts every object in the partition its key maps to
(the binding's mapper: consistent hashing of the unique key), named by that
partition (its reference's location); the per-partition counts the nodes report
(``partition.objects``, what ``nonstop partition list`` shows) are the expected
ones.  After a SIGKILL of the node acting for the most partitions, once the
survivors serve every partition, a Spark read returns all N rows (none lost:
they had reached the replicas), and another load works with the node still
down (counted per partition again).  A batch sent to a node that does not act for its
partition is refused with the retryable ``NotActive``.  (``long``: a load that
runs through the SIGKILL.)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import nonstop
from nonstop.admin.owned import OwnedCluster
from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.dataplane.placement import routing_key
from nonstop.errors import NotActive
from nonstop.ha.mapper import ConsistentHashMapper
from nonstop.ha.partition_table import partition_location
from nonstop.model.managed import type_info
from nonstop.model.ref import Ref
from nonstop.spark.partition_writes import PartitionWriter, ipc
from nonstop.spark.schema import Options
from tests.spark.conftest import ROOT, wait_until
from tests.spark.model import Item

pytestmark = pytest.mark.timeout(300)

ITEM = "pipe.Item"
PARTITIONS = 16
ROWS = 400
HA = {"data": "partitions"}  # the default policy: 16 partitions, one sync replica


@contextlib.contextmanager
def served_cluster(folder: Path, **options: Any) -> Iterator[OwnedCluster]:
    """3 nodes in ``folder`` routing by partition (``HA``, plus ``options``) running the
    test model, once every partition is served with an in-sync replica."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    options = {"ha": HA, **options}
    oc = OwnedCluster(folder, 3, apps=["tests.spark.model"], options=options, env=env)
    try:
        oc.start_all(timeout=90)
        assert wait_until(lambda: _served(oc, "ABC") is not None, 90)
        yield oc
    finally:
        oc.close()


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[OwnedCluster]:
    with served_cluster(tmp_path / "c") as oc:
        yield oc


def _status(oc: OwnedCluster, name: str) -> dict[str, Any]:
    with BulkClient(oc.address(name), timeout=10) as c:
        return c.call("status")  # type: ignore[no-any-return]


def _served(oc: OwnedCluster, names: str, replicas: bool = True) -> dict[str, Any] | None:
    """The partition table once every partition's active node is among ``names``, acts
    for it and took the replicated copy (and, with ``replicas``, has an in-sync replica)."""
    try:
        parts = {p["name"]: p for p in _status(oc, names[0])["partitions"]}
        statuses = {n: _status(oc, n) for n in names}
    except Exception:
        return None
    if len(parts) != PARTITIONS:
        return None
    for name, part in parts.items():
        status = statuses.get(part["active"])
        if status is None or name not in status["acting"]:
            return None
        if name not in status["replication"]["ready"]:
            return None
        if replicas and not any(r["in_sync"] for r in part["replicas"]):
            return None
    return parts


def _expected_partition(sku: str, partitions: list[str]) -> str:
    """The default binding: consistent hashing of the unique key (ha.md §4)."""
    return ConsistentHashMapper().partition_for(routing_key(sku), partitions)


def _counts(oc: OwnedCluster, names: str) -> Counter[str]:
    """Objects per partition, each from the node acting for it (``partition.objects``)."""
    out: Counter[str] = Counter()
    for n in names:
        with BulkClient(oc.address(n), timeout=10) as c:
            out.update(c.call("partition.objects")["counts"])
    return +out


def _write(spark: Any, oc: OwnedCluster, rows: list[tuple[str, int]], mode: str = "append") -> None:
    df = spark.createDataFrame(rows, "sku string, qty long").repartition(3)
    w = df.write.format("nonstop").option("cluster", ",".join(oc.addresses))
    w.option("type", ITEM).option("batch", 100).mode(mode).save()


def _read(spark: Any, oc: OwnedCluster, names: str) -> list[tuple[str, int, str]]:
    df = spark.read.format("nonstop").option("cluster", ",".join(oc.address(n) for n in names))
    rows = df.option("type", ITEM).option("refs", "true").load().select("sku", "qty", "_ref")
    rows = rows.collect()
    return sorted((r.sku, r.qty, r._ref) for r in rows)


def test_spark_load_is_placed_by_the_mapper_and_survives_a_kill(
    spark: Any, replicated: OwnedCluster
) -> None:
    oc = replicated
    table = _served(oc, "ABC")
    assert table is not None
    names = sorted(table)
    loaded = [(f"k{i:04}", i) for i in range(ROWS)]
    _write(spark, oc, loaded)

    # Each partition holds the objects whose keys map to it (what `nonstop partition
    # list` shows, each count from the partition's acting node).
    expected = {sku: _expected_partition(sku, names) for sku, _ in loaded}
    assert _counts(oc, "ABC") == Counter(expected.values())
    assert len(set(expected.values())) > PARTITIONS // 2  # (spread, not one partition)

    # A batch sent to a node that does not act for its partitions: NotActive (retryable).
    sku = loaded[0][0]
    active = table[expected[sku]]["active"]
    other = next(n for n in "ABC" if n != active)
    rows = ipc(pa.table({"sku": [sku], "qty": [-1]}))
    with BulkClient(oc.address(other), timeout=30) as c, pytest.raises(NotActive):
        c.call(
            "tx.upsert",
            begin="serializable",
            here=True,
            type=ITEM,
            key="sku",
            rows=rows,
            format="arrow",
        )

    # SIGKILL of the node acting for the most partitions: nothing lost.
    victim = Counter(p["active"] for p in table.values()).most_common(1)[0][0]
    survivors = "".join(n for n in "ABC" if n != victim)
    oc.kill(victim)
    assert wait_until(lambda: _served(oc, survivors, replicas=False) is not None, 60)
    # Every row is read back, each object named by the partition its key maps to.
    after = _read(spark, oc, survivors)
    assert [(s, q) for s, q, _ in after] == sorted(loaded)
    by_location = {partition_location(n): n for n in names}
    assert {s: by_location.get(Ref.parse(r).location) for s, _, r in after} == expected

    # The survivors take a load (updates and inserts) with the node still down; each
    # partition's count is the expected one (each from its acting node).
    more = [(s, q + 1000) for s, q in loaded[:50]] + [(f"n{i:03}", i) for i in range(50)]
    _write(spark, oc, more)
    final = dict(loaded) | dict(more)
    assert _counts(oc, survivors) == Counter(_expected_partition(k, names) for k in final)
    db = nonstop.connect(",".join(oc.address(n) for n in survivors))
    try:
        with db.transaction() as tx:
            got = {k: tx.get(Item, sku=k).qty for k in ("k0000", "k0049", "k0050", "n049")}
    finally:
        db.close()
    assert got == {k: final[k] for k in got}


@pytest.mark.long
def test_a_load_runs_through_a_kill_and_loses_no_acknowledged_row(
    replicated: OwnedCluster,
) -> None:
    """The Spark task's writer (without Spark) loads batch after batch while the node
    acting for the most partitions is SIGKILLed: batches in flight are refused
    (NotActive) or lost (Unavailable) and sent again after a fresh plan; every batch
    is acknowledged, and every row is there afterwards, in its partition."""
    oc = replicated
    table = _served(oc, "ABC")
    assert table is not None
    names = sorted(table)
    opts = Options.parse({"cluster": ",".join(oc.addresses), "type": ITEM})
    writer = PartitionWriter(opts, cluster_nodes(opts.cluster), "sku", type_info(Item).version)
    batches, size = 40, 200
    done: list[int] = []
    failures: list[BaseException] = []

    def load() -> None:
        try:
            for b in range(batches):
                skus = [f"b{b:02}-{i:03}" for i in range(size)]
                writer.write(pa.table({"sku": skus, "qty": [b] * size}))
                done.append(b)
        except BaseException as exc:  # (reported below)
            failures.append(exc)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        assert wait_until(lambda: len(done) >= 5 or bool(failures), 60)
        victim = Counter(p["active"] for p in table.values()).most_common(1)[0][0]
        oc.kill(victim)
    finally:
        thread.join(180)
        writer.close()
    assert not failures, failures
    assert done == list(range(batches))
    assert writer.attempts > 0  # (the kill did meet the load)
    survivors = "".join(n for n in "ABC" if n != victim)
    assert wait_until(lambda: _served(oc, survivors, replicas=False) is not None, 60)
    keys = [f"b{b:02}-{i:03}" for b in range(batches) for i in range(size)]
    assert _counts(oc, survivors) == Counter(_expected_partition(k, names) for k in keys)
