"""The floor of a PySpark Python data source: what Spark itself costs per row read.

    python -m bench.spark_source_floor                  # 200,000 rows, 3 rounds
    python -m bench.spark_source_floor --rows 1000000

``make bench-spark`` reads nonstop through PySpark 4's Python data source API
(``pyspark.sql.datasource``: Spark starts Python workers, each ``read`` yields
Arrow record batches, the JVM takes them over a socket).  This benchmark runs
the same query as the bench's read (``count(*)``, ``sum(balance)``,
``max(owner)``, ``max(number)`` over ``number`` bigint, ``owner`` string,
``balance`` bigint) on:

* **python-source** — a Python data source whose ``read`` yields Arrow batches
  built *before* the timing (no I/O, no decoding: nothing of nonstop), split in
  as many partitions as Spark has cores, the way nonstop splits a read;
* **parquet** — the same rows in local Parquet (the bench's peer).

The first is the best any Python data source can do on this machine, nonstop
included: nonstop's read ratio against Parquet cannot exceed
``python-source ÷ parquet``.  CPU per row is reported for Spark's JVM and its
Python workers, as in ``make bench-spark``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.spark_bench import _comm, _cpu, _descendants

RESULTS = Path(__file__).resolve().parent / "results" / "spark-source-floor.md"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_source_floor", description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=10_000, help="rows per Arrow batch yielded")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.rows < 1 or args.rounds < 1 or args.batch < 1:
        ap.error("--rows, --rounds and --batch must be at least 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("number", LongType(), True),
            StructField("owner", StringType(), True),
            StructField("balance", LongType(), True),
        ]
    )
    rows, batch = args.rows, args.batch

    class Range(InputPartition):
        def __init__(self, lo: int, hi: int) -> None:
            self.lo, self.hi = lo, hi

    class FloorReader(DataSourceReader):
        def __init__(self, parts: int) -> None:
            self.parts = parts

        def partitions(self) -> list[Range]:
            step = -(-rows // self.parts)
            return [Range(i, min(rows, i + step)) for i in range(0, rows, step)]

        def read(self, partition: Range) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
            # Built before the first yield: what is timed is Spark's side only
            # (the rows are built once per task, at most a few ms per 100,000).
            made = []
            for lo in range(partition.lo, partition.hi, batch):
                hi = min(partition.hi, lo + batch)
                ids = pa.array(range(lo, hi), pa.int64())
                made.append(
                    pa.RecordBatch.from_arrays(
                        [
                            ids,
                            pa.array([f"owner-{i % 1000}" for i in range(lo, hi)], pa.string()),
                            pa.array([i % 10007 for i in range(lo, hi)], pa.int64()),
                        ],
                        names=["number", "owner", "balance"],
                    )
                )
            yield from made

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "floor"

        def schema(self) -> StructType:
            return schema

        def reader(self, schema: StructType) -> DataSourceReader:
            return FloorReader(int(self.options.get("parts", "2")))

    load_before = os.getloadavg()[0]
    spark = (
        SparkSession.builder.master(args.master)
        .appName("nonstop-spark-source-floor")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    try:
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(FloorSource)
        cores = spark.sparkContext.defaultParallelism
        me = os.getpid()

        def spark_cpu() -> tuple[float, float]:
            pids = _descendants(me) - {me}
            jvm = {p for p in pids if _comm(p) == "java"}
            return _cpu(jvm), _cpu(pids - jvm)

        def query(df: Any) -> None:
            row = df.agg(F.count("*"), F.sum("balance"), F.max("owner"), F.max("number")).first()
            if row[0] != rows or row[3] != rows - 1:
                raise SystemExit(f"wrong answer: {row}")

        with tempfile.TemporaryDirectory(prefix="nonstop-floor-") as tmp:
            parquet = str(Path(tmp) / "p")
            src = spark.read.format("floor").option("parts", str(cores)).load()
            src.write.parquet(parquet)
            results: dict[str, list[tuple[float, float, float]]] = {}
            cases: dict[str, Callable[[], Any]] = {
                "python-source": lambda: (
                    spark.read.format("floor").option("parts", str(cores)).load()
                ),
                "parquet": lambda: spark.read.parquet(parquet),
            }
            for make in cases.values():
                query(make())  # warm: first-use costs (worker start, code load) not timed
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                for name, make in cases.items():
                    jvm0, py0 = spark_cpu()
                    t0 = time.perf_counter()
                    query(make())
                    wall = time.perf_counter() - t0
                    jvm1, py1 = spark_cpu()
                    results.setdefault(name, []).append(
                        (rows / wall, (jvm1 - jvm0) / rows * 1e6, (py1 - py0) / rows * 1e6)
                    )
    finally:
        spark.stop()
    load_after = os.getloadavg()[0]

    best = {k: max(v, key=lambda t: t[0]) for k, v in results.items()}
    floor_ratio = best["python-source"][0] / best["parquet"][0]
    median_source = statistics.median(t[0] for t in results["python-source"])
    given = argv if argv is not None else sys.argv[1:]
    lines = [
        "# The floor of a PySpark Python data source (what Spark costs per row read)",
        "",
        f"`{' '.join(['python -m bench.spark_source_floor', *given])}` on"
        f" {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC: {rows:,} rows,"
        f" {args.rounds} rounds, best shown, Spark `{args.master}` on {os.cpu_count()} CPUs"
        f" (load average {load_before:.2f} before, {load_after:.2f} after).",
        "",
        "The query of `make bench-spark`'s read (count, sum, two max) over a Python data"
        " source yielding prebuilt Arrow batches (nothing of nonstop) and over the same"
        " rows in local Parquet (`bench/spark_source_floor.py` says how).",
        "",
        "| source | rows/s | CPU µs/row, Spark JVM | CPU µs/row, Spark's Python workers |",
        "|---|---:|---:|---:|",
    ]
    for name, (rate, jvm, py) in best.items():
        lines.append(f"| {name} | {rate:,.0f} | {jvm:.2f} | {py:.2f} |")
    lines += [
        "",
        f"**A Python data source reads at most {floor_ratio:.2f}× local Parquet here**:"
        " nonstop's read, a Python data source, cannot do better than this ratio on this"
        " machine, whatever its nodes cost.",
        "",
        "Every round (rows/s): "
        + "; ".join(f"{k} " + ", ".join(f"{t[0]:,.0f}" for t in v) for k, v in results.items())
        + f" (median python-source {median_source:,.0f}).",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
