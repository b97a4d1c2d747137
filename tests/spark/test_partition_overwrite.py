"""Overwrite under routing by partition: atomic, and replicated (data-path.md §6.6).

One real 3-node cluster with ``[ha] data = "partitions"`` (16 partitions, one
sync replica), shared by the module's tests, and one Spark session:

* a swap that fails before its decision -- a key twice among the new rows (one
  node's branch fails after others ran theirs), a staged part missing from its
  partition's active node -- changes nothing anywhere;
* a Spark overwrite of N rows by M: every object is in the partition its key maps
  to, the old keys are gone, and a locking reader running meanwhile sees the old
  set or the new, never a mix; then the node acting for the most partitions is
  SIGKILLed: the promoted replicas serve the new set, not the old; an overwrite
  staged before the kill (its parts staged on each partition's replicas too) is
  swapped in by the promoted nodes.  An overwrite by an empty frame empties the
  type;
* the streaming sink (data-path.md §6.7): micro-batches land once, a replayed
  batch -- written but not committed, or committed -- changes nothing (``long``:
  through a Spark streaming query, and across a SIGKILL between micro-batches on
  a cluster of its own).
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

import nonstop
from nonstop.admin.owned import OwnedCluster
from nonstop.client.bulk import cluster_nodes
from nonstop.errors import Aborted, DuplicateKey, Retryable, Unavailable
from nonstop.model.managed import type_info
from nonstop.spark.partition_writes import PartitionWriter
from nonstop.spark.schema import Options
from nonstop.spark.source import NonstopStreamWriter, NonstopWriter, WriteStats
from tests.spark.conftest import ROOT, wait_until
from tests.spark.model import Item, Plain
from tests.spark.test_partition_writes import (
    HA,
    ITEM,
    _counts,
    _expected_partition,
    _served,
    served_cluster,
)

pytestmark = pytest.mark.timeout(400)

SCHEMA = StructType([StructField("sku", StringType()), StructField("qty", LongType())])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnedCluster]:
    root: Path = tmp_path_factory.mktemp("partover")
    with served_cluster(root / "c") as oc:
        yield oc


def _opts(oc: OwnedCluster, names: str = "ABC") -> Options:
    return Options.parse({"cluster": ",".join(oc.address(n) for n in names), "type": ITEM})


def _writer(oc: OwnedCluster, names: str = "ABC") -> PartitionWriter:
    opts = _opts(oc, names)
    return PartitionWriter(opts, cluster_nodes(opts.cluster), "sku", type_info(Item).version)


def _load(oc: OwnedCluster, rows: dict[str, int]) -> None:
    w = _writer(oc)
    try:
        w.write(pa.table({"sku": list(rows), "qty": list(rows.values())}))
    finally:
        w.close()


def _staged_job(oc: OwnedCluster, tables: list[pa.Table], names: str = "ABC") -> NonstopWriter:
    """An overwrite job whose 'tasks' staged ``tables`` (one task each), not committed."""
    job = NonstopWriter(_opts(oc, names), SCHEMA, overwrite=True)
    job.messages = []  # type: ignore[attr-defined]
    for pid, table in enumerate(tables):
        w = _writer(oc, names)
        try:
            w.stage(table, job.job, f"{pid}/0/0/")
        finally:
            w.close()
        stats = WriteStats(partition=pid, rows=table.num_rows)
        stats.staged = [[name, tag] for tag, name in sorted(w.staged.items())]
        job.messages.append(stats)  # type: ignore[attr-defined]
    return job


def _state(oc: OwnedCluster, names: str) -> dict[str, int]:
    """Every object of the type, key -> qty: a locking query over the cluster (each
    partition asked on its active node)."""
    db = nonstop.connect(",".join(oc.address(n) for n in names))
    try:
        for _ in range(40):
            try:
                with db.transaction() as tx:
                    return {o.sku: o.qty for o in tx.query(Item)}
            except (Retryable, Unavailable):
                continue
    finally:
        db.close()
    raise AssertionError("the cluster did not answer a query")


def _plain(oc: OwnedCluster, names: str = "ABC") -> dict[str, int]:
    """Every ``pipe.Plain`` object, key -> qty (a locking query over the cluster)."""
    db = nonstop.connect(",".join(oc.address(n) for n in names))
    try:
        for _ in range(40):
            try:
                with db.transaction() as tx:
                    return {o.sku: o.qty for o in tx.query(Plain)}
            except (Retryable, Unavailable):
                continue
    finally:
        db.close()
    raise AssertionError("the cluster did not answer a query")


def _set_plain(oc: OwnedCluster, values: dict[str, int] | None, names: str = "ABC") -> None:
    """Another writer: set some objects' qty (None: delete every object of the type)."""

    @nonstop.transactional(max_retries=40)
    def apply(tx: Any) -> None:
        if values is None:
            for o in tx.query(Plain):
                tx.delete(o)
            return
        for sku, qty in values.items():
            tx.get(Plain, sku=sku, lock="write").qty = qty

    db = nonstop.connect(",".join(oc.address(n) for n in names))
    try:
        apply(db)
    finally:
        db.close()


def _micro_batch(sink: NonstopStreamWriter, batch: int, rows: dict[str, int]) -> WriteStats:
    """One task of micro-batch ``batch`` writing ``rows`` (what Spark's task runs)."""
    table = pa.table({"sku": list(rows), "qty": list(rows.values())})
    return sink.write_partitioned(iter(table.to_batches()), batch, 0)


def test_the_stream_sink_writes_each_micro_batch_once_and_a_replay_changes_nothing(
    cluster: OwnedCluster,
) -> None:
    """The streaming sink's task and driver code under routing by partition (data-path.md
    §6.7), without Spark's engine around them (``long``: the same through a Spark
    streaming query): micro-batches land once (count and sum as the source's); a batch
    written but not committed (Spark failed before the sink's commit) and sent again
    skips every partition that has it -- a row another writer changed meanwhile keeps
    that value; a committed batch sent again, even with other rows, changes nothing."""
    oc = cluster
    table = _served(oc, "ABC")
    assert table is not None
    names = sorted(table)
    sink = NonstopStreamWriter(
        Options.parse({"cluster": ",".join(oc.addresses), "type": "pipe.Plain", "stream": "s"}),
        SCHEMA,
    )
    first = {f"s{i:03}": i * 7 % 31 for i in range(40)}
    second = {**{k: v + 1 for k, v in list(first.items())[:10]}, "s040": 5, "s041": 6}
    try:
        # (The counts of a write are not asserted: a chunk resent after a refusal of one
        # node counts the partitions that had it as replayed, not inserted.)
        _micro_batch(sink, 0, first)
        sink.commit([], 0)
        assert _plain(oc) == first
        _micro_batch(sink, 1, second)
        _set_plain(oc, {"s040": 1000})  # another writer, before the replay of batch 1
        again = _micro_batch(sink, 1, second)
        touched = {_expected_partition(k, names) for k in second}
        assert (again.inserted, again.updated) == (0, 0) and again.replayed >= len(touched)
        sink.commit([], 1)
        late = _micro_batch(sink, 0, {k: -1 for k in first})  # committed: skipped
        assert (late.inserted, late.updated) == (0, 0)
        assert late.replayed >= len({_expected_partition(k, names) for k in first})
        state = _plain(oc)
        source = {**first, **second, "s040": 1000}
        assert state == source
        assert (len(state), sum(state.values())) == (42, sum(source.values()))
    finally:
        _set_plain(oc, None)  # (the module's other tests count every object per partition)


@pytest.mark.long
def test_a_stream_writes_each_micro_batch_once_and_a_replayed_batch_changes_nothing(
    spark: Any, cluster: OwnedCluster, tmp_path: Path
) -> None:
    """The streaming sink under routing by partition (data-path.md §6.7): two micro-batches
    land once (count and sum as the source's); Spark "crashes" after the sink committed
    batch 1 but before its own commit log entry, so it runs batch 1 again: a row of it
    another writer changed meanwhile keeps that value (the replay changed nothing), and
    the next batch lands."""
    oc = cluster
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    sent: dict[str, int] = {}

    def add_file(name: str, first: int, n: int) -> None:
        rows = {f"s{i:03}": i * 7 % 31 for i in range(first, first + n)}
        sent.update(rows)
        lines = [json.dumps({"sku": k, "qty": q}) for k, q in rows.items()]
        (source / name).write_text("\n".join(lines))

    def run() -> None:
        q = (
            spark.readStream.schema("sku string, qty long")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.format("nonstop")
            .option("cluster", ",".join(oc.addresses))
            .option("type", "pipe.Plain")
            .option("stream", "orders")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert q.exception() is None

    add_file("a.json", 0, 30)
    add_file("b.json", 30, 30)
    try:
        run()  # micro-batches 0 and 1
        state = _plain(oc)
        assert (len(state), sum(state.values())) == (len(sent), sum(sent.values()))
        assert state == sent
        _set_plain(oc, {"s040": 1000})  # a row of batch 1, changed by another writer
        for name in ("1", ".1.crc"):  # Spark lost its commit log entry of batch 1
            (checkpoint / "commits" / name).unlink(missing_ok=True)
        add_file("c.json", 60, 20)
        run()  # batch 1 again (a replay: skipped in every partition), then batch 2
        state = _plain(oc)
        assert state == {**sent, "s040": 1000}
        assert (len(state), sum(state.values())) == (80, sum(sent.values()) - sent["s040"] + 1000)
    finally:
        _set_plain(oc, None)  # (the module's other tests count every object per partition)


def test_a_swap_that_fails_before_its_decision_changes_nothing(cluster: OwnedCluster) -> None:
    oc = cluster
    old = {f"f{i:03}": i for i in range(120)}
    _load(oc, old)
    before = _state(oc, "ABC")
    assert {k: v for k, v in before.items() if k.startswith("f")} == old

    # A key twice among the new rows, in two parts of one partition: that partition's
    # branch fails, possibly after other nodes swapped theirs in the transaction.
    new = pa.table({"sku": [f"g{i:03}" for i in range(90)], "qty": [7] * 90})
    job = _staged_job(oc, [new, pa.table({"sku": ["g050"], "qty": [8]})])
    with pytest.raises(Exception, match=r"DuplicateKey|already|unique") as info:
        job.commit(job.messages)  # type: ignore[attr-defined]
    assert isinstance(info.value, DuplicateKey) or "DuplicateKey" in str(info.value)
    job.abort(job.messages)  # type: ignore[attr-defined]
    assert _state(oc, "ABC") == before

    # A part the driver expects but the partition's active node does not hold (as
    # after a takeover between staging and swap): Aborted, naming it; nothing swapped.
    job = _staged_job(oc, [new])
    some = job.messages[0].staged[0][0]  # type: ignore[attr-defined]
    job.messages[0].staged.append([some, f"9/0/0/{some}"])  # type: ignore[attr-defined]
    with pytest.raises(Aborted, match="not on its active node"):
        job.commit(job.messages)  # type: ignore[attr-defined]
    job.abort(job.messages)  # type: ignore[attr-defined]
    assert _state(oc, "ABC") == before


def _locking_reader(
    oc: OwnedCluster, old_key: str, new_key: str, stop: threading.Event, seen: list[Any]
) -> None:
    """Read two keys, one only in the old set and one only in the new, by key with read
    locks in one transaction, again and again: each read sees one set whole."""
    db = nonstop.connect(",".join(oc.addresses))
    try:
        while not stop.is_set():
            try:
                with db.transaction() as tx:
                    a = tx.find(Item, sku=old_key, lock="read")
                    b = tx.find(Item, sku=new_key, lock="read")
                    seen.append((a is not None, b is not None))
            except (Retryable, Unavailable):
                continue
    except BaseException as exc:  # (reported by the test)
        seen.append(exc)
    finally:
        db.close()


def test_a_spark_overwrite_by_m_rows_then_by_an_empty_frame_is_seen_whole(
    spark: Any, cluster: OwnedCluster
) -> None:
    oc = cluster
    table = _served(oc, "ABC")
    assert table is not None
    names = sorted(table)
    old = {f"o{i:03}": 1 for i in range(300)}
    _load(oc, old)
    assert len(_state(oc, "ABC")) >= len(old)

    # A Spark overwrite of every row by 200 others while a locking reader reads a key
    # of each set in one transaction, again and again.
    new = [(f"n{i:03}", 2) for i in range(200)]
    stop, seen = threading.Event(), []  # type: ignore[var-annotated]
    reader = threading.Thread(
        target=_locking_reader, args=(oc, "o007", "n007", stop, seen), daemon=True
    )
    reader.start()
    try:
        assert wait_until(lambda: len(seen) >= 3, 60)
        _write(spark, oc, new, "overwrite")
        n = len(seen)
        assert wait_until(lambda: len(seen) >= n + 3, 60)
    finally:
        stop.set()
        reader.join(60)
    errors = [x for x in seen if isinstance(x, BaseException)]
    assert not errors, errors
    assert set(seen) <= {(True, False), (False, True)}, Counter(seen)
    assert seen[0] == (True, False) and seen[-1] == (False, True)

    # The new set, each object in the partition its key maps to; the old keys gone.
    assert _counts(oc, "ABC") == Counter(_expected_partition(s, names) for s, _ in new)
    assert _state(oc, "ABC") == dict(new)

    # By an empty frame: every partition emptied.
    _write(spark, oc, [], "overwrite")
    assert _counts(oc, "ABC") == Counter()
    assert _state(oc, "ABC") == {}


def test_the_overwritten_set_survives_a_kill_and_a_job_staged_before_it_swaps_on_the_promoted_nodes(
    cluster: OwnedCluster,
) -> None:
    """The job commit of the Spark writer (``NonstopWriter.commit``) over parts its
    tasks' writer staged (``PartitionWriter.stage``), without Spark around them."""
    oc = cluster
    table = _served(oc, "ABC")
    assert table is not None
    names = sorted(table)
    _load(oc, {f"o{i:03}": 1 for i in range(300)})
    new = {f"n{i:03}": 2 for i in range(200)}
    job = _staged_job(
        oc,
        [
            pa.table({"sku": list(new)[:120], "qty": [2] * 120}),
            pa.table({"sku": list(new)[120:], "qty": [2] * 80}),
        ],
    )
    job.commit(job.messages)  # type: ignore[attr-defined]
    expected = Counter(_expected_partition(s, names) for s in new)
    assert _counts(oc, "ABC") == expected
    assert _state(oc, "ABC") == new

    # An overwrite staged now, then SIGKILL of the node acting for the most partitions.
    staged = _staged_job(oc, [pa.table({"sku": [f"x{i:03}" for i in range(60)], "qty": [3] * 60})])
    victim = Counter(p["active"] for p in table.values()).most_common(1)[0][0]
    survivors = "".join(n for n in "ABC" if n != victim)
    oc.kill(victim)
    assert wait_until(lambda: _served(oc, survivors, replicas=False) is not None, 60)
    # The promoted replicas serve the overwritten set, not the old one.
    assert _counts(oc, survivors) == expected
    assert _state(oc, survivors) == new
    # The job staged before the kill: its parts were staged on each partition's
    # replicas too, so the promoted nodes swap them in (replicated in turn).
    staged.opts = _opts(oc, survivors)
    staged.commit(staged.messages)  # type: ignore[attr-defined]
    x = {f"x{i:03}": 3 for i in range(60)}
    assert _state(oc, survivors) == x
    assert _counts(oc, survivors) == Counter(_expected_partition(s, names) for s in x)


def _write(
    spark: Any, oc: OwnedCluster, rows: list[tuple[str, int]], mode: str, names: str = "ABC"
) -> None:
    df = spark.createDataFrame(rows, "sku string, qty long").repartition(3)
    w = df.write.format("nonstop").option("cluster", ",".join(oc.address(n) for n in names))
    w.option("type", ITEM).option("batch", 100).mode(mode).save()


@pytest.mark.long
def test_the_stream_sink_keeps_exactly_once_across_a_kill_between_micro_batches(
    tmp_path: Path,
) -> None:
    """A cluster of its own: micro-batch 0 committed, micro-batch 1 written but not
    committed (Spark failed before the sink's commit), rows of both changed by another
    writer, then SIGKILL of the node acting for the most partitions.  Once the replicas
    serve its partitions, Spark's replay of both batches skips every partition (their
    records were replicated with their rows), the other writer's values stand, and the
    next batch lands: count and sum as the source's."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    oc = OwnedCluster(tmp_path / "c", 3, apps=["tests.spark.model"], options={"ha": HA}, env=env)
    try:
        oc.start_all(timeout=90)
        assert wait_until(lambda: _served(oc, "ABC") is not None, 90)
        table = _served(oc, "ABC")
        assert table is not None
        names = sorted(table)

        def sink(nodes: str) -> NonstopStreamWriter:
            cluster = ",".join(oc.address(n) for n in nodes)
            opts = {"cluster": cluster, "type": "pipe.Plain", "stream": "k", "batch": "50"}
            return NonstopStreamWriter(Options.parse(opts), SCHEMA)

        def parts(rows: dict[str, int]) -> int:
            return len({_expected_partition(k, names) for k in rows})

        b0 = {f"k{i:03}": i for i in range(200)}
        b1 = {f"k{i:03}": i + 1000 for i in range(150, 350)}
        first = sink("ABC")
        _micro_batch(first, 0, b0)
        first.commit([], 0)
        _micro_batch(first, 1, b1)
        assert _plain(oc) == {**b0, **b1}
        _set_plain(oc, {"k000": -5, "k300": -7})  # another writer: a row of each batch

        victim = Counter(p["active"] for p in table.values()).most_common(1)[0][0]
        survivors = "".join(n for n in "ABC" if n != victim)
        oc.kill(victim)
        assert wait_until(lambda: _served(oc, survivors, replicas=False) is not None, 60)

        after = sink(survivors)  # Spark's restarted query runs batch 1 again
        for batch, rows in ((0, b0), (1, b1)):
            again = _micro_batch(after, batch, rows)
            assert (again.inserted, again.updated) == (0, 0)
            assert again.replayed >= parts(rows)  # (every partition, for each chunk of 50)
        after.commit([], 1)
        b2 = {f"k{i:03}": 1 for i in range(400, 450)}
        _micro_batch(after, 2, b2)
        after.commit([], 2)

        state = _plain(oc, survivors)
        source = {**b0, **b1, **b2, "k000": -5, "k300": -7}
        assert state == source
        assert (len(state), sum(state.values())) == (400, sum(source.values()))
    finally:
        oc.close()
