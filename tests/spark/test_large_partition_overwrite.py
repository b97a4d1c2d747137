"""A large overwrite routed by partition (the nodes' default): the swap never blocks a node.

The by-node twin is ``test_large_overwrite.py``.  Here a real 3-node cluster routes by
partition (16 partitions, one sync replica each) with a short ``rpc_timeout``
(``RPC_TIMEOUT``, 1 s), so a swap that lasts several timeouts is what the test
exercises.  The swap is the Spark job commit's one distributed transaction over
every partition (``NonstopWriter.commit``: data-path.md §6.6), driven here by the
Spark task's own writer without Spark (as ``bench.partition_bulk_profile`` does):
each active node deletes its partitions' old objects and creates the staged ones,
replicated to the partition's sync replica before anything is acknowledged.

From the swap's start until the job commit returns, a second client commits small
transactions through another node (their latency stays low: issue 12, "long work
never blocks a node's event loop") and a watcher asks every node for the cluster's
state: no node is ever seen Down and no node's failure detector logs a peer Down.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import nonstop
from nonstop.admin.owned import OwnedCluster
from nonstop.client.bulk import cluster_nodes
from nonstop.model.managed import type_info
from nonstop.spark.partition_writes import PartitionWriter
from nonstop.spark.schema import Options
from nonstop.spark.source import NonstopWriter, WriteStats
from tests.spark.model import Item, Owner
from tests.spark.test_partition_writes import ITEM, _counts, served_cluster
from tests.spark.watch import DownLog, DownWatcher

pytestmark = pytest.mark.timeout(400)

OLD = 30_000
"""Objects before the swap, over the 16 partitions."""
NEW = 30_000
"""Objects staged by the overwrite (four "tasks" of ``NEW / 4``)."""
RPC_TIMEOUT = 1.0
"""The nodes' ``rpc_timeout``: the swap must last longer, or the test proves nothing."""
SCHEMA = StructType([StructField("sku", StringType()), StructField("qty", LongType())])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[OwnedCluster]:
    with served_cluster(tmp_path / "c", rpc_timeout=RPC_TIMEOUT) as oc:
        yield oc


def _writer(opts: Options) -> PartitionWriter:
    return PartitionWriter(opts, cluster_nodes(opts.cluster), "sku", type_info(Item).version)


def _rows(prefix: str, first: int, count: int, qty: int) -> pa.Table:
    skus = [f"{prefix}{i:06}" for i in range(first, first + count)]
    return pa.table({"sku": skus, "qty": [qty] * count})


def test_a_large_swap_by_partition_keeps_every_node_answering(cluster: OwnedCluster) -> None:
    opts = Options.parse({"cluster": ",".join(cluster.addresses), "type": ITEM})
    w = _writer(opts)
    try:
        for first in range(0, OLD, 5_000):
            w.write(_rows("o", first, 5_000, 1))
    finally:
        w.close()
    job = NonstopWriter(opts, SCHEMA, overwrite=True)
    stats: list[WriteStats] = []
    share = NEW // 4
    for task in range(4):
        w = _writer(opts)
        try:
            w.stage(_rows("n", task * share, share, 2), job.job, f"{task}/0/0/")
        finally:
            w.close()
        s = WriteStats(partition=task, rows=share)
        s.staged = [[name, tag] for tag, name in sorted(w.staged.items())]
        stats.append(s)

    stop = threading.Event()
    latencies: list[float] = []
    failures: list[BaseException] = []

    def other_client() -> None:
        """Small transactions on another type, through node C, during the swap."""
        n = 0
        with nonstop.connect([cluster.address("C")], balance="first") as db:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    with db.transaction() as tx:
                        tx.create(Owner, name=f"w{n}")
                except BaseException as exc:
                    failures.append(exc)
                    return
                latencies.append(time.monotonic() - started)
                n += 1
                time.sleep(0.02)

    downs = DownLog({n: cluster.log_path(n) for n in "ABC"})
    side = threading.Thread(target=other_client)
    side.start()
    with DownWatcher({n: cluster.address(n) for n in "ABC"}) as watcher:
        time.sleep(0.5)  # the other client's latency before the swap, for comparison
        try:
            started = time.monotonic()
            job.commit(stats)  # type: ignore[arg-type]
            took = time.monotonic() - started
        finally:
            stop.set()
            side.join(60)

    # Every partition holds the new set only: the objects of the test's types on the
    # nodes acting for them (the other client's owners are the rest), and a locking
    # query sees the new keys and no old one.
    assert sum(_counts(cluster, "ABC").values()) == NEW + len(latencies)
    with nonstop.connect(cluster.addresses) as db, db.transaction() as tx:
        skus = {o.sku for o in tx.query(Item)}
    assert len(skus) == NEW and all(s.startswith("n") for s in skus), len(skus)
    assert took > 1.5 * RPC_TIMEOUT, (
        f"the swap took {took:.1f} s: not well over rpc_timeout ({RPC_TIMEOUT} s), proves nothing"
    )
    assert not failures, failures
    assert not watcher.down_seen, watcher.down_seen[:5]
    # No failure detector marked a peer Down from the swap's start until it committed.
    assert not downs.lines(), downs.lines()[:5]
    assert len(latencies) > 10, latencies
    median = statistics.median(latencies)
    print(
        f"swap of {OLD:,} by {NEW:,} objects in {took:.1f} s; the other client's "
        f"{len(latencies)} commits: median {median * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    assert median < 0.25, sorted(latencies)
