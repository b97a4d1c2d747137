"""Node CPU per row of a Spark load and overwrite routed by partition, without Spark.

``python -m bench.partition_bulk_profile [--rows 40000] [--py-spy DIR] [--other-client]
[--nonstop-option ...]``

A local 3-node cluster as ``make bench-spark`` starts it (the demo bank's
``Account``, fsync on, routing by partition: 16 partitions, one sync replica),
driven by the Spark task's own writer (``spark/partition_writes.PartitionWriter``)
from this process, so that only the nodes' work is measured (data-path.md
§6.5-6.6, performance.md §5):

* **load**: ``--rows`` rows appended in batches of 5,000 (``write``: ``bulk.route``,
  then one ``tx.upsert`` + ``tx.commit`` per active node);
* **stage**: as many new rows staged for an overwrite by four "tasks"
  (``stage``: ``bulk.overwrite.part`` on each partition's holders);
* **swap**: the job commit (``NonstopWriter.commit``: ONE distributed transaction
  over the 16 partitions deleting the old rows and creating the staged ones).

Each step prints its wall time and the three nodes' CPU (user + system, from
``/proc``) per row.  ``--py-spy DIR`` records each node with ``py-spy record --gil``
during each step (``DIR/<step>-<node>.txt``, collapsed stacks: ``py-spy`` must be
on PATH or beside this Python).  ``--other-client``: during each step a second
client attached to node C commits a small transaction (one ``Transfer`` created) every
20 ms; each step then also prints that client's commit latency (median, p99, max), its
errors, and the commits and prepares the nodes parked while a lease lapsed
(``lapses_waited``: a lapse is a lease renewal through the cluster log that came late).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BATCH = 5_000
TYPE = "nonstop.demos.bank.Account"
TASKS = 4


def _cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) of ``pids`` so far."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        sys.exit("--py-spy needs py-spy (pip install py-spy)")
    return found


class OtherClient:
    """Small transactions through node C while a step runs: their latency is what another
    application sees of the bulk work (issue 12: long work never blocks a node)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.steps = 0
        """Steps timed so far: each step's transfers get tids of their own."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.latencies, self.errors = [], []
        self.steps += 1
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> str:
        self._stop.set()
        self._thread.join(60)
        lat = sorted(self.latencies)
        if not lat:
            return f"other client: no commit, errors {self.errors[:3]}"
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return (
            f"other client: {len(lat)} commits, median {statistics.median(lat) * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms, errors {len(self.errors)}"
            + (f" ({self.errors[0]})" if self.errors else "")
        )

    def _run(self) -> None:
        import nonstop
        from nonstop.demos.bank import Transfer

        n = 0
        with nonstop.connect([self.address], balance="first") as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    with client.transaction() as tx:
                        tx.create(Transfer, tid=f"other-{self.steps}-{n}", src=0, dst=0, amount=0)
                except nonstop.errors.Error as exc:
                    at = time.strftime("%H:%M:%S", time.gmtime())
                    self.errors.append(f"{type(exc).__name__} at {at} UTC: {exc}")
                else:
                    self.latencies.append(time.monotonic() - started)
                n += 1
                self._stop.wait(0.02)


def _lapses(addresses: list[str]) -> int:
    """The commits and prepares the nodes parked while their lease lapsed, so far."""
    from nonstop.client import Client

    total = 0
    for address in addresses:
        with Client([address], timeout=10, rounds=1) as one:
            stats = one.request({"op": "runtime_stats"})
        total += int(stats.get("replication", {}).get("lapses_waited", 0))
    return total


class Step:
    """Time a step, count the nodes' CPU over it, and record them with py-spy if asked."""

    def __init__(
        self,
        name: str,
        rows: int,
        pids: dict[str, int],
        spy: Path | None,
        other: OtherClient | None = None,
        addresses: list[str] | None = None,
    ) -> None:
        self.name, self.rows, self.pids, self.spy = name, rows, pids, spy
        self.other, self.addresses = other, addresses or []
        self.recorders: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Step:
        if self.spy is not None:
            exe = _py_spy()
            for node, pid in self.pids.items():
                out = self.spy / f"{self.name}-{node}.txt"
                cmd = [exe, "record", "--gil", "--nonblocking", "-r", "100", "-f", "raw"]
                self.recorders.append(
                    subprocess.Popen(
                        [*cmd, "-p", str(pid), "-o", str(out)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        if self.other is not None:
            self.lapses = _lapses(self.addresses)
            self.other.start()
        self.cpu = _cpu(list(self.pids.values()))
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        seconds = time.monotonic() - self.started
        cpu = _cpu(list(self.pids.values())) - self.cpu
        for r in self.recorders:
            r.send_signal(signal.SIGINT)
        for r in self.recorders:
            r.wait(60)
        if exc[0] is None:
            print(
                f"{self.name}: {self.rows:,} rows in {seconds:.2f} s ({self.rows / seconds:,.0f}"
                f" rows/s), nodes' CPU {cpu / self.rows * 1e6:.1f} µs/row",
                flush=True,
            )
        if self.other is not None:
            line = self.other.stop()
            lapses = _lapses(self.addresses) - self.lapses
            print(f"  {line}; lease lapses waited out: {lapses}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=40_000)
    p.add_argument("--py-spy", type=Path, default=None, help="a directory for the profiles")
    p.add_argument("--nonstop-option", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument(
        "--other-client", action="store_true", help="time a second client's commits meanwhile"
    )
    args = p.parse_args(argv)

    import pyarrow as pa

    from bench.spark_bench import node_options, wait_served
    from nonstop.admin.owned import OwnedCluster
    from nonstop.client.bulk import cluster_nodes
    from nonstop.demos.bank import Account
    from nonstop.model.managed import type_info
    from nonstop.spark.partition_writes import PartitionWriter
    from nonstop.spark.schema import Options
    from nonstop.spark.source import NonstopWriter, WriteStats

    options = node_options(args.nonstop_option)
    options.setdefault("ha", {}).setdefault("data", "partitions")
    if options["ha"]["data"] != "partitions":
        sys.exit("this profile drives the writer of routing by partition")
    if args.py_spy is not None:
        args.py_spy.mkdir(parents=True, exist_ok=True)
    n = args.rows - args.rows % (BATCH * TASKS) or BATCH * TASKS
    tmp = Path(tempfile.mkdtemp(prefix="nonstop-partition-profile-"))
    print(f"3-node cluster in {tmp}, load average {os.getloadavg()[0]:.2f}", flush=True)
    with OwnedCluster(tmp / "c", 3, apps=["nonstop.demos.bank"], options=options) as oc:
        oc.start_all(timeout=90)
        os.environ.setdefault("NONSTOP_CREDENTIALS", str(oc.lc.credentials_path))
        wait_served(oc)
        opts = Options.parse({"cluster": ",".join(oc.addresses), "type": TYPE})
        version = type_info(Account).version

        other = OtherClient(oc.address("C")) if args.other_client else None
        steps = {"other": other, "addresses": oc.addresses}

        def writer() -> PartitionWriter:
            return PartitionWriter(opts, cluster_nodes(opts.cluster), "number", version)

        def rows(first: int, count: int) -> Any:
            numbers = list(range(first, first + count))
            owners = [f"owner-{i % 1000}" for i in numbers]
            return pa.table({"number": numbers, "owner": owners, "balance": [1] * count})

        with Step("load", n, oc.pids, args.py_spy, **steps):
            w = writer()
            try:
                for b in range(0, n, BATCH):
                    w.write(rows(b, BATCH))
            finally:
                w.close()
        schema = _schema()
        job = NonstopWriter(opts, schema, overwrite=True)
        stats: list[WriteStats] = []
        with Step("stage", n, oc.pids, args.py_spy, **steps):
            share = n // TASKS
            for task in range(TASKS):
                w = writer()
                try:
                    w.stage(rows(n + task * share, share), job.job, f"{task}/0/0/")
                finally:
                    w.close()
                s = WriteStats(partition=task, rows=share)
                s.staged = [[name, tag] for tag, name in sorted(w.staged.items())]
                stats.append(s)
        with Step("swap", n, oc.pids, args.py_spy, **steps):
            job.commit(stats)  # type: ignore[arg-type]
    print(f"load average after {os.getloadavg()[0]:.2f}", flush=True)


def _schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("number", LongType()),
            StructField("owner", StringType()),
            StructField("balance", LongType()),
        ]
    )


if __name__ == "__main__":
    main()
