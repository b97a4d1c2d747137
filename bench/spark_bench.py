"""Spark ↔ nonstop throughput, side by side with Spark ↔ local Parquet and Spark ↔ PostgreSQL.

``python -m bench.spark_bench [--rows 200000] [--rounds 2] [--out bench/results/spark.md]
[--nonstop-option ha.data=partitions ...]``

One run, one Spark session (``--master``, default ``local[*]``), three systems:

* **nonstop**: a local 3-node cluster (``OwnedCluster``, fsync on) with the demo
  bank's ``Account`` (``number`` int unique key, ``owner`` str, ``balance`` int);
  load = ``df.write.format("nonstop").mode("append")`` into an empty type (batched
  upsert transactions, 10,000 rows each); read = ``spark.read.format("nonstop")``.
* **Parquet** (the floor): ``df.write.parquet`` / ``spark.read.parquet`` on local disk.
* **PostgreSQL** over Spark's JDBC source (Debian's server on 127.0.0.1, fsync and
  synchronous_commit on; the table has the same primary key): load with
  ``batchsize=10000`` and ``reWriteBatchedInserts=true``; read partitioned on the
  key into as many partitions as Spark has cores.

Every round measures each system's load then read, interleaved, from the same
cached DataFrame, then an overwrite of the full set by the full set (nonstop:
``mode("overwrite")``, one distributed transaction; PostgreSQL: JDBC
``mode("overwrite")`` with ``truncate=true``); each round after the first starts
by overwriting the full set with an empty frame (timed, the same two ways). A read
aggregates all three columns (so Parquet cannot skip columns) and is checked
against the data.  The first round reads each system once before its
timed reads: the first read of a session through a Python data source pays
~3 s of Spark's JVM warming up (its JIT compiling the Arrow-to-rows path; a
source that yields batches from memory pays it too), and the first read of all
warms the aggregation for the others; these first reads are reported apart.
``--nonstop-option SECTION.KEY=VALUE`` (repeatable) sets an option of every node's
configuration, e.g. ``ha.data=partitions``: the cluster then routes by partition (16
partitions, one sync replica), and its report goes to ``spark-partitions.md`` unless
``--out`` says otherwise; the rounds start once every partition is served.  The report
says whether any node's failure detector suspected a peer during the rounds.
The report gives the best round of each cell and the ratios the issue asks for:
load ≥ PostgreSQL-over-JDBC, read ≥ 50% of local Parquet.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JDBC_JAR = "/usr/share/java/postgresql.jar"
TYPE = "nonstop.demos.bank.Account"
IDLE_SAMPLE = 3.0
"""Seconds the idle nodes' CPU is sampled for before the rounds."""


def _git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True
    )
    return out.stdout.decode().strip() + (" (src modified)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--nonstop-option",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="an option of every node's configuration, e.g. ha.data=partitions",
    )
    args = p.parse_args(argv)
    options = node_options(args.nonstop_option)
    # Routing by node unless told (`--nonstop-option ha.data=partitions`, the nodes'
    # default): `make bench-spark` runs both, one after the other.
    options.setdefault("ha", {}).setdefault("data", "nodes")
    if args.out is None:
        name = "spark-partitions.md" if options["ha"]["data"] == "partitions" else "spark.md"
        args.out = str(ROOT / "bench" / "results" / name)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not Path(JDBC_JAR).exists():
        sys.exit(
            f"{JDBC_JAR} is missing: PostgreSQL's JDBC driver (Debian: apt-get install "
            "libpostgresql-jdbc-java) is what Spark's JDBC source is measured with"
        )

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from bench.pg_peer import PostgresPeer
    from nonstop.admin.owned import OwnedCluster

    load_before = os.getloadavg()
    cpus: dict[str, list[tuple[float, float, float]]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="nonstop-spark-bench-"))
    n = args.rows
    print(f"starting a 3-node cluster and PostgreSQL in {tmp}", file=sys.stderr)
    with OwnedCluster(tmp / "cluster", 3, apps=["nonstop.demos.bank"], options=options) as oc:
        oc.start_all(timeout=90)
        # The nodes require a user (docs/security.md): the data source, in this
        # process and in Spark's Python workers, finds the folder's admin credential
        # through the environment they inherit (as the demo does).
        os.environ.setdefault("NONSTOP_CREDENTIALS", str(oc.lc.credentials_path))
        if options.get("ha", {}).get("data") == "partitions":
            wait_served(oc)
        pg = PostgresPeer(accounts=0)  # its own dir: the server user must reach it
        try:
            import psycopg

            with psycopg.connect(pg.dsn, autocommit=True) as con:
                con.execute(
                    "CREATE TABLE bench_accounts (number bigint PRIMARY KEY, owner text NOT NULL,"
                    " balance bigint NOT NULL)"
                )
            spark = (
                SparkSession.builder.master(args.master)
                .appName("nonstop-spark-bench")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "4")
                .config("spark.jars", JDBC_JAR)
                .config("spark.driver.extraClassPath", JDBC_JAR)
                .config("spark.sql.session.timeZone", "UTC")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            import nonstop.spark

            nonstop.spark.register(spark)
            cores = spark.sparkContext.defaultParallelism
            cluster = ",".join(oc.addresses)
            jdbc_url = f"jdbc:postgresql://127.0.0.1:{pg.port}/postgres?reWriteBatchedInserts=true"
            jdbc = {
                "url": jdbc_url,
                "dbtable": "bench_accounts",
                "user": "postgres",
                "driver": "org.postgresql.Driver",
            }
            df = (
                spark.range(n)
                .selectExpr(
                    "id AS number", "concat('owner-', id % 1000) AS owner", "id % 10007 AS balance"
                )
                .repartition(cores)
                .cache()
            )
            df.count()
            expected = df.agg(F.sum("balance"), F.max("owner")).first()
            assert expected is not None
            empty = spark.createDataFrame([], df.schema)
            parquet = str(tmp / "parquet")

            def nonstop_write(mode: str, data: Any) -> None:
                (
                    data.write.format("nonstop")
                    .option("cluster", cluster)
                    .option("type", TYPE)
                    .mode(mode)
                    .save()
                )

            def check(read: Any) -> None:
                got = read.agg(F.count("*"), F.sum("balance"), F.max("owner"), F.max("number"))
                row = got.first()
                assert row[0] == n and row[1] == expected[0] and row[2] == expected[1], row
                assert row[3] == n - 1, row

            def pg_truncate() -> None:
                with psycopg.connect(pg.dsn, autocommit=True) as con:
                    con.execute("TRUNCATE bench_accounts")

            def jdbc_read() -> Any:
                r = spark.read.format("jdbc").options(**jdbc)
                r = r.option("partitionColumn", "number").option("lowerBound", 0)
                return r.option("upperBound", n).option("numPartitions", cores).load()

            cells: dict[str, list[float]] = {}
            node_pids = set(oc.pids.values())
            # What the idle nodes burn (keep-alives every 0.1 s, lease renewals): taken
            # out of their CPU per row, which would otherwise grow with the wall time.
            idle_before = _cpu(node_pids)
            time.sleep(IDLE_SAMPLE)
            idle_rate = (_cpu(node_pids) - idle_before) / IDLE_SAMPLE

            def spark_cpu() -> tuple[float, float]:
                """CPU seconds of Spark's JVM and of its Python workers so far."""
                pids = _descendants(os.getpid()) - node_pids - {os.getpid()}
                jvm = {p for p in pids if _comm(p) == "java"}
                return _cpu(jvm), _cpu(pids - jvm)

            def timed(name: str, fn: Any) -> None:
                before = (_cpu(node_pids), *spark_cpu())
                started = time.perf_counter()
                fn()
                seconds = time.perf_counter() - started
                after = (_cpu(node_pids), *spark_cpu())
                nodes_us = (after[0] - before[0] - idle_rate * seconds) / n * 1e6
                jvm_us = (after[1] - before[1]) / n * 1e6
                python_us = (after[2] - before[2]) / n * 1e6
                cells.setdefault(name, []).append(n / seconds)
                cpus.setdefault(name, []).append((nodes_us, jvm_us, python_us))
                print(
                    f"  {name}: {n / seconds:,.0f} rows/s ({seconds:.2f} s), CPU µs/row: "
                    f"nodes {nodes_us:.1f}, JVM {jvm_us:.1f}, Python workers {python_us:.1f}",
                    file=sys.stderr,
                )

            def jdbc_overwrite(data: Any) -> None:
                w = data.write.format("jdbc").options(**jdbc).option("truncate", "true")
                w.option("batchsize", 10000).mode("overwrite").save()

            rounds_started = time.time()
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                if r == 0:
                    nonstop_write("overwrite", empty)  # (an empty type: nothing to time)
                else:  # the full set replaced by an empty frame
                    timed("empty nonstop", lambda: nonstop_write("overwrite", empty))
                    timed("empty postgresql", lambda: jdbc_overwrite(empty))
                timed("load nonstop", lambda: nonstop_write("append", df))
                timed("load parquet", lambda: df.write.mode("overwrite").parquet(parquet))
                pg_truncate()
                timed(
                    "load postgresql",
                    lambda: (
                        df.write.format("jdbc")
                        .options(**jdbc)
                        .option("batchsize", 10000)
                        .mode("append")
                        .save()
                    ),
                )
                reads = {
                    "nonstop": lambda: check(
                        spark.read.format("nonstop")
                        .option("cluster", cluster)
                        .option("type", TYPE)
                        .load()
                    ),
                    "parquet": lambda: check(spark.read.parquet(parquet)),
                    "postgresql": lambda: check(jdbc_read()),
                }
                if r == 0:  # (module doc: the first read of a session, apart)
                    for system, read in reads.items():
                        timed(f"first read {system}", read)
                for system, read in reads.items():
                    timed(f"read {system}", read)
                # The full set replaced by the full set (one transaction each).
                timed("overwrite nonstop", lambda: nonstop_write("overwrite", df))
                timed("overwrite postgresql", lambda: jdbc_overwrite(df))
            spark.stop()
            verdicts = suspicions(
                {name: oc.lc.dir / name / "node.log" for name in oc.names}, rounds_started
            )
        finally:
            pg.stop()
    load_after = os.getloadavg()
    best = {k: max(v) for k, v in cells.items()}
    write_report(
        args, n, cores, best, cells, load_before, load_after, pg.version, cpus, idle_rate, verdicts
    )


def node_options(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """``["ha.data=partitions", ...]`` -> ``{"ha": {"data": "partitions"}}`` (ints and
    true/false parsed)."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not section or not name:
            sys.exit(f"--nonstop-option {pair!r}: expected SECTION.KEY=VALUE")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        elif raw.lstrip("-").isdigit():
            value = int(raw)
        out.setdefault(section, {})[name] = value
    return out


def wait_served(oc: Any, timeout: float = 120.0) -> None:
    """Until every partition's active node acts for it with its replicated copy loaded
    (a load started earlier meets NotActive and retries: not what is measured)."""
    from nonstop.client.bulk import BulkClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            statuses = {}
            for name in oc.names:
                with BulkClient(oc.address(name), timeout=10) as c:
                    statuses[name] = c.call("status")
            parts = next(iter(statuses.values())).get("partitions") or []
            if parts and all(
                p["name"] in statuses.get(p["active"], {}).get("acting", [])
                and p["name"] in statuses[p["active"]]["replication"]["ready"]
                for p in parts
            ):
                return
        except Exception:  # (starting: not answering yet)
            pass
        time.sleep(0.5)
    sys.exit(f"the partitions were not all served after {timeout:.0f} s")


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it (Spark's JVM and its Python workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cpu(pids: set[int]) -> float:
    """CPU seconds (user + system, all threads) the live processes ``pids`` used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited (its CPU is lost to this count)
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def write_report(
    args: Any,
    n: int,
    cores: int,
    best: dict[str, float],
    cells: dict[str, list[float]],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    pg_version: str,
    cpus: dict[str, list[tuple[float, float, float]]],
    idle_rate: float = 0.0,
    verdicts: list[str] | None = None,
) -> None:
    import pyspark

    load_ratio = best["load nonstop"] / best["load postgresql"]
    read_ratio = best["read nonstop"] / best["read parquet"]
    lines = [
        "# Spark pipeline benchmark",
        "",
        f"`{' '.join(['python -m bench.spark_bench', *(argv_of(args))])}`",
        "",
        f"- {n:,} rows (`number` bigint key, `owner` string, `balance` bigint), "
        f"{args.rounds} interleaved rounds, best round shown",
        f"- Spark {pyspark.__version__} `{args.master}` ({cores} cores), Python "
        f"{platform.python_version()}, PostgreSQL {pg_version} + JDBC `{JDBC_JAR}`",
        "- nonstop: local 3-node cluster, fsync on"
        + (
            f" ({', '.join(args.nonstop_option)}: 16 partitions, one sync replica)"
            if args.nonstop_option
            else ""
        )
        + "; PostgreSQL fsync and synchronous_commit on",
        f"- load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"(on {os.cpu_count()} CPUs shared with other work)",
        f"- source commit {_git_commit()}",
        "",
        "| operation | nonstop | Parquet (local) | PostgreSQL (JDBC) |",
        "|---|---:|---:|---:|",
    ]
    for op in ("load", "read", "first read", "overwrite", "empty"):
        row = [
            f"{best[f'{op} {s}']:,.0f}" if f"{op} {s}" in best else "—"
            for s in ("nonstop", "parquet", "postgresql")
        ]
        lines.append(f"| {op} (rows/s) | {' | '.join(row)} |")
    over_ratio = best["overwrite nonstop"] / best["overwrite postgresql"]
    empty_ratio = (
        best["empty nonstop"] / best["empty postgresql"] if "empty nonstop" in best else None
    )
    lines += [
        "",
        "| goal | ratio | met |",
        "|---|---:|---|",
        f"| load ≥ PostgreSQL over JDBC | {load_ratio:.2f} | {_yes(load_ratio >= 1)} |",
        f"| read ≥ 50% of local Parquet | {read_ratio:.2f} | {_yes(read_ratio >= 0.5)} |",
        f"| overwrite (full by full) ≥ PostgreSQL JDBC `truncate=true` | {over_ratio:.2f} | "
        f"{_yes(over_ratio >= 1)} |",
        *(
            [
                f"| overwrite by an empty frame ≥ PostgreSQL JDBC `truncate=true` | "
                f"{empty_ratio:.2f} | {_yes(empty_ratio >= 1)} |"
            ]
            if empty_ratio is not None
            else []
        ),
        "",
        "Every round (rows/s):",
        "",
    ]
    for k, v in cells.items():
        lines.append(f"- {k}: " + ", ".join(f"{x:,.0f}" for x in v))
    lines += [
        "",
        "CPU µs per row, every round (nonstop nodes / Spark's JVM / Spark's Python workers;",
        "the PostgreSQL server's CPU is not counted; the nodes' idle CPU, "
        f"{idle_rate:.1%} of a core for the three measured {IDLE_SAMPLE:.0f} s before the "
        "rounds, is taken out of theirs; a Python worker that exits during a step takes its",
        "CPU with it, which can make a Python figure negative):",
        "",
    ]
    for k, per_round in cpus.items():
        lines.append(f"- {k}: " + ", ".join(" / ".join(f"{x:.1f}" for x in t) for t in per_round))
    if verdicts is not None:
        lines += [
            "",
            "Failure detector, from the first round to the last (every node's log): "
            + (
                "no node suspected or seen Down."
                if not verdicts
                else f"{len(verdicts)} suspicion(s) or Down verdict(s):"
            ),
            *(f"- {v}" for v in verdicts[:20]),
        ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_report(Path(args.out), lines, keep_history=Path(args.out).name == "spark-partitions.md")
    print("\n".join(lines))


def save_report(out: Path, lines: list[str], keep_history: bool) -> None:
    """The report replaces ``out``; with ``keep_history`` (``spark-partitions.md``, the run
    by partition, whose file keeps every earlier run's notes) it goes on top, as a dated
    section, the older sections below it."""
    if not keep_history or not out.exists():
        out.write_text("\n".join(lines) + "\n")
        return
    old = out.read_text().splitlines()
    title = old[0] if old and old[0].startswith("# ") else lines[0]
    rest = old[1:] if old and old[0].startswith("# ") else old
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = [f"## {stamp}: `make bench-spark`", *lines[1:]]
    out.write_text("\n".join([title, "", *body, *rest]) + "\n")


SUSPECTED = frozenset({"InDownNotifier", "Down"})
"""The failure detector's states of a peer it suspects or declared Down."""


def suspicions(logs: dict[str, Path], since: float) -> list[str]:
    """Every suspicion or Down verdict the nodes logged from ``since`` (epoch seconds)."""
    from nonstop.node.log_events import iso_utc, read_events

    found = []
    for name, log in logs.items():
        with log.open() as lines:
            for event in read_events(lines, name):
                notify = event.fields.get("notify") or {}
                if (
                    event.time >= since
                    and notify.get("kind") == "node_state"
                    and notify.get("new") in SUSPECTED
                ):
                    found.append(
                        f"{name} saw {notify.get('peer')} {notify['new']} at {iso_utc(event.time)}"
                    )
    return found


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def argv_of(args: Any) -> list[str]:
    out = [f"--rows {args.rows}", f"--rounds {args.rounds}", f"--master {args.master}"]
    return out + [f"--nonstop-option {o}" for o in args.nonstop_option]


if __name__ == "__main__":
    main()
