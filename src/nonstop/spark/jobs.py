"""The pipeline jobs (J3): load files into a type, export to Parquet, import, audit.

Each job is a function of a SparkSession that returns a plain report (a dict);
``nonstop pipeline ...`` (``nonstop.admin.cli``) runs them with a progress
display.  A *source* of the audit is either a nonstop cluster — addresses
``"h:p,h:p"``, optionally ``"h:p#node"`` for the objects one node holds — or
the directory of a Parquet export.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from nonstop.bulk.handlers import REF_COLUMN
from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.errors import BadArgument, SchemaError

FORMATS = ("csv", "parquet", "json")
EXPORT_META = "_nonstop.json"
"""Written next to an export's Parquet files: type, per-node snapshots, row count."""
SAMPLE = 20

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def session(master: str = "local[*]", app: str = "nonstop-pipeline") -> SparkSession:
    """A Spark session set up for the pipeline (pushdown on, UI off, few shuffle partitions)."""
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from nonstop.spark import register

    register(spark)
    return spark


def read_type(spark: SparkSession, cluster: str, type_name: str, **options: str) -> DataFrame:
    """``spark.read.format("nonstop")`` of a type, with extra options."""
    reader = spark.read.format("nonstop").option("cluster", cluster).option("type", type_name)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _write(df: DataFrame, cluster: str, type_name: str, mode: str, **options: str) -> None:
    if mode not in ("append", "overwrite"):
        raise BadArgument(f"mode must be 'append' or 'overwrite', not {mode!r}")
    w = df.write.format("nonstop").option("cluster", cluster).option("type", type_name)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode(mode).save()


def _format_of(path: str, fmt: str | None) -> str:
    fmt = fmt or Path(path.rstrip("/")).suffix.lstrip(".").lower()
    if fmt in ("jsonl", "ndjson"):
        fmt = "json"
    if fmt not in FORMATS:
        raise BadArgument(f"cannot tell the format of {path!r}: give one of {FORMATS}")
    return fmt


def conform(df: DataFrame, target: Any, type_name: str) -> DataFrame:
    """Cast a file's columns to the type's Spark types (CSV gives strings, JSON longs...).

    A column that is not a field is a :class:`~nonstop.errors.SchemaError`.
    """
    fields = {f.name: f.dataType for f in target.fields if f.name != REF_COLUMN}
    unknown = [c for c in df.columns if c not in fields]
    if unknown:
        raise SchemaError(
            f"column(s) {', '.join(unknown)} of the input are not fields of {type_name} "
            f"(fields: {', '.join(fields)})"
        )
    return df.select([F.col(c).cast(fields[c]).alias(c) for c in df.columns])


def load(
    spark: SparkSession,
    cluster: str,
    type_name: str,
    path: str,
    *,
    fmt: str | None = None,
    mode: str = "append",
    progress: Progress = _quiet,
    **options: str,
) -> dict[str, Any]:
    """Load a CSV (with a header), Parquet or JSON-lines file/directory into a type."""
    fmt = _format_of(path, fmt)
    progress(f"reading {fmt} {path}")
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", "true")
    raw = reader.format(fmt).load(path)
    target = read_type(spark, cluster, type_name).schema
    df = conform(raw, target, type_name)
    rows = df.count()
    progress(f"writing {rows} rows into {type_name} ({mode})")
    started = time.monotonic()
    _write(df, cluster, type_name, mode, **options)
    seconds = time.monotonic() - started
    return {"type": type_name, "rows": rows, "mode": mode, "seconds": round(seconds, 3)}


def snapshots(cluster: str, type_name: str) -> dict[str, Any]:
    """Each node's current read snapshot id and object count of a type."""
    out = {}
    for node in cluster_nodes(cluster):
        if node.get("up", True):
            with BulkClient(node["address"]) as c:
                plan = c.call("bulk.plan", type=type_name)
            out[node["name"]] = {"snapshot": plan["snapshot"], "count": plan["count"]}
    return out


def export(
    spark: SparkSession,
    cluster: str,
    type_name: str,
    out: str,
    *,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Write a type to Parquet in ``out`` with ``_nonstop.json``: the node snapshots it
    was read at or after (each range is read from one snapshot of its node)."""
    before = snapshots(cluster, type_name)
    progress(f"exporting {type_name} to {out}")
    started = time.monotonic()
    df = read_type(spark, cluster, type_name)
    df.write.mode("overwrite").parquet(out)
    rows = spark.read.parquet(out).count()
    meta = {
        "type": type_name,
        "rows": rows,
        "nodes": before,
        "schema": df.schema.jsonValue(),
        "exported_at": time.time(),
    }
    Path(out, EXPORT_META).write_text(json.dumps(meta, indent=2))
    return {**meta, "seconds": round(time.monotonic() - started, 3)}


def import_(
    spark: SparkSession,
    cluster: str,
    type_name: str,
    path: str,
    *,
    mode: str = "append",
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Write a Parquet export back into a type (``append``: upsert; ``overwrite``: swap)."""
    meta_path = Path(path, EXPORT_META)
    if meta_path.exists():
        exported = json.loads(meta_path.read_text())["type"]
        if exported != type_name:
            raise SchemaError(f"{path} is an export of {exported}, not of {type_name}")
    df = spark.read.parquet(path)
    target = read_type(spark, cluster, type_name).schema
    df = conform(df.drop(REF_COLUMN), target, type_name)
    rows = df.count()
    progress(f"importing {rows} rows into {type_name} ({mode})")
    started = time.monotonic()
    _write(df, cluster, type_name, mode)
    return {
        "type": type_name,
        "rows": rows,
        "mode": mode,
        "seconds": round(time.monotonic() - started, 3),
    }


def read_source(spark: SparkSession, source: str, type_name: str) -> DataFrame:
    """An audit source: a Parquet export directory, or ``addresses[#node,...]``."""
    if os.path.isdir(source):
        return spark.read.parquet(source).drop(REF_COLUMN)
    addresses, _, nodes = source.partition("#")
    options = {"nodes": nodes} if nodes else {}
    return read_type(spark, addresses, type_name, **options)


def audit(
    spark: SparkSession,
    left: str,
    right: str,
    type_name: str,
    *,
    key: str | None = None,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Compare a type's objects in two sources by unique key: objects only on one side,
    and objects whose fields differ (with the fields).  ``key``: default the first
    unique key of the type."""
    a = read_source(spark, left, type_name)
    b = read_source(spark, right, type_name)
    if key is None:
        key = _unique_key(left if not os.path.isdir(left) else right, type_name, a.columns)
    cols = [c for c in a.columns if c in b.columns and c != key]
    if key not in a.columns or key not in b.columns:
        raise SchemaError(f"both sources need the key column {key!r}")
    progress(f"auditing {type_name} by {key}: {left} vs {right}")
    la = a.select(key, *[F.col(c).alias(f"l_{c}") for c in cols]).withColumn("_l", F.lit(True))
    rb = b.select(key, *[F.col(c).alias(f"r_{c}") for c in cols]).withColumn("_r", F.lit(True))
    joined = la.join(rb, on=key, how="full_outer")
    diff_cols = [F.when(~F.col(f"l_{c}").eqNullSafe(F.col(f"r_{c}")), F.lit(c)) for c in cols]
    joined = joined.withColumn("_diff", F.array_compact(F.array(*diff_cols)) if cols else F.array())
    only_left = joined.filter(F.col("_r").isNull())
    only_right = joined.filter(F.col("_l").isNull())
    differ = joined.filter(
        F.col("_l").isNotNull() & F.col("_r").isNotNull() & (F.size("_diff") > 0)
    )
    report = {
        "type": type_name,
        "key": key,
        "left": left,
        "right": right,
        "left_rows": a.count(),
        "right_rows": b.count(),
        "only_left": only_left.count(),
        "only_right": only_right.count(),
        "different": differ.count(),
        "samples": {
            "only_left": sorted(r[0] for r in only_left.select(key).limit(SAMPLE).collect()),
            "only_right": sorted(r[0] for r in only_right.select(key).limit(SAMPLE).collect()),
            "different": sorted(
                (r[0], list(r[1])) for r in differ.select(key, "_diff").limit(SAMPLE).collect()
            ),
        },
    }
    report["equal"] = report["only_left"] == report["only_right"] == report["different"] == 0
    return report


def check_type(cluster: str, type_name: str) -> dict[str, Any]:
    """Fail fast, before Spark starts: the cluster answers and knows the type."""
    node = _an_up_node(cluster.partition("#")[0])
    with BulkClient(node["address"]) as c:
        return c.call("bulk.schema", type=type_name)  # type: ignore[no-any-return]


def _an_up_node(addresses: str) -> dict[str, Any]:
    """The first node (by name) that is up, as the cluster's directory says."""
    nodes = cluster_nodes(addresses)
    return next((n for n in nodes if n.get("up", True)), nodes[0])


_NONSTOP_ERROR = re.compile(r"nonstop\.errors\.(\w+): (.*)")


def error_message(exc: BaseException) -> str:
    """The nonstop error inside a Spark exception (its Python traceback text), else its
    first line."""
    text = str(exc)
    found = _NONSTOP_ERROR.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    lines = text.strip().splitlines()
    return lines[0] if lines else repr(exc)


def _unique_key(cluster: str, type_name: str, columns: list[str]) -> str:
    if os.path.isdir(cluster):
        raise BadArgument("give --key when both audit sources are exports")
    addresses = cluster.partition("#")[0]
    node = _an_up_node(addresses)
    with BulkClient(node["address"]) as c:
        uniques = c.call("bulk.schema", type=type_name)["unique"]
    for k in uniques:
        if k in columns:
            return str(k)
    raise SchemaError(f"{type_name} has no unique key to match objects by; give --key")
