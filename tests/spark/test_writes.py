"""Write guarantees with Spark: retried tasks, atomic overwrite, the streaming sink."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from nonstop.bulk.handlers import decode_rows, encode_rows
from nonstop.client.bulk import BulkClient

ITEM = "pipe.Item"


def scan(address: str, fields: list[str]) -> dict[str, list[Any]]:
    with BulkClient(address) as c:
        reply = c.call("bulk.scan", type=ITEM, fields=fields)
    return decode_rows(reply["rows"], "columns")


def qty_of(address: str) -> dict[str, int]:
    cols = scan(address, ["sku", "qty"])
    return dict(zip(cols["sku"], cols["qty"], strict=True))


def save(df: Any, address: str, mode: str = "append", **options: str) -> None:
    w = df.write.format("nonstop").option("cluster", address).option("type", ITEM).mode(mode)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def test_append_is_idempotent_under_a_task_retry(spark: Any, endpoints: Any) -> None:
    (ep,) = endpoints(1)
    n = 2000
    rows = [(f"k{i:05}", i, "") for i in range(n)]
    # Partition 1 (rows 1000..1999) updates `boom` in its 6th batch: the node fails that
    # batch once (tests.spark.model.Flaky), after batches 1-5 committed and after
    # k01000 (in the first batch) was changed to -1.  Spark retries the task.
    rows[1500] = ("boom", 1, "k01000")
    with BulkClient(ep.address) as c:
        c.call("bulk.upsert", type="pipe.Flaky", rows=encode_rows({"sku": ["boom"]}))
    # parallelize slices deterministically: the retried task sees the same rows in order.
    df = spark.sparkContext.parallelize(rows, 2).toDF("sku string, qty long, poke string")
    df.write.format("nonstop").option("cluster", ep.address).option("type", "pipe.Flaky").option(
        "batch", "100"
    ).mode("append").save()
    with BulkClient(ep.address) as c:
        reply = c.call("bulk.scan", type="pipe.Flaky", fields=["sku", "qty"])
    cols = decode_rows(reply["rows"], "columns")
    got = dict(zip(cols["sku"], cols["qty"], strict=True))
    assert len(got) == n and got["boom"] == 1  # the retry got through
    # The retry replayed batch 1 of partition 1: its tag was recorded, so the change
    # made between the attempts survived (a blind re-apply would have undone it).
    assert got["k01000"] == -1
    assert all(got[k] == q for k, q, _ in rows if k not in ("boom", "k01000"))


def test_overwrite_is_atomic_for_a_concurrent_reader(spark: Any, endpoints: Any) -> None:
    (ep,) = endpoints(1)
    old = {f"o{i:05}" for i in range(3000)}
    new = {f"n{i:05}" for i in range(4000)}
    with BulkClient(ep.address) as c:
        c.call("bulk.upsert", type=ITEM, rows=encode_rows({"sku": sorted(old)}))
    seen: list[frozenset[str]] = []
    stop = threading.Event()

    def reader() -> None:
        with BulkClient(ep.address) as c:
            while not stop.is_set():
                reply = c.call("bulk.scan", type=ITEM, fields=["sku"])
                seen.append(frozenset(decode_rows(reply["rows"], "columns")["sku"]))

    t = threading.Thread(target=reader)
    t.start()
    try:
        df = spark.createDataFrame([(k, 1) for k in sorted(new)], "sku string, qty long")
        save(df.repartition(3), ep.address, mode="overwrite", batch="500")
    finally:
        stop.set()
        t.join(30)
    final = frozenset(scan(ep.address, ["sku"])["sku"])
    assert final == new
    assert len(seen) > 3 and set(seen) <= {frozenset(old), frozenset(new)}


def test_a_failed_overwrite_leaves_nothing_visible(spark: Any, endpoints: Any) -> None:
    (ep,) = endpoints(1)
    with BulkClient(ep.address) as c:
        c.call("bulk.upsert", type=ITEM, rows=encode_rows({"sku": ["keep1", "keep2"]}))

    def always_fails(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        yield from batches
        if ctx is not None and ctx.partitionId() == 1:
            raise RuntimeError("this partition never succeeds")

    df = spark.createDataFrame([(f"x{i}", i) for i in range(600)], "sku string, qty long")
    bad = df.repartition(2).mapInArrow(always_fails, df.schema)
    with pytest.raises(Exception, match="never succeeds"):
        save(bad, ep.address, mode="overwrite", batch="50")
    assert sorted(scan(ep.address, ["sku"])["sku"]) == ["keep1", "keep2"]
    # Null keys fail in the tasks, before the swap: nothing changes either.
    nulls = spark.createDataFrame([("y", 1), (None, 2)], "sku string, qty long").coalesce(1)
    with pytest.raises(Exception, match="null in key column"):
        save(nulls, ep.address, mode="overwrite")
    assert sorted(scan(ep.address, ["sku"])["sku"]) == ["keep1", "keep2"]


def test_streaming_sink_replay_of_a_batch_changes_nothing(
    spark: Any, endpoints: Any, tmp_path: Path
) -> None:
    (ep,) = endpoints(1)
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()

    def add_file(name: str, rows: list[tuple[str, int]]) -> None:
        (source / name).write_text("\n".join(json.dumps({"sku": s, "qty": q}) for s, q in rows))

    def run() -> None:
        q = (
            spark.readStream.schema("sku string, qty long")
            .option("maxFilesPerTrigger", 1)
            .json(str(source))
            .writeStream.format("nonstop")
            .option("cluster", ep.address)
            .option("type", ITEM)
            .option("stream", "orders")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)
        assert q.exception() is None

    add_file("a.json", [("s1", 1), ("s2", 2)])
    run()
    assert qty_of(ep.address) == {"s1": 1, "s2": 2}
    with BulkClient(ep.address) as c:
        assert c.call("bulk.stream.last", stream="orders") == {"batch": 0}
        c.call("bulk.upsert", type=ITEM, rows=encode_rows({"sku": ["s1"], "qty": [100]}))
    # Spark "crashed" after writing batch 0 but before its commit log entry: on restart
    # it runs batch 0 again.  The sink must recognise it and change nothing.
    shutil.rmtree(checkpoint / "commits")
    (checkpoint / "commits").mkdir()
    add_file("b.json", [("s3", 3)])
    run()
    assert qty_of(ep.address) == {"s1": 100, "s2": 2, "s3": 3}
    with BulkClient(ep.address) as c:
        assert c.call("bulk.stream.last", stream="orders") == {"batch": 1}
