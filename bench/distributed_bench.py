"""Distributed benchmark: cross-node transfers on a 3-node cluster vs PostgreSQL.

``python -m bench.distributed_bench [--clients 1,16,64] [--duration 4] [--rounds 2]``
(or ``make bench-dist``) writes ``bench/results/distributed.md``.

* **nonstop**: a local 3-node cluster of real processes on 127.0.0.1 (fsync on,
  the application module ``nonstop.demos.bank`` loaded by every node).  Half the
  accounts are created on node A, half on node B; every transfer moves money
  between one account of A and one of B (random direction), with
  ``nonstop.demos.bank.transfer_async`` unchanged — two write locks taken in
  account order, a ``Transfer`` record created, commit — so every transfer is a
  distributed transaction (two-phase commit, decision in the Raft cluster log).
  Each client is an asyncio task; clients attach to A and B alternately (the
  attached node coordinates).  Row ``nonstop``: the clients attached to one node
  share one async handle (``nonstop.connect_async``, which multiplexes
  transactions on its connection); row ``nonstop, own handles``: one handle and
  connection per client, as PostgreSQL needs.
* **PostgreSQL**: Debian's server started by the benchmark in a temp dir on
  loopback (``bench.pg_peer``: ``fsync=on``, ``synchronous_commit=on``), the same
  transfer as one single-node transaction (two UPDATEs in id order, one INSERT),
  one psycopg async connection per client task.
* **PostgreSQL with a synchronous standby** (``--peers``, both by default): a second
  server started the same way, with a streaming standby on its own port
  (``bench.pg_peer.PostgresSyncPeer``: ``pg_basebackup -R``,
  ``synchronous_standby_names='*'``); the same transfer at ``synchronous_commit=on``
  (COMMIT waits for the standby's flush) and ``remote_apply`` (and its replay).

The nodes run a node configuration's default: routing by partition (16
partitions) with one sync replica each, so a transfer commits on its partitions'
active nodes and on their sync replicas (``DEFAULT_HA``).  ``--nonstop-option
KEY=VALUE`` (repeatable, dotted keys for tables, as ``nonstop local up --option``)
configures the nodes otherwise; any ``ha`` option replaces that default, e.g.
``--nonstop-option ha.data=nodes`` for the older routing by node (one copy of each
object).  ``--gaps-only`` takes the same options.

Both run in this same process on the same event loop type (uvloop), in
interleaved slices (``--rounds``), with the fsync cost measured right before
each slice.  CPU per transfer is given for the client process and for the
servers (the three nodes; the PostgreSQL postmaster and backends).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import itertools
import json
import os
import platform
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nonstop
from bench.nonstop_options import describe, parse_nonstop_options
from bench.peers import Result, fsync_cost, run_clients
from bench.pg_peer import PostgresPeer, PostgresSyncPeer, proc_cpu
from nonstop.admin.owned import OwnedCluster
from nonstop.demos.bank import START_BALANCE, Account, Transfer, transfer_async

RESULTS = Path(__file__).parent / "results" / "distributed.md"
OWN = "nonstop, own handles"
SYSTEMS = ("postgresql", "nonstop", OWN)
"""``nonstop``: the clients attached to a node multiplex one async handle (what
``connect_async`` is built for); ``OWN``: one handle, one connection, per client task,
like PostgreSQL's one connection per client."""
PG = "postgresql"
PG_SYNC = "postgresql, sync standby"
PG_APPLY = "postgresql, sync standby, remote_apply"
PEERS = {"pg": PG, "pg-sync": PG_SYNC, "pg-sync-apply": PG_APPLY}
"""``--peers`` names → the system (row) each measures."""
SYNC_LEVEL = {PG_SYNC: "on", PG_APPLY: "remote_apply"}
"""The ``synchronous_commit`` of each sync-standby row's sessions."""
CLIENTS = (1, 16, 64)
README_SPAN = 12
"""Accounts of A and of B the README-order slices also run over (24 in all: hot)."""


@dataclass
class Config:
    clients: tuple[int, ...] = CLIENTS
    duration: float = 4.0
    warmup: float = 0.5
    rounds: int = 2
    accounts: int = 1000  # per node (A and B)
    tmpdir: str | None = None
    out: Path = RESULTS
    command: str = "make bench-dist"
    profile: bool = True
    ordered: bool = False
    """``--gaps-only``: also the ordered transfer, same accounts (contention without cycles)."""
    options: dict[str, Any] = field(default_factory=dict)
    """``--gaps-only``: node config options (``--option deadlock_every=0.01``)."""
    peers: tuple[str, ...] = tuple(PEERS)
    """``--peers`` names, ``pg`` first (the report's bounds compare with it)."""
    nonstop_options: tuple[str, ...] = ()
    """``--nonstop-option`` words as given (the report quotes them)."""


def parse_peers(text: str) -> tuple[str, ...]:
    """``--peers pg,pg-sync``: known names, each once, in the order of :data:`PEERS`."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in names if x not in PEERS]
    if unknown:
        raise ValueError(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)})")
    if "pg" not in names:
        raise ValueError("--peers must include pg (the single-node peer every ratio uses)")
    return tuple(x for x in PEERS if x in names)


@dataclass
class Cell:
    """One (system, clients) cell over all its slices."""

    system: str
    clients: int
    results: list[Result] = field(default_factory=list)
    fsync_ms: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    server_cpu_us: list[float] = field(default_factory=list)
    node_cpu_us: list[dict[str, float]] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    """Per slice: the longest interval of the measured window without a commit."""
    errors: int = 0
    server_cpu_by_role: list[dict[str, float]] = field(default_factory=list)
    """PostgreSQL, per slice: server CPU µs per transfer of ``primary`` and ``standby``."""

    def ops_per_s(self) -> float:
        ops = sum(r.ops for r in self.results)
        secs = sum(r.seconds for r in self.results)
        return ops / secs if secs else 0.0

    def lat(self, q: float) -> float:
        merged = Result(0, 1.0, [x for r in self.results for x in r.latencies])
        return merged.percentile(q)

    def cpu(self) -> float:
        return _mean([r.cpu_us for r in self.results])

    def server_cpu(self) -> float:
        return _mean(self.server_cpu_us)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.fmean(xs) if xs else float("nan")


def event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


def arun(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on a fresh uvloop (as the node runtime uses), or asyncio's loop."""
    with asyncio.Runner(loop_factory=event_loop) as runner:
        return runner.run(coro)  # type: ignore[arg-type]


# ------------------------------------------------------------------- nonstop
@nonstop.transactional
async def readme_transfer_async(
    tx: nonstop.AsyncTransaction, tid: str, src: int, dst: int, amount: int
) -> None:
    """The README's transfer: ``src`` locked first, then ``dst`` (no global order), so
    two transfers over one pair in opposite directions deadlock, across nodes too."""
    a = await tx.get(Account, number=src, lock="write")
    b = await tx.get(Account, number=dst, lock="write")
    a.balance -= amount
    b.balance += amount
    await tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)


DEFAULT_HA = ("ha.data=partitions", "ha.policies.default.replicas=1")
"""The node configuration's default, said explicitly: without an ``ha`` option a run
measures it (``cluster_options`` otherwise picks routing by node)."""


def cluster_options(
    ha_data: str, options: dict[str, Any] | None
) -> tuple[dict[str, Any], str, int]:
    """(node options, data routing, partitions of the default policy) of a cluster.

    ``ha_data="partitions"`` without an ``ha`` option routes by partition with one copy
    of each (ha.md section 9a); a caller's own ``ha`` table (``--nonstop-option
    ha.data=partitions ...``) decides both routing and replicas.
    """
    options = dict(options or {})
    if ha_data == "partitions" and "ha" not in options:
        options["ha"] = {"data": "partitions", "policies": {"default": {"replicas": 0}}}
    elif "ha" not in options:
        # A node config routes by partition by default: say "nodes" explicitly.
        options["ha"] = {"data": ha_data}
    ha = options.get("ha")
    ha = ha if isinstance(ha, dict) else {}
    default_policy = ha.get("policies", {}).get("default", {})
    return options, str(ha.get("data", ha_data)), int(default_policy.get("partitions", 16))


class NonstopSide:
    """The 3-node cluster with ``accounts`` accounts on A (0..n-1) and on B (n..2n-1)."""

    def __init__(
        self,
        folder: Path,
        accounts: int,
        ha_data: str = "nodes",
        options: dict[str, Any] | None = None,
    ) -> None:
        self.accounts = accounts
        options, ha_data, self.partitions = cluster_options(ha_data, options)
        self.cluster = OwnedCluster(folder, 3, apps=["nonstop.demos.bank"], options=options)
        self.cluster.start_all()
        self.errors = 0
        self.commits: list[float] = []
        """``time.perf_counter()`` of every transfer that committed (for commit gaps)."""
        self.on_a = list(range(accounts))
        self.on_b = list(range(accounts, 2 * accounts))
        if ha_data == "partitions":
            self._wait_partitions()
        self._load()
        if ha_data == "partitions":
            self._homes()

    def _wait_partitions(self) -> None:
        """Until every partition is Active on a node that acts for it."""
        from nonstop.client import Client

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                acting: set[str] = set()
                parts: list[dict[str, Any]] = []
                for name in self.cluster.names:
                    with Client([self.cluster.address(name)], timeout=2, rounds=1) as one:
                        status = one.status()
                    acting |= set(status.get("acting", []))
                    parts = status["partitions"]
                if len(parts) == self.partitions and all(p["name"] in acting for p in parts):
                    return
            time.sleep(0.2)
        raise RuntimeError("partitions not acted for within 60 s")

    def _homes(self) -> None:
        """Placed by the hash of their number: which accounts live on A and on B."""
        from nonstop.client import Client

        with Client([self.cluster.address("A")], timeout=2, rounds=1) as one:
            parts = one.status()["partitions"]
        active = {p["location"]: p["active"] for p in parts}
        with nonstop.connect(self.cluster.addresses) as client:
            homes: dict[str, list[int]] = {"A": [], "B": [], "C": []}
            for start in range(0, 2 * self.accounts, 500):
                with client.transaction() as tx:
                    for number in range(start, min(2 * self.accounts, start + 500)):
                        ref = tx.ref(tx.get(Account, number=number))
                        homes[active[int.from_bytes(ref.raw[:8], "big")]].append(number)
        self.on_a, self.on_b = homes["A"], homes["B"]

    def _load(self) -> None:
        n = self.accounts

        @nonstop.transactional
        def create_batch(tx: Any, node: str, numbers: range) -> None:
            # Replayed on a retryable refusal: with partitions, a partition's epoch may
            # still move right after the start (NotActive).
            for number in numbers:
                tx.create(Account, node=node, number=number, balance=START_BALANCE)

        with nonstop.connect(self.cluster.addresses) as client:
            for node, base in (("A", 0), ("B", n)):
                for start in range(0, n, 500):
                    create_batch(client, node, range(base + start, base + min(n, start + 500)))

    def pick(self, rng: random.Random, span: int | None = None) -> tuple[int, int]:
        """One account of A and one of B (among the first ``span`` of each), random order."""
        a = self.on_a[rng.randrange(min(span or len(self.on_a), len(self.on_a)))]
        b = self.on_b[rng.randrange(min(span or len(self.on_b), len(self.on_b)))]
        return (a, b) if rng.random() < 0.5 else (b, a)

    def node_pids(self) -> list[int]:
        return list(self.cluster.pids.values())

    def make_op(
        self, shared: bool = False, span: int | None = None, readme: bool = False
    ) -> Callable[[int], Awaitable[tuple[Callable[[random.Random], Awaitable[None]], Any]]]:
        """Client ``i`` attaches to A (even) or B (odd): its own handle, or with
        ``shared`` one handle per node that all clients attached there multiplex.
        ``readme``: the README's transfer (locks ``src`` then ``dst``: cycles happen)."""
        transfer = readme_transfer_async if readme else transfer_async
        addresses = self.cluster.addresses
        attach = [[addresses[0], addresses[1]], [addresses[1], addresses[0]]]
        handles: dict[int, Any] = {}
        lock = asyncio.Lock()

        async def handle(i: int) -> tuple[Any, Callable[[], Awaitable[None]]]:
            # balance="first": the bench attaches each client itself (H5 pinned).
            if not shared:
                client = await nonstop.connect_async(attach[i % 2] + addresses[2:], balance="first")
                return client, client.aclose
            async with lock:
                if i % 2 not in handles:
                    handles[i % 2] = await nonstop.connect_async(
                        attach[i % 2] + addresses[2:], balance="first"
                    )
            client = handles[i % 2]

            async def close() -> None:
                if handles.pop(i % 2, None) is not None:
                    await client.aclose()

            return client, close

        async def make(i: int) -> tuple[Callable[[random.Random], Awaitable[None]], Any]:
            client, close = await handle(i)

            async def op(rng: random.Random) -> None:
                src, dst = self.pick(rng, span)
                try:
                    await transfer(client, uuid.uuid4().hex, src, dst, 1)
                except nonstop.errors.Error:
                    self.errors += 1  # counted, reported: the run goes on
                else:
                    self.commits.append(time.perf_counter())

            return op, close

        return make

    async def runtime_stats(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name in self.cluster.names:
            with contextlib.suppress(Exception):
                client = await nonstop.connect_async([self.cluster.address(name)])
                try:
                    out[name] = await client.request({"op": "runtime_stats"})
                finally:
                    await client.aclose()
        return out

    def check(self) -> tuple[int, int]:
        """(total balance, transfers recorded) through the client, cluster scope."""
        with nonstop.connect(self.cluster.addresses) as client, client.transaction() as tx:
            total = sum(a.balance for a in tx.query(Account).all())
            transfers = tx.count(Transfer)
        return total, transfers

    def close(self) -> None:
        self.cluster.close()


def py_spy() -> str | None:
    """The py-spy executable (next to this Python, or on PATH), or None."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_nodes(ns: NonstopSide, clients: int, seconds: float, folder: Path) -> list[str]:
    """One extra, unmeasured slice with py-spy sampling every node; the hottest frames."""
    spy = py_spy()
    if spy is None:
        return ["py-spy is not installed (`pip install py-spy`): no profile."]
    spies = {
        name: subprocess.Popen(
            [
                *(spy, "record", "-p", str(pid), "-d", str(int(seconds) + 1), "-r", "200"),
                "--gil",
                *("-f", "raw", "-o", str(folder / f"spy-{name}.txt"), "--nonblocking"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in ns.cluster.pids.items()
    }
    time.sleep(0.3)
    arun(_run_nonstop(ns, clients, seconds, 0.0))
    out = [
        f"py-spy (200 Hz, {seconds:.0f} s, {clients} clients, not measured above, `--gil`: "
        "only the thread holding the GIL is sampled, i.e. where the node's one Python CPU "
        "goes; a C call made with the GIL held, such as uvloop's socket write inside "
        "`StreamWriter.write`, counts on the Python line that made it) on each node: the "
        "share of samples whose innermost frame (*self*) or any frame "
        "(*inclusive*, start-up, event-loop and thread-bootstrap frames left out) is the "
        "one named.",
        "",
    ]
    for name, proc in spies.items():
        try:
            proc.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
        out += [f"**Node {name}**", "", *_hot_frames(folder / f"spy-{name}.txt"), ""]
    return out


# Frames every stack of a thread starts with (process start-up, the event loop's run
# call, thread bootstrap): left out of the inclusive list.
_LAUNCHER = re.compile(
    r"\((click/|<frozen runpy>|asyncio/runners\.py|threading\.py|nonstop/admin/cli\.py|"
    r"main\.py:|concurrent/futures/thread\.py)"
)


def _hot_frames(path: Path, top: int = 10) -> list[str]:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack or not n.isdigit():
                continue
            frames = stack.split(";")
            total += int(n)
            own[frames[-1]] += int(n)
            for f in set(frames):
                incl[f] += int(n)
    if not total:
        return ["(no samples)"]
    rows = ["| self | frame | | inclusive | frame |", "| --- | --- | --- | --- | --- |"]
    inc = [(f, n) for f, n in incl.most_common() if not _LAUNCHER.search(f)][:top]
    for (fs, ns_), (fi, ni) in zip(own.most_common(top), inc, strict=False):
        rows.append(f"| {100 * ns_ / total:.1f}% | `{fs}` | | {100 * ni / total:.1f}% | `{fi}` |")
    writes = sum(n for f, n in own.items() if f.startswith("StreamWriter.write "))
    rows += ["", f"Socket writes (self time of `StreamWriter.write`): {100 * writes / total:.0f}%."]
    return rows


def anatomy(ns: NonstopSide, n: int = 60) -> dict[str, float]:
    """Median ms of each step of one cross-node transfer, alone (sync client on A).

    Also the same transaction's commit when it writes on the attached node only
    (one-phase: one group commit) and a lone durable commit of a store on this disk.
    """
    steps: dict[str, list[float]] = {k: [] for k in ("get A", "get B", "create", "commit")}
    one_phase: list[float] = []
    clock = time.perf_counter
    with nonstop.connect(ns.cluster.addresses[:1]) as client:
        for k in range(n):
            src, dst = k % ns.accounts, ns.accounts + k % ns.accounts
            tx = client.transaction()
            t0 = clock()
            a = tx.get(Account, number=src, lock="write")
            t1 = clock()
            b = tx.get(Account, number=dst, lock="write")
            t2 = clock()
            a.balance -= 1
            b.balance += 1
            tx.create(Transfer, tid=uuid.uuid4().hex, src=src, dst=dst, amount=1)
            t3 = clock()
            tx.commit()
            t4 = clock()
            for name, (x, y) in zip(steps, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True):
                steps[name].append((y - x) * 1000)
            tx = client.transaction()
            a = tx.get(Account, number=src, lock="write")
            a.balance += 0
            a.owner = a.owner  # a write on A only
            tx.create(Transfer, tid=uuid.uuid4().hex, src=src, dst=src, amount=0)
            t5 = clock()
            tx.commit()
            one_phase.append((clock() - t5) * 1000)
    out = {k: statistics.median(v) for k, v in steps.items()}
    out["commit, writes on A only (1PC)"] = statistics.median(one_phase)
    return out


def steps_under_load(ns: NonstopSide, clients: int, seconds: float) -> dict[str, float]:
    """Median ms of each step of a transfer with ``clients`` concurrent clients (shared
    handles, one extra unmeasured slice): which step the waiting is in."""
    steps: dict[str, list[float]] = {k: [] for k in ("get", "get 2", "create", "commit")}

    async def main() -> None:
        addresses = ns.cluster.addresses
        handles = [
            # One handle attached to each of the first two nodes (H5 pinned).
            await nonstop.connect_async([addresses[0], addresses[1]], balance="first"),
            await nonstop.connect_async([addresses[1], addresses[0]], balance="first"),
        ]
        end = time.monotonic() + seconds
        clock = time.perf_counter

        async def worker(i: int) -> None:
            rng = random.Random(7000 + i)
            client = handles[i % 2]
            while time.monotonic() < end:
                src, dst = ns.pick(rng)
                first, second = sorted((src, dst))
                try:
                    t0 = clock()
                    async with client.transaction() as tx:
                        a = await tx.get(Account, number=first, lock="write")
                        t1 = clock()
                        b = await tx.get(Account, number=second, lock="write")
                        t2 = clock()
                        a.balance -= 1
                        b.balance += 1
                        await tx.create(Transfer, tid=uuid.uuid4().hex, src=src, dst=dst, amount=1)
                        t3 = clock()
                    t4 = clock()
                except nonstop.errors.Error:
                    continue
                spans = ((t0, t1), (t1, t2), (t2, t3), (t3, t4))
                for name, (x, y) in zip(steps, spans, strict=True):
                    steps[name].append((y - x) * 1000)

        try:
            await asyncio.gather(*(worker(i) for i in range(clients)))
        finally:
            for h in handles:
                await h.aclose()

    arun(main())
    return {k: statistics.median(v) for k, v in steps.items() if v}


def readme_order(
    ns: NonstopSide, clients: int, seconds: float, span: int, readme: bool = True
) -> dict[str, float]:
    """One unmeasured slice of the README's transfer (shared handles, the first ``span``
    accounts of A and B): transfers/s, the longest commit gap, victims per 1,000.
    ``readme=False``: the benchmark's ordered transfer instead (the same contention,
    no cycle)."""
    before = arun(ns.runtime_stats())
    ns.commits.clear()
    res = arun(run_clients(clients, ns.make_op(True, span, readme=readme), seconds, 0.3))
    gap = commit_gap(ns.commits, *res.extra["window"])
    per = _diff_stats(before, arun(ns.runtime_stats()))
    done = res.extra.get("done", res.ops) or 1

    def per_k(key: str) -> float:
        return float(1000 * sum(v.get(key, 0) for v in per.values()) / done)

    start, end = res.extra["window"]

    def per_s(key: str) -> float:
        # The nodes' counters cover the warm-up (0.3 s) too.
        return float(sum(v.get(key, 0) for v in per.values()) / (end - start + 0.3))

    return {
        # Commits in the window (a transfer may span it: latency under contention).
        "transfers/s": sum(1 for t in ns.commits if start < t < end) / (end - start),
        "gap ms": gap * 1000,
        "p99 gap ms": gap_quantile(ns.commits, start, end, 0.99) * 1000,
        "victims/s": per_s("deadlock_victims") + per_s("deadlocks"),
        "distributed victims / 1,000": per_k("deadlock_victims"),
        "local victims / 1,000": per_k("deadlocks"),
        "lock timeouts / 1,000": per_k("timeouts"),
        # The longest transfer, replays included: starvation (a replay ranked as the
        # youngest again and again) shows here, not in the gaps.
        "longest transfer ms": max(res.latencies, default=0.0) * 1000,
    }


def contention_check(ns: NonstopSide, clients: int, seconds: float) -> dict[str, float]:
    """Transfers/s at ``clients`` over all accounts and over a tenth of them (ten times
    the chance of meeting a locked account), interleaved, unmeasured elsewhere."""
    out: dict[str, list[float]] = {"all": [], "tenth": []}
    for _ in range(2):
        for name, span in (("all", None), ("tenth", max(1, ns.accounts // 10))):
            res = arun(run_clients(clients, ns.make_op(True, span), seconds, 0.3))
            out[name].append(res.ops_per_s)
    return {k: statistics.fmean(v) for k, v in out.items()}


def lone_store_commit_ms(folder: Path, n: int = 30) -> float:
    """p50 of one durable single-object commit of a nonstop store on this disk."""
    times = []
    with nonstop.open(folder / "lone-store") as db:
        for i in range(n):
            t0 = time.perf_counter()
            with db.transaction() as tx:
                tx.create(Transfer, tid=f"lone-{i}")
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


async def ping_rtt(addresses: list[str], n: int = 200) -> float:
    """p50 of one client request round trip (``ping``) to a node, in ms."""
    client = await nonstop.connect_async(addresses[:1])
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            await client.ping()
            times.append(time.perf_counter() - t0)
    finally:
        await client.aclose()
    return statistics.median(times) * 1000


# ------------------------------------------------------------------ running
def run(cfg: Config) -> Path:
    base = Path(tempfile.mkdtemp(prefix="nonstop-dist-bench-", dir=cfg.tmpdir))
    load_before = os.getloadavg()
    started = time.time()
    pg: PostgresPeer | None = None
    pg_sync: PostgresSyncPeer | None = None
    ns: NonstopSide | None = None
    cells: dict[tuple[str, int], Cell] = {}
    stats: dict[int, dict[str, Any]] = {}
    try:
        t0 = time.perf_counter()
        options = parse_nonstop_options(cfg.nonstop_options)
        ns = NonstopSide(base / "cluster", cfg.accounts, options=options)
        print(f"cluster up, {2 * cfg.accounts} accounts in {time.perf_counter() - t0:.1f} s")
        pg = PostgresPeer(2 * cfg.accounts, tmpdir=cfg.tmpdir)  # its own dir: the server user's
        print(f"PostgreSQL {pg.version} up on 127.0.0.1:{pg.port}")
        if {"pg-sync", "pg-sync-apply"} & set(cfg.peers):
            pg_sync = PostgresSyncPeer(2 * cfg.accounts, tmpdir=cfg.tmpdir)
            print(
                f"PostgreSQL {pg_sync.version} with a sync standby up on 127.0.0.1:"
                f"{pg_sync.port} (standby :{pg_sync.standby_port}): {pg_sync.replication()}"
            )
        rtt = arun(ping_rtt(ns.cluster.addresses))
        steps = anatomy(ns)
        steps["lone durable store commit (this disk)"] = lone_store_commit_ms(base)
        steps["fsync (4 KiB write + fsync)"] = fsync_cost(str(base))[0]
        print("one transfer, alone:", {k: round(v, 2) for k, v in steps.items()})
        slice_s = cfg.duration / cfg.rounds
        for clients in cfg.clients:
            # With one client both nonstop variants are the same thing: measured once.
            pg_systems = tuple(PEERS[name] for name in cfg.peers)
            systems = (*pg_systems, *(("nonstop", OWN) if clients > 1 else ("nonstop",)))
            for system in systems:
                cells[(system, clients)] = Cell(system, clients)
            before = arun(ns.runtime_stats())
            for rnd in range(cfg.rounds):
                order = systems if rnd % 2 == 0 else tuple(reversed(systems))
                for system in order:
                    cell = cells[(system, clients)]
                    cell.fsync_ms.append(fsync_cost(str(base))[0])
                    cell.load.append(os.getloadavg()[0])
                    if system in SYNC_LEVEL:
                        assert pg_sync is not None
                        level = SYNC_LEVEL[system]
                        res = arun(pg_sync.run(clients, slice_s, cfg.warmup, ns.pick, level))
                        cell.server_cpu_us.append(res.extra["server_cpu_us"])
                        cell.server_cpu_by_role.append(res.extra["server_cpu_us_by_role"])
                    elif system == PG:
                        res = arun(pg.run(clients, slice_s, cfg.warmup, ns.pick))
                        cell.server_cpu_us.append(res.extra["server_cpu_us"])
                    else:
                        shared = system == "nonstop"
                        res = arun(_run_nonstop(ns, clients, slice_s, cfg.warmup, shared))
                        cell.server_cpu_us.append(res.extra["server_cpu_us"])
                        cell.node_cpu_us.append(res.extra["node_cpu_us"])
                        cell.errors += res.extra["errors"]
                        cell.gaps_ms.append(res.extra["gap_ms"])
                    cell.results.append(res)
                    print(
                        f"{system:20s} {clients:3d} clients round {rnd + 1}: "
                        f"{res.ops_per_s:7.0f}/s p50 {res.p50:6.2f} ms p99 {res.p99:6.2f} ms "
                        f"fsync {cell.fsync_ms[-1]:.2f} ms load {cell.load[-1]:.2f}"
                        + (f" gap {cell.gaps_ms[-1]:.0f} ms" if cell.gaps_ms else ""),
                        flush=True,
                    )
            after = arun(ns.runtime_stats())
            stats[clients] = _diff_stats(before, after)
        pgbench: dict[int, dict[str, float]] = {}
        if pg_sync is not None:  # PostgreSQL's own driver, same transfer (issue 10's figure)
            for clients in cfg.clients:
                pgbench[clients] = pg_sync.pgbench(clients, max(slice_s, 1.0))
                print(f"pgbench, sync standby, {clients:3d} clients: {pgbench[clients]}")
        readme = {
            (clients, span): readme_order(ns, clients, min(cfg.duration, 4.0), span)
            for clients in cfg.clients
            if clients > 1
            for span in (cfg.accounts, README_SPAN)
        }
        print("README order:", readme)
        contention = contention_check(ns, max(cfg.clients), min(cfg.duration / 2, 2.0))
        print(f"lock contention check at {max(cfg.clients)} clients:", contention)
        loaded = steps_under_load(ns, max(cfg.clients), min(cfg.duration, 3.0))
        print(f"steps at {max(cfg.clients)} clients:", {k: round(v, 2) for k, v in loaded.items()})
        profile = (
            profile_nodes(ns, max(cfg.clients), min(cfg.duration, 4.0), base)
            if cfg.profile
            else ["Not profiled (--no-profile)."]
        )
        total, transfers = ns.check()
        pg_total, pg_transfers = pg.total()
        checks: dict[str, Any] = {
            "nonstop_total_ok": total == 2 * cfg.accounts * START_BALANCE,
            "nonstop_transfers": transfers,
            "pg_total_ok": pg_total == 2 * cfg.accounts * START_BALANCE,
            "pg_transfers": pg_transfers,
        }
        if pg_sync is not None:
            checks["pg_sync_replication"] = pg_sync.replication()
            sync_total, sync_transfers = pg_sync.total()
            checks["pg_sync_total_ok"] = sync_total == 2 * cfg.accounts * START_BALANCE
            checks["pg_sync_transfers"] = sync_transfers
            checks["pg_standby_same"] = pg_sync.standby_total() == (sync_total, sync_transfers)
    finally:
        if ns is not None:
            ns.close()
        if pg is not None:
            pg.stop()
        if pg_sync is not None:
            pg_sync.stop()
        shutil.rmtree(base, ignore_errors=True)
    steps.update({f"{k}, at {max(cfg.clients)} clients": v for k, v in loaded.items()})
    steps.update({f"contention {k}": v for k, v in contention.items()})
    report = render(cfg, cells, stats, checks, rtt, steps, load_before, os.getloadavg(), started)
    report += "\n" + "\n".join(pgbench_table(cells, pgbench)) + "\n"
    report += "\n" + "\n".join(readme_table(cfg, readme)) + "\n"
    report += "\n## Profile of the nodes\n\n" + "\n".join(profile) + "\n"
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(report)
    print(f"wrote {cfg.out}")
    return cfg.out


async def _run_nonstop(
    ns: NonstopSide, clients: int, duration: float, warmup: float, shared: bool = True
) -> Result:
    pids = ns.node_pids()
    cpu0 = proc_cpu(pids)
    errors0 = ns.errors
    per0 = {n: proc_cpu([p]) for n, p in ns.cluster.pids.items()}
    ns.commits.clear()
    res = await run_clients(clients, ns.make_op(shared), duration, warmup)
    res.extra["gap_ms"] = commit_gap(ns.commits, *res.extra["window"]) * 1000
    done = res.extra.get("done", res.ops)
    res.extra["server_cpu_us"] = (proc_cpu(pids) - cpu0) / done * 1e6 if done else float("nan")
    res.extra["node_cpu_us"] = {
        n: (proc_cpu([p]) - per0[n]) / done * 1e6 if done else float("nan")
        for n, p in ns.cluster.pids.items()
    }
    res.extra["errors"] = ns.errors - errors0
    return res


def commit_gap(commits: list[float], start: float, end: float) -> float:
    """The longest interval of ``[start, end]`` in which no commit finished (seconds)."""
    times = [start, *sorted(t for t in commits if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(times))


def gap_quantile(commits: list[float], start: float, end: float, q: float) -> float:
    """The ``q`` quantile of the intervals between commits of ``[start, end]`` (seconds)."""
    times = [start, *sorted(t for t in commits if start < t < end), end]
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return gaps[min(len(gaps) - 1, int(q * len(gaps)))]


def gaps_only(cfg: Config) -> None:
    """``--gaps-only``: the README-order slices alone (no PostgreSQL, no profile), over
    the ``cfg.accounts`` accounts of A and of B; prints one line per client count."""
    base = Path(tempfile.mkdtemp(prefix="nonstop-dist-gaps-", dir=cfg.tmpdir))
    ns: NonstopSide | None = None
    try:
        options = {**parse_nonstop_options(cfg.nonstop_options), **cfg.options}
        ns = NonstopSide(base / "cluster", cfg.accounts, options=options)
        print(f"load {os.getloadavg()[0]:.2f}; {cfg.command}")
        print(f"nonstop configuration: {describe(cfg.nonstop_options)}")
        print("| clients | accounts | " + " | ".join(_GAP_COLS) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in _GAP_COLS) + " |")
        for clients in cfg.clients:
            for _ in range(cfg.rounds):
                for readme in (True, False) if cfg.ordered else (True,):
                    row = readme_order(ns, clients, cfg.duration, cfg.accounts, readme)
                    cells = " | ".join(f"{row[c]:,.1f}" for c in _GAP_COLS)
                    what = "" if readme else " (ordered)"
                    print(f"| {clients}{what} | {2 * cfg.accounts} | {cells} |", flush=True)
        total, _ = ns.check()
        print("total conserved:", total == 2 * cfg.accounts * START_BALANCE)
    finally:
        if ns is not None:
            ns.close()
        shutil.rmtree(base, ignore_errors=True)


_GAP_COLS = (
    "transfers/s",
    "gap ms",
    "p99 gap ms",
    "victims/s",
    "distributed victims / 1,000",
    "local victims / 1,000",
    "lock timeouts / 1,000",
    "longest transfer ms",
)


def _diff_stats(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node, rep in after.items():
        merged: dict[str, Any] = {}
        for part in ("stats", "data", "locks"):
            b = (before.get(node) or {}).get(part, {})
            a = rep.get(part) or {}
            merged.update(
                {k: a[k] - b.get(k, 0) for k in sorted(a) if isinstance(a[k], int | float)}
            )
        out[node] = {k: v for k, v in merged.items() if v}
    return out


# ------------------------------------------------------------------ report
def render(
    cfg: Config,
    cells: dict[tuple[str, int], Cell],
    stats: dict[int, dict[str, Any]],
    checks: dict[str, Any],
    rtt_ms: float,
    steps: dict[str, float],
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    started: float,
) -> str:
    day = dt.datetime.fromtimestamp(started, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Distributed benchmark: cross-node transfers vs PostgreSQL",
        "",
        f"Produced by `{cfg.command}` on {day}, {_git_state()}.",
        "",
        "| machine | |",
        "| --- | --- |",
        f"| CPUs | {os.cpu_count()} (shared with other work) |",
        f"| load average before / after | {_la(load_before)} / {_la(load_after)} |",
        f"| Python | {platform.python_version()} |",
        f"| client request round trip (ping, p50) | {rtt_ms:.3f} ms |",
        "",
        f"nonstop configuration: {describe(cfg.nonstop_options)}.",
        "",
        f"Accounts: {cfg.accounts} on node A, {cfg.accounts} on node B (PostgreSQL: the same "
        f"{2 * cfg.accounts} rows in one table).  Each cell: {cfg.rounds} interleaved slices of "
        f"{cfg.duration / cfg.rounds:.1f} s measured after {cfg.warmup} s warm-up.",
        "",
        "| clients | system | transfers/s | p50 ms | p99 ms | client CPU µs/op "
        "| server CPU µs/op | fsync ms (per slice) | load (per slice) | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for clients in cfg.clients:
        for system in ("nonstop", OWN, PG, PG_SYNC, PG_APPLY):
            c = cells.get((system, clients))
            if c is None:
                continue
            lines.append(
                f"| {clients} | {system} | {c.ops_per_s():,.0f} | {c.lat(50):.2f} | "
                f"{c.lat(99):.2f} | {c.cpu():.0f} | {c.server_cpu():.0f} | "
                f"{', '.join(f'{x:.2f}' for x in c.fsync_ms)} | "
                f"{', '.join(f'{x:.1f}' for x in c.load)} | {c.errors} |"
            )
    lines += [
        "",
        "| clients | nonstop ÷ PostgreSQL (transfers/s) | with own handles | goal (64 clients) |",
        "| --- | --- | --- | --- |",
    ]
    for clients in cfg.clients:
        ns, pg = cells[("nonstop", clients)], cells[("postgresql", clients)]
        own = cells.get((OWN, clients), ns)
        ratio = ns.ops_per_s() / pg.ops_per_s() if pg.ops_per_s() else float("nan")
        ratio_own = own.ops_per_s() / pg.ops_per_s() if pg.ops_per_s() else float("nan")
        goal = ("**met**" if ratio >= 1 else "**below**") if clients == 64 else ""
        lines.append(
            f"| {clients} | {ratio:.2f} | {ratio_own:.2f} | {'≥ 1×: ' + goal if goal else ''} |"
        )
    lines += [
        "",
        *sync_standby_table(cfg, cells),
        f"Checks after the run: nonstop total conserved: {checks['nonstop_total_ok']} "
        f"({checks['nonstop_transfers']} transfers recorded); PostgreSQL total conserved: "
        f"{checks['pg_total_ok']} ({checks['pg_transfers']} transfers recorded)"
        + (
            f"; PostgreSQL with a sync standby total conserved: {checks['pg_sync_total_ok']} "
            f"({checks['pg_sync_transfers']} transfers recorded), the standby holds the same: "
            f"{checks['pg_standby_same']}, `pg_stat_replication` (application, state, "
            f"sync_state): {checks['pg_sync_replication']}"
            if "pg_sync_total_ok" in checks
            else ""
        )
        + ".",
        "",
        *gaps_and_victims(cfg, cells, stats),
        "## One transfer, step by step (median ms)",
        "",
        "Alone: a sync client attached to A, one transfer at a time.  Under load: an extra "
        "unmeasured slice with the top client count (shared handles), steps of the transfer "
        "timed inside each client.",
        "",
        "| step | ms |",
        "| --- | --- |",
    ]
    lines += [f"| {k} | {v:.2f} |" for k, v in steps.items() if not k.startswith("contention")]
    lines += [
        "",
        "## Per cell: CPU per node and what the nodes counted",
        "",
        "CPU µs per transfer of each node process (row `nonstop`; A and B hold the accounts "
        "and coordinate; C only votes in the cluster log), then per transfer: cluster-log "
        "store commits (`commits`, each with fsync) and their mean duration, dtx persists "
        "(durable writes the commit protocol asks for) and the object-store commits that "
        "carry them (`dtx_store_commits`: several persists of one event-loop turn share "
        "one), peer messages received, over the nonstop slices of the cell (idle "
        "background work included).",
        "",
        "| clients | CPU A | CPU B | CPU C | cluster-store commits / transfer "
        "| ms per cluster-store commit | dtx persists / transfer "
        "| object-store commits for dtx / transfer | peer messages / transfer |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for clients in cfg.clients:
        c = cells[("nonstop", clients)]
        # The node counters span both nonstop variants of the cell.
        both = [*c.results, *(cells[(OWN, clients)].results if (OWN, clients) in cells else [])]
        done = sum(r.extra.get("done", r.ops) for r in both) or 1
        per = stats.get(clients, {})
        commits = sum(v.get("commits", 0) for v in per.values())
        commit_us = sum(v.get("commit_us", 0) for v in per.values())
        persists = sum(v.get("dtx_persists", 0) for v in per.values())
        store_commits = sum(v.get("dtx_store_commits", 0) for v in per.values())
        received = sum(v.get("received", 0) for v in per.values())
        cpu = {n: _mean([d.get(n, float("nan")) for d in c.node_cpu_us]) for n in "ABC"}
        lines.append(
            f"| {clients} | {cpu['A']:.0f} | {cpu['B']:.0f} | {cpu['C']:.0f} | "
            f"{commits / done:.2f} | {commit_us / max(commits, 1) / 1000:.2f} | "
            f"{persists / done:.2f} | {store_commits / done:.2f} | {received / done:.1f} |"
        )
    lines += ["", *shares(steps, stats.get(min(cfg.clients), {}), rtt_ms), ""]
    lines += ["", *bounds(cfg, cells, steps), ""]
    lines += [
        "",
        "Raw counters (runtime_stats and data service, difference over the cell):",
        "",
    ]
    for clients, per_node in stats.items():
        lines.append(f"* {clients} clients: " + "; ".join(f"{n}: {v}" for n, v in per_node.items()))
    lines.append("")
    return "\n".join(lines)


def sync_standby_table(cfg: Config, cells: dict[tuple[str, int], Cell]) -> list[str]:
    """nonstop against PostgreSQL with a sync standby: rates, and where the server CPU goes."""
    rows = [s for s in (PG_SYNC, PG_APPLY) if (s, min(cfg.clients)) in cells]
    if not rows:
        return []
    lines = [
        "PostgreSQL with a synchronous standby (issue 10's peer: the goal is nonstop ≥ 1× "
        "it at 64 clients, `synchronous_commit=on`).  `on`: COMMIT returns once the standby "
        "has flushed the WAL; `remote_apply`: once it has also replayed it.  A nonstop sync "
        "replica acknowledges a record once it has applied it durably "
        "(its `rep.ack` leaves after the persist of what it applied: "
        "docs/design/replication.md section 5), so `remote_apply` is the like-for-like "
        "peer for a read on a replica seeing every acknowledged commit, and `on` the peer "
        "for durability on two machines (reads on the primary, as nonstop's active node, "
        "see their own writes either way).  Server CPU is split between the primary "
        "(postmaster, backends, WAL sender) and the standby (startup process, WAL "
        "receiver).  Unless the configuration above selects sync replicas, nonstop keeps "
        "one copy of each object: these ratios then compare it with a replicated peer.",
        "",
        "| clients | nonstop ÷ "
        + " | nonstop ÷ ".join(r.removeprefix("postgresql, ") for r in rows)
        + " | "
        + " | ".join(f"server CPU µs/op, primary + standby ({r.split(', ')[-1]})" for r in rows)
        + " | goal (64 clients) |",
        "|" + " --- |" * (2 + 2 * len(rows)),
    ]
    for clients in cfg.clients:
        ns = cells[("nonstop", clients)]
        ratios, cpus = [], []
        for system in rows:
            peer = cells[(system, clients)]
            rate = peer.ops_per_s()
            ratios.append(ns.ops_per_s() / rate if rate else float("nan"))
            split = {
                role: _mean([d.get(role, float("nan")) for d in peer.server_cpu_by_role])
                for role in ("primary", "standby")
            }
            cpus.append(f"{split['primary']:.0f} + {split['standby']:.0f}")
        goal = ""
        if clients == 64 and rows[0] == PG_SYNC:
            goal = "≥ 1× on: " + ("**met**" if ratios[0] >= 1 else "**below**")
        lines.append(
            f"| {clients} | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + " | "
            + " | ".join(cpus)
            + f" | {goal} |"
        )
    return [*lines, ""]


def pgbench_table(
    cells: dict[tuple[str, int], Cell], runs: dict[int, dict[str, float]]
) -> list[str]:
    """nonstop's Python clients against pgbench driving the sync-standby server."""
    if not runs:
        return []
    lines = [
        "## Against pgbench (PostgreSQL with a sync standby)",
        "",
        "PostgreSQL's own load driver (C, prepared statements, `-j 2`) runs the same "
        "transfer (`bench.pg_peer.PGBENCH_TRANSFER`: two accounts locked in id order, one "
        "transfer row) on the server with the synchronous standby "
        "(`synchronous_commit=on`), one run per client count after the cells above.  Its "
        "figures bound what the server can do when the client costs nothing; the rows "
        "above drive it from Python like nonstop.",
        "",
        "| clients | pgbench transfers/s | pgbench mean latency ms | server CPU µs/op "
        "(primary + standby) | nonstop transfers/s | nonstop ÷ pgbench |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for clients, run in runs.items():
        ns = cells[("nonstop", clients)].ops_per_s()
        ratio = ns / run["tps"] if run["tps"] else float("nan")
        lines.append(
            f"| {clients} | {run['tps']:,.0f} | {run['latency_ms']:.2f} | "
            f"{run['server_cpu_us']:,.0f} | {ns:,.0f} | {ratio:.3f} |"
        )
    return [*lines, ""]


def readme_table(cfg: Config, readme: dict[tuple[int, int], dict[str, float]]) -> list[str]:
    if not readme:
        return []
    cols = list(next(iter(readme.values())))
    lines = [
        "## The README's transfer: commit gaps and deadlock victims",
        "",
        "The transfer above locks its accounts in order, so it never deadlocks.  The "
        "README's locks `src` then `dst`: transfers in opposite directions over a pair form "
        "wait-for cycles, across nodes, broken by the nodes' deadlock detection "
        "(docs/design/deadlocks.md) and replayed by `@transactional`.  One unmeasured "
        f"slice of {min(cfg.duration, 4.0):.0f} s per row (shared handles), over all accounts "
        f"and over {README_SPAN} of A and {README_SPAN} of B.  The bar (issue 14): no commit "
        "gap over 200 ms.",
        "",
        "| clients | accounts | " + " | ".join(cols) + " |",
        "| --- | --- | " + " | ".join("---" for _ in cols) + " |",
    ]
    for (clients, span), row in readme.items():
        lines.append(
            f"| {clients} | {2 * span} | " + " | ".join(f"{row[c]:,.1f}" for c in cols) + " |"
        )
    return [*lines, ""]


def gaps_and_victims(
    cfg: Config, cells: dict[tuple[str, int], Cell], stats: dict[int, dict[str, Any]]
) -> list[str]:
    """Commit gaps (per slice) and deadlock victims per 1,000 transfers (issue 14)."""
    lines = [
        "## Commit gaps and deadlock victims",
        "",
        "Commit gap: the longest interval of a slice's measured window in which no "
        "transfer of the cell committed (the bar: none over 200 ms).  Deadlock victims: "
        "transactions rolled back to break a wait-for cycle, found across nodes by the "
        "data plane (*distributed*) or in one node's lock table (*local*), and lock waits "
        "ended by `lock_wait` (*timeouts*), per 1,000 transfers done, over both nonstop "
        "rows of the cell (the nodes count them, not per row).  The benchmark's transfer "
        "takes its locks in account order, so cycles are rare by construction.",
        "",
        "| clients | system | longest commit gap, ms (per slice) | distributed victims "
        "/ 1,000 | local victims / 1,000 | lock timeouts / 1,000 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for clients in cfg.clients:
        both = [cells[k] for k in (("nonstop", clients), (OWN, clients)) if k in cells]
        done = sum(r.extra.get("done", r.ops) for c in both for r in c.results) or 1
        per = stats.get(clients, {})

        def per_k(key: str, per: dict[str, Any] = per, done: int = done) -> str:
            return f"{1000 * sum(v.get(key, 0) for v in per.values()) / done:.2f}"

        for c in both:
            lines.append(
                f"| {clients} | {c.system} | {', '.join(f'{g:.0f}' for g in c.gaps_ms)} | "
                f"{per_k('deadlock_victims')} | {per_k('deadlocks')} | {per_k('timeouts')} |"
            )
    return [*lines, ""]


# Messages on the critical path of one cross-node transfer (client attached to A, the
# account of B read through a branch): client RPCs get, get, create, commit; node to
# node: the branch get on B, prepare to B and its vote, the decision to the Raft leader,
# its append to a follower and the ack, the decision's answer to the coordinator.
CLIENT_RPCS = 4
PATH_MESSAGES = 8


def shares(steps: dict[str, float], stats1: dict[str, Any], rtt_ms: float) -> list[str]:
    """Where the time of one transfer alone goes: durable commits, network, lock waits."""
    total = sum(steps.get(k, 0.0) for k in ("get A", "get B", "create", "commit"))
    store = steps.get("lone durable store commit (this disk)", float("nan"))
    commits = sum(v.get("commits", 0) for v in stats1.values())
    commit_us = sum(v.get("commit_us", 0) for v in stats1.values())
    raft = commit_us / commits / 1000 if commits else float("nan")
    durable = store + raft
    network = (CLIENT_RPCS + PATH_MESSAGES) * rtt_ms
    rest = total - durable - network
    if not total:
        return []
    return [
        "## Where the time of one transfer goes (alone, estimated)",
        "",
        "| part | ms | share | how it is known |",
        "| --- | --- | --- | --- |",
        f"| durable commits on the path | {durable:.2f} | {durable / total:.0%} | the prepare "
        f"(A and B in parallel: one lone durable store commit, {store:.2f} ms, measured) + "
        f"the decision in the cluster log (leader and follower in parallel: one cluster-store "
        f"commit, {raft:.2f} ms, the nodes' own mean at 1 client) |",
        f"| network | {network:.2f} | {network / total:.0%} | {CLIENT_RPCS} client round "
        f"trips + {PATH_MESSAGES} node-to-node messages on the path, each costed at one "
        f"measured loopback round trip ({rtt_ms:.3f} ms): an upper bound for wire time |",
        "| lock waits | 0.00 | 0% | one client: no other transaction holds a lock |",
        f"| the rest: CPU and wake-ups of three Python processes | {rest:.2f} | "
        f"{rest / total:.0%} | the remainder (scheduling on a loaded machine included) |",
        f"| one transfer (get A + get B + create + commit) | {total:.2f} | 100% | measured |",
    ]


def bounds(cfg: Config, cells: dict[tuple[str, int], Cell], steps: dict[str, float]) -> list[str]:
    """The "what bounds it" section: computed from this run's numbers."""
    top = max(cfg.clients)
    ns, pg = cells[("nonstop", top)], cells[("postgresql", top)]
    ns_cpu = ns.cpu() + ns.server_cpu()
    pg_cpu = pg.cpu() + pg.server_cpu()
    cores = os.cpu_count() or 1
    little = top / (ns.lat(50) / 1000) if ns.lat(50) == ns.lat(50) and ns.lat(50) > 0 else 0.0
    commit = steps.get("commit", float("nan"))
    store = steps.get("lone durable store commit (this disk)", float("nan"))
    fsync = steps.get("fsync (4 KiB write + fsync)", float("nan"))

    def loaded(step: str) -> float:
        return steps.get(f"{step}, at {top} clients", float("nan"))

    loaded_total = sum(loaded(k) for k in ("get", "get 2", "create", "commit")) or float("nan")
    every = steps.get("contention all", float("nan")) or float("nan")
    tenth = steps.get("contention tenth", float("nan"))
    return [
        "## What bounds it",
        "",
        f"* **CPU.** At {top} clients one nonstop transfer costs {ns_cpu:,.0f} µs of CPU in all "
        f"(client {ns.cpu():,.0f} + three nodes {ns.server_cpu():,.0f}); one PostgreSQL "
        f"transfer {pg_cpu:,.0f} µs (client {pg.cpu():,.0f} + server {pg.server_cpu():,.0f}).  "
        f"With all {cores} cores free the CPU ceiling would be "
        f"{cores * 1e6 / ns_cpu:,.0f}/s for nonstop and {cores * 1e6 / pg_cpu:,.0f}/s for "
        f"PostgreSQL: the CPU ratio alone caps nonstop at {pg_cpu / ns_cpu:.2f}× PostgreSQL "
        "on one machine, before any waiting.  The cores are shared with other work (see the "
        "load column), so both systems reach only part of their ceilings.",
        f"* **Latency of the commit protocol.** Alone, the commit of a cross-node transfer "
        f"takes {commit:.1f} ms, against {store:.2f} ms for a lone durable store commit and "
        f"{fsync:.2f} ms for an fsync on this disk.  On its critical path are: the prepare on "
        "A and B (one durable store commit each, in parallel), the votes, the decision "
        "appended to the Raft cluster log (a durable commit on the leader and on a follower), "
        "its application on the coordinator, then the reply; phase two and the compaction "
        "of the decision follow off the path.  That is two durable commits in sequence "
        "(the prepare; the decision on the leader and a follower in parallel) plus some "
        "eight messages "
        "between three processes, each a wake-up of a Python process on a loaded machine.  "
        "The per-cell table shows what a transfer costs in work: its decision entry in the "
        "cluster log (compaction entries are batched), committed with fsync on the nodes "
        "(group commit shares those fsyncs under load), the dtx persists (prepared records, "
        "outcome tombstones) in the node stores, and the peer messages.",
        f"* **Under load the wait is in the commit.** At {top} clients the steps of one "
        f"transfer take (median) get {loaded('get'):.1f}, get {loaded('get 2'):.1f}, create "
        f"{loaded('create'):.1f} and commit {loaded('commit'):.1f} ms: the commit is "
        f"{loaded('commit') / loaded_total:.0%} of it.  A commit passes three group commits "
        "in sequence (prepared records in the stores, the decision on the Raft leader and a "
        "follower), and each batch waits for the one before it on the same disk and for CPU.",
        f"* **Concurrency.** With {top} clients and a p50 of {ns.lat(50):.0f} ms, Little's law "
        f"allows {little:,.0f} transfers/s at the median latency; measured "
        f"{ns.ops_per_s():,.0f}/s"
        + (
            f" (the tail, p99 {ns.lat(99):.0f} ms, holds clients longer than the median says)"
            if ns.ops_per_s() < 0.8 * little
            else ""
        )
        + ".  More clients only lengthen the queue: each transfer waits for CPU in three "
        "processes and for the group commits ahead of it.",
        "* **Lock waits.** Transfers take their two write locks in account order over "
        f"{2 * cfg.accounts:,} accounts, so with {top} transfers in flight a transfer meets a "
        f"locked account with probability about "
        f"{1 - (1 - 2 / (2 * cfg.accounts)) ** (2 * (top - 1)):.0%}.  The nodes do not export "
        "lock-wait time; measured instead (extra slices, interleaved): over all accounts "
        f"{steps.get('contention all', float('nan')):,.0f} transfers/s, over a tenth of them "
        f"(ten times the collisions) {steps.get('contention tenth', float('nan')):,.0f}/s: "
        f"ten times the collisions cost {1 - tenth / every:.0%} of the rate, so at the "
        "benchmark's own contention lock waits cost roughly a tenth of that.",
        "* **Network**: a client request round trip on loopback is far below a millisecond "
        "(table above); the cost of messages is CPU (framing, msgpack, system calls, wake-ups) "
        "and is counted in the CPU figures, not as wire time.  The profile below gives the "
        "share of each node's Python time spent in socket writes: on loopback TCP the "
        "sender's system call also does the receiver's TCP work, and the frames of one "
        "event-loop turn already leave in one write per connection.",
    ]


def _la(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def _git_state() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"
    return f"commit {head}" + (" + uncommitted changes in src/" if dirty else "")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m bench.distributed_bench", description=__doc__)
    p.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument("--rounds", type=int, default=2, help="interleaved slices per cell")
    p.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per slice")
    p.add_argument("--accounts", type=int, default=1000, help="accounts on each of A and B")
    p.add_argument("--tmpdir", default=None, help="where the cluster and PostgreSQL data go")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="1 s cells, one slice (smoke test)")
    p.add_argument("--no-profile", action="store_true", help="skip the py-spy profile slice")
    p.add_argument(
        "--gaps-only",
        action="store_true",
        help="only the README transfer's commit gaps (max, p99), transfers/s and deadlock "
        "victims, per client count, over --accounts of A and of B (default 12: 24 in all), "
        "--duration s x --rounds slices each; prints a table, writes nothing",
    )
    p.add_argument(
        "--ordered",
        action="store_true",
        help="with --gaps-only: each slice also with the benchmark's ordered transfer "
        "(the same accounts and contention, no deadlock)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="with --gaps-only: a node config option, e.g. deadlock_every=0.01",
    )
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="PostgreSQL peers: pg (single server), pg-sync (a sync standby, "
        "synchronous_commit=on), pg-sync-apply (the same standby, remote_apply); "
        "pg is always included",
    )
    p.add_argument(
        "--nonstop-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="node configuration (JSON value, dotted keys for tables; repeatable), "
        "e.g. ha.data=partitions",
    )
    args = p.parse_args(argv)
    if not any(o.split("=", 1)[0].split(".")[0].strip() == "ha" for o in args.nonstop_option):
        # What a node config does by default, and what issue 10 measures: routing by
        # partition, one sync replica per partition.  `--nonstop-option ha.data=nodes`
        # measures the older routing by node (one copy of each object).
        args.nonstop_option = [*DEFAULT_HA, *args.nonstop_option]
    try:  # checked before anything starts
        peers = parse_peers(args.peers)
        parse_nonstop_options(args.nonstop_option)
    except ValueError as exc:
        p.error(str(exc))
    cfg = Config(
        clients=tuple(int(x) for x in args.clients.split(",") if x),
        duration=1.0 if args.quick else args.duration,
        warmup=0.2 if args.quick else args.warmup,
        rounds=1 if args.quick else args.rounds,
        accounts=args.accounts,
        tmpdir=args.tmpdir,
        out=args.out,
        profile=not args.no_profile,
        ordered=args.ordered,
        options={k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)},
        peers=peers,
        nonstop_options=tuple(args.nonstop_option),
        command=(
            "make bench-dist"
            if not argv
            else "python -m bench.distributed_bench " + shlex.join(argv)
        ),
    )
    if args.gaps_only:
        if "--accounts" not in argv:
            cfg.accounts = README_SPAN
        gaps_only(cfg)
        return
    run(cfg)


if __name__ == "__main__":
    main()
