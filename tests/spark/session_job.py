"""A Spark job run in a process of its own by the tests (``python session_job.py
MODE CLUSTER``): what a user's script does, in three ways.

* ``zero``: the session is created first and nothing of nonstop is imported in
  this process: ``format("nonstop")`` must be found by PySpark's discovery of
  ``pyspark_nonstop``; it writes, reads, and reads with filters with pushdown
  on and off.
* ``import-first``: ``import nonstop.spark`` and then the session (run without
  ``PYSPARK_PYTHON`` and without the virtualenv on PATH: the import makes the
  workers run this interpreter).
* ``session-first``: the session, then ``import nonstop.spark`` (same
  environment): fails at once saying what to set.
* ``spark://HOST:PORT``: the ``zero`` job on that Spark standalone master (nothing of
  nonstop imported in the driver either).

Prints one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys

ITEM = "pipe.Item"


def session(pushdown: bool = False, master: str = "local[1]"):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if master.startswith("spark://"):  # the executors' Python: where nonstop is installed
        builder = builder.config("spark.pyspark.python", sys.executable).config(
            "spark.pyspark.driver.python", sys.executable
        )
    return (
        builder.master(master)
        .config("spark.executor.memory", "512m")
        .config("spark.cores.max", "2")
        .appName("nonstop-session-job")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
        .getOrCreate()
    )


def write_and_read(spark, cluster: str) -> dict:  # type: ignore[no-untyped-def,type-arg]
    rows = [(f"z{i:03}", i) for i in range(100)]
    df = spark.createDataFrame(rows, "sku string, qty long")
    df.write.format("nonstop").option("cluster", cluster).option("type", ITEM).mode("append").save()
    back = spark.read.format("nonstop").option("cluster", cluster).option("type", ITEM).load()
    out = {
        "count": back.count(),
        "qty7": [r.qty for r in back.filter(back.sku == "z007").collect()],
    }
    unpushed = back.filter((back.qty >= 10) & (back.qty < 13))
    out["unpushed"] = sorted(r.qty for r in unpushed.collect())
    out["plan_off"] = unpushed._jdf.queryExecution().executedPlan().toString()
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    back = spark.read.format("nonstop").option("cluster", cluster).option("type", ITEM).load()
    filtered = back.filter((back.qty >= 10) & (back.qty < 13))
    out["pushed"] = sorted(r.qty for r in filtered.collect())
    out["plan"] = filtered._jdf.queryExecution().executedPlan().toString()
    return out


def main() -> None:
    mode, cluster = sys.argv[1], sys.argv[2]
    if mode == "zero":
        spark = session()
        out = write_and_read(spark, cluster)
        out["nonstop_imported"] = any(m.split(".")[0] == "nonstop" for m in sys.modules)
    elif mode == "import-first":
        import nonstop.spark

        spark = session()
        out = write_and_read(spark, cluster)
    elif mode.startswith("spark://"):  # a standalone Spark cluster's master
        spark = session(master=mode)
        out = write_and_read(spark, cluster)
        out["nonstop_imported"] = any(m.split(".")[0] == "nonstop" for m in sys.modules)
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
        out["executors"] = int(executors) - 1  # (the driver is counted too)
    elif mode == "session-first":
        spark = session()
        try:
            import nonstop.spark  # noqa: F401
        except Exception as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        else:
            out = {"error": None}
    else:
        raise SystemExit(f"unknown mode {mode}")
    spark.stop()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
