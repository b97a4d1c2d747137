"""``python -m bench.metrics_bench``: what the metrics cost (issue 11, G6).

Two measurements, written to ``bench/results/metrics.md``:

1. **A scrape at 1,000 series.**  A registry of the node's kind (a custom
   collector that builds its families at scrape time, like
   :class:`nonstop.node.metrics.NodeCollector`) with exactly 1,000 samples:
   counters and gauges with bounded labels and histograms.  Timed: the
   library's exposition (``generate_latest``) alone, wall and CPU per scrape,
   and a whole HTTP scrape through the node's handler
   (:mod:`nonstop.node.metrics_http`) on an asyncio loop.  Then a real node's
   scrape over HTTP: its series count, the scraper's wall time and the node's
   CPU per scrape (``/proc``, minus the node's idle CPU over the same time).
2. **The data path with metrics on and off.**  Two one-node clusters in the
   same run, one serving metrics (scraped every second, a tighter interval
   than Prometheus' usual 15 s) and one without (``metrics.listen`` unset,
   so the data service has no observer); asyncio clients sharing one handle
   run bank transfers between two accounts of the node (a local group commit
   each), in alternating slices: off, on, off, on...  Reported: transfers/s
   and the node's CPU per transfer for each side.

The group-commit histograms and the lock table's counters are always kept
(they are plain integer increments, off the event loop); the embedded local
benchmark (``python -m bench.run --only local --quick``) measures them,
against main, as the brief asks; see the report.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import os
import random
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

import nonstop
from bench.pg_peer import proc_cpu
from nonstop.admin.owned import OwnedCluster
from nonstop.adminapi.principal import Directory, verifier_matches
from nonstop.adminapi.tokens import SessionTokens
from nonstop.client.credentials import load_credentials
from nonstop.demos.bank import START_BALANCE, Account, transfer_async
from nonstop.net.auth import make_verifier
from nonstop.node.metrics import histogram
from nonstop.node.metrics_auth import MetricsGate
from nonstop.node.metrics_http import serve_metrics

RESULTS = Path(__file__).parent / "results" / "metrics.md"
SERIES = 1000


class SyntheticCollector(Collector):
    """Exactly ``SERIES`` samples built at each scrape, shaped like a node's families."""

    def collect(self) -> Iterable[Metric]:
        rng = random.Random(1)
        made = 0
        # 20 histograms of 13 buckets (with +Inf) plus _count and _sum: 15 samples each = 300
        for h in range(20):
            counts = [rng.randrange(1000) for _ in range(13)]
            bounds = [0.0005 * 2**i for i in range(12)]
            yield histogram(f"synthetic_h{h}_seconds", "a histogram", bounds, counts, 1.5)
            made += len(counts) + 2  # the buckets (+Inf included), _count, _sum
        # counters and gauges with one bounded label: 10 series each
        i = 0
        while made < SERIES:
            family: Any = (CounterMetricFamily if i % 2 else GaugeMetricFamily)(
                f"nonstop_synthetic_{i}", "a family", labels=["kind"]
            )
            for k in range(min(10, SERIES - made)):
                family.add_metric([f"k{k}"], rng.randrange(10**6))
                made += 1
            yield family
            i += 1


def synthetic_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SyntheticCollector())
    return registry


def count_series(text: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(text))


def time_exposition(registry: CollectorRegistry, n: int) -> dict[str, float]:
    walls = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        generate_latest(registry)
        walls.append(time.perf_counter() - t0)
    cpu = time.process_time() - cpu0
    return {
        "p50_ms": statistics.median(walls) * 1e3,
        "p99_ms": sorted(walls)[int(0.99 * (n - 1))] * 1e3,
        "cpu_ms": cpu / n * 1e3,
    }


def time_http(registry: CollectorRegistry, n: int) -> dict[str, float]:
    """Whole scrapes through the node's handler: connect, GET, read, close (same loop)."""

    async def main() -> dict[str, float]:
        server = await serve_metrics(registry, "127.0.0.1:0")
        walls = []
        cpu0 = time.process_time()
        size = 0
        try:
            for _ in range(n):
                t0 = time.perf_counter()
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
                body = await reader.read()
                writer.close()
                walls.append(time.perf_counter() - t0)
                size = len(body)
        finally:
            await server.stop()
        cpu = time.process_time() - cpu0
        return {
            "p50_ms": statistics.median(walls) * 1e3,
            "p99_ms": sorted(walls)[int(0.99 * (n - 1))] * 1e3,
            "cpu_ms": cpu / n * 1e3,
            "bytes": size,
        }

    return asyncio.run(main())


def basic_auth(credentials: Path) -> dict[str, str]:
    """The header of a scrape as the local cluster folder's admin (credentials.json)."""
    admin = load_credentials(credentials)
    raw = base64.b64encode(f"{admin.user}:{admin.password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def fetch(address: str, headers: dict[str, str]) -> str:
    request = urllib.request.Request(f"http://{address}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return str(reply.read().decode())


def time_gate(n: int) -> dict[str, float]:
    """CPU of admitting one scrape with HTTP basic against a users-table verifier
    (scrypt, the default cost): every check vs. the gate's cache (a 15 s interval)."""
    verifier = make_verifier("pw-bench")

    def check_password(user: str, password: str) -> list[str] | None:
        v = verifier
        ok = verifier_matches(password, v.salt, v.n, v.r, v.p, v.stored_key)
        return ["monitor"] if ok and user == "watch" else None

    directory = Directory(check_password, lambda _u: ["monitor"])
    header = "Basic " + base64.b64encode(b"watch:pw-bench").decode()
    return {
        "uncached_cpu_ms": admit_cpu(directory, header, n, 61.0),
        "cached_cpu_ms": admit_cpu(directory, header, n, 15.0),
    }


def admit_cpu(directory: Directory, header: str, n: int, interval: float) -> float:
    """CPU ms per admission of ``n`` scrapes ``interval`` seconds apart (a fake clock)."""
    now = [0.0]
    gate = MetricsGate(directory, SessionTokens(b"k" * 32, 60.0), clock=lambda: now[0])

    async def admit_all() -> None:
        for _ in range(n):
            await gate.admit(header, "bench")
            now[0] += interval

    cpu0 = time.process_time()
    asyncio.run(admit_all())
    return (time.process_time() - cpu0) / n * 1e3


def time_real_node(folder: Path, n: int) -> dict[str, float]:
    """A one-node cluster's scrape: series, scraper wall time, node CPU per scrape."""
    cluster = OwnedCluster(folder, 1, apps=["nonstop.demos.bank"])
    try:
        cluster.start_all()
        node = cluster.nodes["A"]
        assert node.metrics is not None
        pid = cluster.pids["A"]
        auth = basic_auth(cluster.lc.credentials_path)
        series = count_series(fetch(node.metrics, auth))
        time.sleep(0.5)
        idle0 = proc_cpu([pid])
        t0 = time.perf_counter()
        time.sleep(2.0)
        idle_rate = (proc_cpu([pid]) - idle0) / (time.perf_counter() - t0)
        walls = []
        cpu0, t0 = proc_cpu([pid]), time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            fetch(node.metrics, auth)
            walls.append(time.perf_counter() - s)
        elapsed = time.perf_counter() - t0
        node_cpu = proc_cpu([pid]) - cpu0 - idle_rate * elapsed
        return {
            "series": series,
            "p50_ms": statistics.median(walls) * 1e3,
            "p99_ms": sorted(walls)[int(0.99 * (n - 1))] * 1e3,
            "node_cpu_ms": max(0.0, node_cpu) / n * 1e3,
        }
    finally:
        cluster.close()


# ---------------------------------------------------------------- instrumentation alone
def instrumentation_cost(n: int = 200_000) -> dict[str, float]:
    """µs per call of what the data path runs for the metrics, timed alone (best of 5).

    ``observer``: ``DataObserver.op`` + ``reply`` of one ``tx.commit`` (what the data
    service adds per commit with metrics on); ``group``: the lines the group
    committer runs per group for its histograms (always on); the lock table's
    counters change only when a request waits, times out or deadlocks.
    """
    import bisect
    import timeit

    from nonstop.node.metrics import DataObserver
    from nonstop.store.group_commit import GROUP_SIZE_BUCKETS, WRITE_SECONDS_BUCKETS, CommitStats

    obs = DataObserver([0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5])
    ok = {"ok": True}
    counter = iter(range(10**9))

    def commit() -> None:
        corr = next(counter)
        obs.op(1, corr, "tx.commit")
        obs.reply(1, corr, ok)

    stats = CommitStats()

    def group() -> None:
        started = time.perf_counter()
        took = time.perf_counter() - started
        stats.group_sizes[bisect.bisect_left(GROUP_SIZE_BUCKETS, 8)] += 1
        stats.write_seconds[bisect.bisect_left(WRITE_SECONDS_BUCKETS, took)] += 1
        stats.write_seconds_sum += took

    def best(fn: Any) -> float:
        return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    return {"observer_us": best(commit), "group_us": best(group)}


# ---------------------------------------------------------------- data path
class Side:
    """A one-node cluster with ``accounts`` accounts; metrics on or off."""

    def __init__(self, folder: Path, metrics: bool, accounts: int) -> None:
        self.metrics = metrics
        self.cluster = OwnedCluster(folder, 1, apps=["nonstop.demos.bank"])
        node = self.cluster.nodes["A"]
        if not metrics:
            node.metrics = None  # no metrics.listen: no endpoint, no observer
        self.cluster.start_all()
        self.address = node.listen
        self.metrics_address = node.metrics
        self.pid = self.cluster.pids["A"]
        self.accounts = accounts
        with nonstop.connect(self.address) as client:
            for start in range(0, accounts, 500):
                with client.transaction() as tx:
                    for i in range(start, min(accounts, start + 500)):
                        tx.create(Account, number=i, balance=START_BALANCE)

    def close(self) -> None:
        self.cluster.close()


async def transfers(side: Side, clients: int, seconds: float) -> tuple[int, float]:
    """Transfers done in ``seconds`` by ``clients`` tasks sharing one handle; node CPU used."""
    handle = await nonstop.connect_async(side.address)
    done = [0]
    errors = [0]
    end = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        rng = random.Random(i)
        while time.perf_counter() < end:
            a, b = rng.sample(range(side.accounts), 2)
            try:
                await transfer_async(handle, uuid.uuid4().hex, a, b, 1)
                done[0] += 1
            except nonstop.errors.Error:
                errors[0] += 1

    cpu0 = proc_cpu([side.pid])
    try:
        await asyncio.gather(*(worker(i) for i in range(clients)))
    finally:
        await handle.aclose()
    return done[0], proc_cpu([side.pid]) - cpu0


def scraper(address: str, auth: dict[str, str], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        try:
            fetch(address, auth)
        except OSError:
            pass


def data_path(folder: Path, rounds: int, seconds: float, clients: int) -> dict[str, Any]:
    off = Side(folder / "off", False, 1000)
    on = Side(folder / "on", True, 1000)
    stop = threading.Event()
    assert on.metrics_address is not None
    auth = basic_auth(on.cluster.lc.credentials_path)
    thread = threading.Thread(
        target=scraper, args=(on.metrics_address, auth, stop, 1.0), daemon=True
    )
    thread.start()
    results: dict[str, list[tuple[int, float]]] = {"off": [], "on": []}
    try:
        asyncio.run(transfers(off, clients, 0.5))  # warm both up
        asyncio.run(transfers(on, clients, 0.5))
        for _ in range(rounds):
            for side in (off, on):
                name = "on" if side.metrics else "off"
                results[name].append(asyncio.run(transfers(side, clients, seconds)))
        scraped = count_series(fetch(on.metrics_address, auth))
    finally:
        stop.set()
        thread.join(5)
        off.close()
        on.close()
    return {"results": results, "series": scraped}


# ---------------------------------------------------------------- report
def render(args: argparse.Namespace, scrape: dict[str, Any], path: dict[str, Any]) -> str:
    syn, http, real = scrape["exposition"], scrape["http"], scrape["node"]
    inst, gate = scrape["instrumentation"], scrape["gate"]
    per_transfer = 5 * inst["observer_us"]
    rows = []
    summary = {}
    for name in ("off", "on"):
        runs = path["results"][name]
        rates = [n / args.seconds for n, _ in runs]
        cpu_us = sum(c for _, c in runs) / max(1, sum(n for n, _ in runs)) * 1e6
        summary[name] = (statistics.mean(rates), cpu_us)
        rows.append(
            f"| {name} | {' / '.join(f'{r:,.0f}' for r in rates)} | "
            f"{statistics.mean(rates):,.0f} | {cpu_us:,.0f} |"
        )
    (off_rate, off_cpu), (on_rate, on_cpu) = summary["off"], summary["on"]
    diff = (on_rate - off_rate) / off_rate * 100
    cpu_diff = (on_cpu - off_cpu) / off_cpu * 100
    load = os.getloadavg()
    return f"""# Metrics: the cost of a scrape and of metrics on the data path

Produced by `python -m bench.metrics_bench` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC \
(2 CPUs shared with other work, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at \
the end: numbers are noisy; CPU per operation moves less than throughput).

## A scrape at {SERIES:,} series

A registry with exactly {SERIES:,} samples (20 histograms of 13 buckets, counters
and gauges with one bounded label), built at each scrape by a custom collector as
the node's own collector does, {args.scrapes} scrapes each:

| what | p50 ms | p99 ms | CPU ms per scrape |
| --- | ---: | ---: | ---: |
| exposition only (`generate_latest`) | {syn["p50_ms"]:.2f} | {syn["p99_ms"]:.2f} | \
{syn["cpu_ms"]:.2f} |
| HTTP scrape through the node's handler (client and server on one loop, \
{http["bytes"]:,} bytes) | {http["p50_ms"]:.2f} | {http["p99_ms"]:.2f} | {http["cpu_ms"]:.2f} |

A real node (one-node cluster, no load): **{real["series"]:.0f} series**; an HTTP scrape
takes p50 {real["p50_ms"]:.2f} ms, p99 {real["p99_ms"]:.2f} ms at the scraper and
**{real["node_cpu_ms"]:.2f} ms of the node's CPU** (its idle CPU subtracted).  At
Prometheus' usual 15 s interval that is well under 0.1 % of one core.  The scrape
carries the folder's admin credential (HTTP basic; the bootstrap admin is checked
without scrypt).

Admitting a scrape of a users-table user (HTTP basic, scrypt verifier at the
default cost, `nonstop.node.metrics_auth`): **{gate["uncached_cpu_ms"]:.2f} ms of
CPU** when every scrape is checked, **{gate["cached_cpu_ms"]:.3f} ms** with the
gate's 60 s cache at a 15 s interval (one check in four scrapes).

## The data path, metrics on and off

Two one-node clusters in the same run; `on` serves metrics (the data service's
observer counts every session op and reply, commit latency into the histogram)
and is scraped every second ({path["series"]} series); `off` has no
`metrics.listen` (no endpoint, no observer).  {args.clients} asyncio clients
share one handle and run bank transfers between two random accounts of 1,000
(a local group commit each); {args.rounds} alternating slices of {args.seconds:.0f} s.

| metrics | transfers/s per slice | mean | node CPU µs per transfer |
| --- | --- | ---: | ---: |
{chr(10).join(rows)}

Throughput with metrics on: **{diff:+.1f} %**; node CPU per transfer **{cpu_diff:+.1f} %**
(goal: ≤ 3 % difference).

## What the data path runs for the metrics, timed alone

On a machine this loaded the slices above differ by more than 3 % between two
runs of the same code, so the instrumentation is also timed on its own
(`timeit`, best of 5):

| what | µs per call | runs |
| --- | ---: | --- |
| `DataObserver.op` + `.reply` of a `tx.commit` | {inst["observer_us"]:.2f} | \
once per session op / commit, metrics on |
| group-commit histograms (2 × `perf_counter`, 2 × `bisect`, 3 increments) | \
{inst["group_us"]:.2f} | once per group (one fsync), always |
| lock table counters | — | only when a request waits, times out or deadlocks |

A transfer is five session ops (begin with the first get, a second get, a
create, the commit; each op and reply seen by the observer, the commit's the
dearest): at most {per_transfer:.1f} µs, {per_transfer / off_cpu * 100:.1f} % of
the node CPU per transfer above ({off_cpu:,.0f} µs).  The group-commit lines run once
per group, next to an fsync of 0.1–5 ms.

Commands:

```
PYTHONPATH=$PWD/src python -m bench.metrics_bench {" ".join(args.argv)}
```
"""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.metrics_bench", description=__doc__)
    p.add_argument("--scrapes", type=int, default=300)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    args.argv = argv if argv is not None else []
    registry = synthetic_registry()
    assert count_series(generate_latest(registry).decode()) == SERIES
    with tempfile.TemporaryDirectory(prefix="nonstop-metrics-") as tmp:
        scrape = {
            "exposition": time_exposition(registry, args.scrapes),
            "http": time_http(registry, args.scrapes),
            "node": time_real_node(Path(tmp) / "scrape", args.scrapes),
            "instrumentation": instrumentation_cost(),
            "gate": time_gate(min(args.scrapes, 50)),
        }
        print(scrape, flush=True)
        path = data_path(Path(tmp) / "path", args.rounds, args.seconds, args.clients)
        print(path, flush=True)
    args.out.write_text(render(args, scrape, path))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
