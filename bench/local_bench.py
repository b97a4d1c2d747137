"""The local (embedded, single-node) benchmark: nonstop against SQLite and raw LMDB.

What runs, each cell in a fresh temporary directory with durable commits:

* **rmw** — one transaction reads one account and writes it back (+1);
* **transfer** — one transaction moves 1 from account A to account B (uniform
  random distinct pair out of ``accounts``; both write-locked up front, in
  number order, like a careful application would; ``@nonstop.transactional``
  replays the rare deadlock or conflict);

with 1, 8 and 64 concurrent clients, as threads and as asyncio tasks, side by
side in the same run with SQLite (threads only: it has no asyncio API) and the
raw LMDB floor (one writer, ``clients`` operations per fsync).  Then a snapshot
read: every object of a large extent in one snapshot transaction.

Where a goal is missed, the run profiles the case and puts the top of the profile
in the report.  See ``bench/README.md`` for what each number means.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import functools
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import lmdb

import nonstop
from bench import peers
from bench.peers import (
    WORKLOADS,
    LmdbFloor,
    Result,
    SqlitePeer,
    SyncOp,
    fsync_cost,
    pick,
    run_tasks,
    run_threads,
)

RESULTS = Path(__file__).resolve().parent / "results" / "local.md"
CLIENTS = (1, 8, 64)
MODES = ("threads", "asyncio")
INITIAL_BALANCE = 1000
TREE_LINES = 70

# The goals of the issue (all durable).
GOAL_TRANSFERS_64 = 10_000.0  # transfers per second at 64 clients
GOAL_RATIO_8 = 2.0  # transfers at 8 clients, times SQLite's
GOAL_SNAPSHOT = 200_000.0  # objects per second read in one snapshot transaction


class Account(nonstop.Managed):
    """The benchmark's object: an account number (unique key) and a balance."""

    number: int = nonstop.key(unique=True)
    balance: int = 0


# -------------------------------------------------------------- operations
@nonstop.transactional
def rmw(tx: nonstop.Transaction, a: int) -> None:
    acct = tx.get(Account, number=a, lock="write")
    acct.balance += 1


@nonstop.transactional
def transfer(tx: nonstop.Transaction, a: int, b: int) -> None:
    lo, hi = (a, b) if a < b else (b, a)
    first = tx.get(Account, number=lo, lock="write")
    second = tx.get(Account, number=hi, lock="write")
    src, dst = (first, second) if lo == a else (second, first)
    src.balance -= 1
    dst.balance += 1


@nonstop.transactional
async def rmw_async(tx: nonstop.AsyncTransaction, a: int) -> None:
    acct = await tx.get(Account, number=a, lock="write")
    acct.balance += 1


@nonstop.transactional
async def transfer_async(tx: nonstop.AsyncTransaction, a: int, b: int) -> None:
    lo, hi = (a, b) if a < b else (b, a)
    first = await tx.get(Account, number=lo, lock="write")
    second = await tx.get(Account, number=hi, lock="write")
    src, dst = (first, second) if lo == a else (second, first)
    src.balance -= 1
    dst.balance += 1


SYNC_OPS: dict[str, Callable[..., Any]] = {"rmw": rmw, "transfer": transfer}
ASYNC_OPS: dict[str, Callable[..., Any]] = {"rmw": rmw_async, "transfer": transfer_async}


def load(db: nonstop.Database, n: int, chunk: int = 5000) -> float:
    """Create accounts 0..n-1 (balance 1000); returns objects created per second."""
    t0 = time.perf_counter()
    for start in range(0, n, chunk):
        with db.transaction() as tx:
            for i in range(start, min(n, start + chunk)):
                tx.create(Account, number=i, balance=INITIAL_BALANCE)
    return n / (time.perf_counter() - t0)


def total_balance(db: nonstop.Database) -> tuple[int, int]:
    with db.transaction("snapshot") as tx:
        objs = tx.query(Account).lock("none").all()
        return len(objs), sum(o.balance for o in objs)


def event_loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """uvloop when installed (as the node runtime does), else the stdlib loop."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None, "asyncio (stdlib loop)"
    return uvloop.new_event_loop, f"asyncio on uvloop {uvloop.__version__}"


# ------------------------------------------------------------------ config
@dataclass(slots=True)
class Config:
    duration: float = 4.0
    warmup: float = 0.3
    accounts: int = 10_000
    read_objects: int = 200_000
    clients: tuple[int, ...] = CLIENTS
    workloads: tuple[str, ...] = WORKLOADS
    modes: tuple[str, ...] = MODES
    rounds: int = 3  # interleaved slices per cell (the duration is split between them)
    profile: str = "auto"  # auto (where a goal is missed) | always | never
    tmpdir: str | None = None
    out: Path = RESULTS
    command: str = ""


@dataclass(slots=True)
class Cell:
    workload: str
    clients: int
    mode: str
    nonstop: Result
    sqlite: Result | None
    floor: Result | None
    groups: int = 0
    commits: int = 0
    largest_group: int = 0
    invariant: str = "ok"
    fsync_ms: float = float("nan")  # the disk's fsync p50 right before this group of cells

    @property
    def per_group(self) -> float:
        return self.commits / self.groups if self.groups else 0.0


@dataclass(slots=True)
class ReadResult:
    objects: int
    nonstop_all: float  # objects/s, query().all() alone
    nonstop_touch: float  # objects/s, all() plus reading one field of each
    sqlite: float
    floor: float
    load_rate: float
    runs: dict[str, list[float]] = field(default_factory=dict)
    profile: list[str] = field(default_factory=list)  # report sections, when profiled


def _fields(cfg: Config) -> dict[str, Any]:
    return {name: getattr(cfg, name) for name in cfg.__slots__}  # type: ignore[attr-defined]


def merge(parts: list[Result]) -> Result:
    """Several slices of one cell as one result (CPU per op weighted by ops)."""
    ops = sum(p.ops for p in parts)
    seconds = sum(p.seconds for p in parts)
    lats = [x for p in parts for x in p.latencies]
    extra: dict[str, Any] = {}
    for p in parts:
        for k, v in p.extra.items():
            if k != "cpu_us":
                extra[k] = extra.get(k, 0) + v if isinstance(v, int) else v
    weighted = [(p.cpu_us, p.ops) for p in parts if p.ops and p.cpu_us == p.cpu_us]
    if weighted:
        extra["cpu_us"] = sum(c * n for c, n in weighted) / sum(n for _, n in weighted)
    return Result(ops, seconds, lats, extra)


# ------------------------------------------------------------- the cells
def nonstop_cell(
    cfg: Config,
    workload: str,
    mode: str,
    clients: int,
    profiler: Any = None,
    durability: str = "fsync",
) -> tuple[Result, dict[str, Any]]:
    """One nonstop cell in a fresh store; ``profiler`` is a context manager factory or None."""
    with tempfile.TemporaryDirectory(prefix="nonstop-bench-", dir=cfg.tmpdir) as d:
        db = nonstop.open(d, durability=durability)
        try:
            load(db, cfg.accounts)
            before = db.stats()
            n = cfg.accounts
            prof = profiler() if profiler is not None else _null()
            with prof:
                if mode == "threads":
                    fn = SYNC_OPS[workload]

                    def make(_: int) -> tuple[SyncOp, Callable[[], None]]:
                        def op(rng: random.Random) -> None:
                            fn(db, *pick(rng, n, workload))

                        return op, _noop

                    res = run_threads(clients, make, cfg.duration, cfg.warmup)
                else:
                    afn = ASYNC_OPS[workload]

                    async def aop(rng: random.Random) -> None:
                        await afn(db, *pick(rng, n, workload))

                    factory, _ = event_loop_factory()
                    with asyncio.Runner(loop_factory=factory) as runner:
                        res = runner.run(run_tasks(clients, aop, cfg.duration, cfg.warmup))
            after = db.stats()
            count, total = total_balance(db)
        finally:
            db.close()
    info: dict[str, Any] = {
        "groups": after["commit_groups"] - before["commit_groups"],
        "commits": after["commits"] - before["commits"],
        "largest_group": after["largest_group"],
        "invariant": "ok",
    }
    if count != n or (workload == "transfer" and total != n * INITIAL_BALANCE):
        info["invariant"] = f"BROKEN: {count} accounts, total {total}"
    return res, info


def sqlite_cell(cfg: Config, workload: str, clients: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="sqlite-bench-", dir=cfg.tmpdir) as d:
        peer = SqlitePeer(d, cfg.accounts)
        res = run_threads(clients, peer.make_op(workload), cfg.duration, cfg.warmup)
        res.extra["busy_retries"] = peer.busy_retries
        if workload == "transfer" and peer.total() != cfg.accounts * INITIAL_BALANCE:
            res.extra["invariant"] = "BROKEN"
    return res


def floor_cell(cfg: Config, workload: str, batch: int, *, metasync: bool = True) -> Result:
    with tempfile.TemporaryDirectory(prefix="lmdb-bench-", dir=cfg.tmpdir) as d:
        floor = LmdbFloor(d, cfg.accounts, metasync=metasync)
        try:
            return floor.run(workload, batch, cfg.duration, cfg.warmup)
        finally:
            floor.close()


def read_cell(cfg: Config) -> ReadResult:
    n = cfg.read_objects
    runs: dict[str, list[float]] = {"all": [], "touch": [], "sqlite": [], "floor": []}
    profile: list[str] = []
    with tempfile.TemporaryDirectory(prefix="nonstop-read-", dir=cfg.tmpdir) as d:
        db = nonstop.open(d)
        try:
            load_rate = load(db, n)
            for _ in range(3):
                t0 = time.perf_counter()
                with db.transaction("snapshot") as tx:
                    objs = tx.query(Account).lock("none").all()
                    t1 = time.perf_counter()
                    total = sum(o.balance for o in objs)
                t2 = time.perf_counter()
                assert len(objs) == n and total == n * INITIAL_BALANCE, (len(objs), total)
                runs["all"].append(n / (t1 - t0))
                runs["touch"].append(n / (t2 - t0))
                del objs
            below = statistics.median(runs["touch"]) < GOAL_SNAPSHOT
            if cfg.profile == "always" or (cfg.profile == "auto" and below):
                _log("profiling: snapshot read")
                title = f"Snapshot read of {n:,} objects in one transaction"
                with (
                    profiled(profile, title, threads=False) as box,
                    db.transaction("snapshot") as tx,
                ):
                    objs = tx.query(Account).lock("none").all()
                    sum(o.balance for o in objs)
                    box["ops"], box["unit"] = len(objs), "object"
                del objs
        finally:
            db.close()
    with tempfile.TemporaryDirectory(prefix="sqlite-read-", dir=cfg.tmpdir) as d:
        peer = SqlitePeer(d, n)
        for _ in range(3):
            t0 = time.perf_counter()
            rows, total = peer.scan()
            runs["sqlite"].append(rows / (time.perf_counter() - t0))
            assert rows == n and total == n * INITIAL_BALANCE
    with tempfile.TemporaryDirectory(prefix="lmdb-read-", dir=cfg.tmpdir) as d:
        floor = LmdbFloor(d, n)
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                rows, total = floor.scan()
                runs["floor"].append(rows / (time.perf_counter() - t0))
        finally:
            floor.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return ReadResult(
        n, med["all"], med["touch"], med["sqlite"], med["floor"], load_rate, runs, profile
    )


# ---------------------------------------------------------------- profiles
class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _noop() -> None:
    return None


class StackSampler:
    """Every thread's CPU time, and a sampler of every thread's Python stack.

    CPU time and run-queue wait per thread come from Linux schedstat (read every
    ``cpu_interval``, and by each client thread as it ends; exact, whatever the GIL
    does): which thread role is busy, which waits, and how much the machine's other
    work kept runnable threads off the CPUs.  Stacks come from ``sys._current_frames`` every
    ``interval``: pyinstrument sees only its own thread, this sees the client
    threads and the group-commit writer.  A sample is taken when the sampler holds
    the GIL, so lines where a thread had released it (a C call such as an fsync or
    an LMDB read, a lock wait) are over-represented against pure-Python lines.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.self_lines: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.samples: collections.Counter[str] = collections.Counter()
        self.cpu_interval = 0.1
        self._cpu_start: dict[int, tuple[float, float]] = {}
        self._cpu_last: dict[int, tuple[float, float]] = {}
        self._tid_role: dict[int, str] = {}
        self._threads_per_role: dict[str, set[int]] = collections.defaultdict(set)
        self._wall = 0.0
        self._cpu_lock = threading.Lock()
        self._final: set[int] = set()  # threads whose last CPU figure is exact
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        self._wall = time.perf_counter()
        self._read_cpu(first=True)
        peers.on_thread_exit.append(self._thread_exit)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        peers.on_thread_exit.remove(self._thread_exit)
        self._read_cpu()
        self._wall = time.perf_counter() - self._wall

    def _thread_exit(self, tid: int, sched: tuple[float, float]) -> None:
        """A client thread's exact figures, reported by itself as it ends."""
        with self._cpu_lock:
            self._tid_role[tid] = self.role(threading.current_thread().name)
            self._cpu_start.setdefault(tid, (0.0, 0.0))
            self._cpu_last[tid] = sched
            self._final.add(tid)

    def _read_cpu(self, *, first: bool = False) -> None:
        """CPU and run-queue wait of every live thread of this process (Linux schedstat)."""
        roles = {t.native_id: self.role(t.name) for t in threading.enumerate()}
        try:
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            return
        for tid in tids:
            try:
                sched = peers.thread_sched(tid)
            except (OSError, ValueError):
                continue  # the thread ended, or no schedstat
            with self._cpu_lock:
                if tid in self._final:
                    continue
                if tid in roles and tid not in self._tid_role:
                    self._tid_role[tid] = roles[tid]
                if first or tid not in self._cpu_start:
                    self._cpu_start[tid] = sched if first else (0.0, 0.0)
                self._cpu_last[tid] = sched

    def cpu_report(self) -> str:
        busy: collections.Counter[str] = collections.Counter()
        waiting: collections.Counter[str] = collections.Counter()
        count: collections.Counter[str] = collections.Counter()
        for tid, (cpu, wait) in self._cpu_last.items():
            role = self._tid_role.get(tid) or "other threads"
            if tid == self._thread.native_id:
                role = "the sampler itself"
            cpu0, wait0 = self._cpu_start.get(tid, (0.0, 0.0))
            busy[role] += cpu - cpu0
            waiting[role] += wait - wait0
            count[role] += 1
        wall = self._wall or 1.0
        out = [
            f"Per thread role over {wall:.1f} s of wall time (Linux schedstat, exact): CPU used, "
            "and time runnable but waiting for a CPU (taken by other threads or processes), "
            "both in % of one core:"
        ]
        for role, cpu in busy.most_common():
            out.append(
                f"  {role:26} {count[role]:3} thread(s)  CPU {100 * cpu / wall:5.1f}%  "
                f"waiting for a CPU {100 * waiting[role] / wall:5.1f}%"
            )
        return "\n".join(out) + "\n"

    @staticmethod
    def role(name: str) -> str:
        if name.startswith("bench-client"):
            return "client threads"
        if name == "nonstop-group-commit":
            return "group-commit writer"
        if name == "MainThread":
            return "main thread (event loop)"
        return "other threads"

    def _run(self) -> None:
        me = threading.get_ident()
        next_cpu = time.perf_counter() + self.cpu_interval
        while not self._stop.wait(self.interval):
            if time.perf_counter() >= next_cpu:
                self._read_cpu()
                next_cpu = time.perf_counter() + self.cpu_interval
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                while frame is not None and "pyinstrument" in frame.f_code.co_filename:
                    frame = frame.f_back  # the profiler's own frames are not the workload
                if frame is None:
                    continue
                role = self.role(names.get(ident, "?"))
                self.samples[role] += 1
                self.self_lines[role][_where(frame, line=True)] += 1
                seen: set[str] = set()
                f: FrameType | None = frame
                while f is not None:
                    seen.add(_where(f, line=False))
                    f = f.f_back
                for key in seen:
                    self.inclusive[role][key] += 1

    def report(self, top: int = 12, *, main_thread: bool = True) -> str:
        out: list[str] = []
        for role, n in self.samples.most_common():
            if role == "other threads" or (role.startswith("main") and not main_thread):
                continue
            out.append(f"{role}: {n} samples")
            out.append("  self  (the line each thread was on; C calls show as their caller)")
            for key, c in self.self_lines[role].most_common(top):
                out.append(f"  {100 * c / n:5.1f}%  {key}")
            out.append(
                "  inclusive (function anywhere on the stack; those on every stack left out)"
            )
            shown = [(k, c) for k, c in self.inclusive[role].most_common() if c < n]
            for key, c in shown[:top]:
                out.append(f"  {100 * c / n:5.1f}%  {key}")
            out.append("")
        return "\n".join(out)


def _where(frame: FrameType, *, line: bool) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("/site-packages/", "/src/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:  # the repository's own files (bench/): relative, no path of this machine
        repository = str(Path(__file__).resolve().parent.parent) + os.sep
        path = path.removeprefix(repository)
    if line:
        return f"{path}:{frame.f_lineno} {code.co_name}"
    return f"{path} {code.co_qualname}"


@contextmanager
def profiled(
    sink: list[str],
    title: str,
    *,
    threads: bool = True,
    tree: bool = True,
    note: str = "",
) -> Iterator[dict[str, Any]]:
    """Profile the block; append a text report to ``sink``.

    ``threads``: sample every thread (:class:`StackSampler`).  ``tree``: profile the
    calling thread with pyinstrument — its hottest functions by own time and the top
    of its call tree.  The block may set ``ops`` and ``unit`` in the dict it gets:
    the flat profile is then in µs per operation.
    """
    box: dict[str, Any] = {}
    profiler: Any = None
    if tree:
        try:
            from pyinstrument import Profiler
        except ImportError:
            note += "(pyinstrument is not installed, no call tree: run `make venv`.)  "
        else:
            profiler = Profiler(interval=0.0005, async_mode="disabled")
    sampler = StackSampler() if threads else None
    t0 = time.perf_counter()
    with sampler if sampler is not None else _null():
        if profiler is not None:
            profiler.start()
        try:
            yield box
        finally:
            if profiler is not None:
                profiler.stop()
    text = [f"### {title}\n"] + ([note.rstrip() + "\n"] if note else [])
    if sampler is not None:
        text.append(
            "```\n" + sampler.cpu_report() + "```\n\n"
            f"Wall-clock stack samples of every thread ({time.perf_counter() - t0:.1f} s).  "
            "Percentages are of that thread role's samples; time spent waiting (for a lock, "
            "the commit) counts too.  Samples are taken when the sampler holds the GIL, so "
            "lines where a thread had released it (C calls: fsync, LMDB reads, lock waits) "
            "are over-represented"
            + (" — for the event-loop thread see pyinstrument below" if tree else "")
            + ".\n\n```\n"
            + sampler.report(main_thread=False)
            + "```\n"
        )
    if profiler is not None:
        if box.get("steps") and box.get("ops"):
            text.append(_steps_text(profiler, box["steps"], box["ops"], box.get("unit", "op")))
        text.append(_pyinstrument_text(profiler, box.get("ops"), box.get("unit", "op")))
    sink.append("\n".join(text))


# The steps of one transfer, by the function that does each (pyinstrument names).
ANATOMY = (
    ("run_with_retries", "the whole transfer (`@transactional` call)"),
    ("transfer", "its body: two `tx.get(Account, number=..., lock='write')`, two writes"),
    ("Transaction.find", "  of which the two unique-key lookups (lock + read)"),
    ("Transaction._prepare_commit", "commit: triggers, build the write set"),
    ("GroupCommitter.submit", "commit: queue the write set, wake the writer"),
    ("Event.wait", "commit: wait until the writer says durable"),
    ("Transaction._finish", "commit: release the locks"),
)


def _steps_text(profiler: Any, steps: tuple[tuple[str, str], ...], ops: int, unit: str) -> str:
    """Inclusive wall time of named functions (outermost occurrence), per operation."""
    root = profiler.last_session.root_frame()
    totals = dict.fromkeys((name for name, _ in steps), 0.0)

    def walk(frame: Any, open_names: frozenset[str]) -> None:
        name = f"{frame.class_name}.{frame.function}" if frame.class_name else frame.function
        if name in totals and name not in open_names:
            totals[name] += frame.time
            open_names = open_names | {name}
        for child in frame.children:
            walk(child, open_names)

    if root is not None:
        walk(root, frozenset())
    rows = [f"{'µs/' + unit:>12}  step"]
    rows += [f"{totals[name] * 1e6 / ops:12.1f}  {label}" for name, label in steps]
    return (
        f"Where the wall time of one {unit} goes while profiled (pyinstrument slows the "
        "Python parts down):\n\n```\n" + "\n".join(rows) + "\n```\n"
    )


def _pyinstrument_text(profiler: Any, ops: int | None, unit: str) -> str:
    root = profiler.last_session.root_frame()
    own: collections.Counter[str] = collections.Counter()
    stack = [root] if root is not None else []
    while stack:
        frame = stack.pop()
        real = [c for c in frame.children if not c.is_synthetic]
        stack.extend(real)
        mine = frame.time - sum(c.time for c in real)
        if mine > 0:
            path = frame.file_path_short or ""
            where = f"{path}:{frame.line_no}" if frame.line_no else path
            own[f"{frame.function}  {where}"] += mine
    total = root.time if root is not None else 0.0
    if ops:
        scale, label = 1e6 / ops, f"µs per {unit}"
    else:
        scale, label = 1.0, "seconds"
    flat = [f"{'own time':>10}  {'share':>6}  function  (file:line)"]
    for name, t in own.most_common(25):
        flat.append(f"{t * scale:10.2f}  {100 * t / total if total else 0:5.1f}%  {name}")
    lines = profiler.output_text(unicode=False, color=False, show_all=False).splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Profile at")), -1)
    body = [ln for ln in lines[start + 1 :] if ln.strip()]
    return (
        f"pyinstrument, the profiled thread: hottest functions by own time ({label}; "
        "a C function such as `lock.acquire` is time spent inside it, e.g. waiting):\n\n"
        "```\n" + "\n".join(flat) + "\n```\n\n"
        "Call tree (seconds, top):\n\n```\n" + "\n".join(body[:TREE_LINES]) + "\n```\n"
    )


# ------------------------------------------------------------------ runner
def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fsync_p50(cfg: Config) -> float:
    probe_dir = tempfile.mkdtemp(prefix="fsync-probe-", dir=cfg.tmpdir)
    try:
        return fsync_cost(probe_dir, rounds=30)[0]
    finally:
        os.rmdir(probe_dir)


def run(cfg: Config) -> Path:
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    probe_dir = tempfile.mkdtemp(prefix="fsync-probe-", dir=cfg.tmpdir)
    try:
        fs50, fs99 = fsync_cost(probe_dir)
    finally:
        os.rmdir(probe_dir)
    _log(f"fsync of 4 KiB: p50 {fs50:.2f} ms, p99 {fs99:.2f} ms")
    probe = Config(duration=1.0, warmup=0.2, accounts=cfg.accounts, tmpdir=cfg.tmpdir)
    commit_cost = (
        floor_cell(probe, "rmw", 1).ops_per_s,
        floor_cell(probe, "rmw", 1, metasync=False).ops_per_s,
    )
    _log(f"LMDB lone commits/s: {commit_cost[0]:.0f} (metasync off: {commit_cost[1]:.0f})")
    cells: list[Cell] = []
    # Each (workload, clients) group runs in `rounds` interleaved slices, so that a burst
    # of other work on the shared machine hits every system alike.
    rounds = max(1, cfg.rounds)
    part = Config(**{**_fields(cfg), "duration": cfg.duration / rounds})
    for workload in cfg.workloads:
        for clients in cfg.clients:
            sqs: list[Result] = []
            fls: list[Result] = []
            runs: dict[str, list[tuple[Result, dict[str, Any]]]] = {m: [] for m in cfg.modes}
            disk = _fsync_p50(cfg)
            for _ in range(rounds):
                sqs.append(sqlite_cell(part, workload, clients))
                fls.append(floor_cell(part, workload, clients))
                for mode in cfg.modes:
                    runs[mode].append(nonstop_cell(part, workload, mode, clients))
            sq, fl = merge(sqs), merge(fls)
            _log(f"{workload:8} {clients:3} sqlite   {sq.ops_per_s:9.0f}/s")
            _log(f"{workload:8} {clients:3} lmdb     {fl.ops_per_s:9.0f}/s (batch {clients})")
            for mode in cfg.modes:
                res = merge([r for r, _ in runs[mode]])
                infos = [i for _, i in runs[mode]]
                cell = Cell(
                    workload,
                    clients,
                    mode,
                    res,
                    sq,
                    fl,
                    groups=sum(i["groups"] for i in infos),
                    commits=sum(i["commits"] for i in infos),
                    largest_group=max(i["largest_group"] for i in infos),
                    invariant=next((i["invariant"] for i in infos if i["invariant"] != "ok"), "ok"),
                    fsync_ms=disk,
                )
                cells.append(cell)
                _log(
                    f"{workload:8} {clients:3} {mode:8} {res.ops_per_s:9.0f}/s "
                    f"p50 {res.p50:.2f} ms p99 {res.p99:.2f} ms "
                    f"{cell.per_group:.1f} commits/group {cell.invariant}"
                )
    reads = read_cell(cfg)
    _log(
        f"snapshot read {reads.objects}: nonstop {reads.nonstop_all:.0f}/s "
        f"(+field {reads.nonstop_touch:.0f}/s), sqlite {reads.sqlite:.0f}/s, "
        f"lmdb {reads.floor:.0f}/s"
    )

    goals = evaluate(cells, reads)
    profiles: list[str] = []
    transfers_missed = any(not ok for name, _, ok in goals if name.startswith("transfers"))
    if cfg.profile == "always" or (cfg.profile == "auto" and transfers_missed):
        profiles = run_profiles(cfg)
    profiles += reads.profile
    text = render(
        cfg,
        cells,
        reads,
        goals,
        profiles,
        fsync=(fs50, fs99, _fsync_p50(cfg)),
        commit_cost=commit_cost,
        load=(load_before, os.getloadavg()),
        elapsed=time.perf_counter() - t_start,
    )
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(text)
    _log(f"wrote {cfg.out} in {time.perf_counter() - t_start:.0f} s")
    return cfg.out


def run_profiles(cfg: Config) -> list[str]:
    out: list[str] = []
    clients = max(cfg.clients)
    short = Config(
        duration=min(cfg.duration, 3.0),
        warmup=cfg.warmup,
        accounts=cfg.accounts,
        tmpdir=cfg.tmpdir,
    )
    if "transfer" in cfg.workloads:
        _log(f"profiling: transfers, {clients} clients, without fsync")
        rows = [
            "### Without fsync: the CPU ceiling\n",
            f'The transfer cells at {clients} clients again, with `durability="none"` '
            "(commits are not synced: not a mode the goals allow, but it shows what the "
            "transaction layer alone can do on this machine right now).\n",
            "| mode | transfers/s | p50 ms | p99 ms | CPU µs/op | commits/group |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for mode in cfg.modes:
            res, info = nonstop_cell(short, "transfer", mode, clients, durability="none")
            per = info["commits"] / info["groups"] if info["groups"] else 0.0
            rows.append(
                f"| {mode} | {res.ops_per_s:,.0f} | {res.p50:.2f} | {res.p99:.2f} | "
                f"{res.cpu_us:,.0f} | {per:.1f} |"
            )
        out.append("\n".join(rows) + "\n")
        _log("profiling: CPU cost of one transfer")
        out.extend(cpu_anatomy(cfg))
        for mode in cfg.modes:
            _log(f"profiling: transfers, {clients} {mode}")
            sink: list[str] = []
            if mode == "asyncio":
                title = f"Transfers, {clients} asyncio tasks"
                note = "Every transaction runs on the main thread's event loop.  "
            else:
                title = f"Transfers, {clients} threads"
                note = ""
            res, info = nonstop_cell(
                short,
                "transfer",
                mode,
                clients,
                profiler=functools.partial(
                    profiled, sink, title, tree=mode == "asyncio", note=note
                ),
            )
            groups = info["groups"] or 1
            sink[0] = sink[0].replace(
                "\n\n",
                f"\n\n{res.ops_per_s:,.0f} transfers/s while profiled, "
                f"{info['commits'] / groups:.1f} commits per group, "
                f"{groups / (short.duration + short.warmup):,.0f} groups/s.\n\n",
                1,
            )
            out.extend(sink)
    return out


def cpu_anatomy(cfg: Config, n: int = 3000) -> list[str]:
    """Where the CPU of one transfer goes: one thread, no fsync (``durability="none"``)."""
    out: list[str] = []
    with tempfile.TemporaryDirectory(prefix="nonstop-cpu-", dir=cfg.tmpdir) as d:
        db = nonstop.open(d, durability="none")
        try:
            load(db, cfg.accounts)
            rng = random.Random(3)
            for _ in range(300):
                transfer(db, *pick(rng, cfg.accounts, "transfer"))
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(n):
                transfer(db, *pick(rng, cfg.accounts, "transfer"))
            cpu = (time.process_time() - c0) / n * 1e6
            wall = (time.perf_counter() - t0) / n * 1e6
            note = (
                f'One client thread, `durability="none"` (no fsync), {n:,} transfers: '
                f"**{cpu:.0f} µs of CPU per transfer** (whole process, the group-commit "
                f"writer included), {wall:.0f} µs wall.  With one GIL, 10,000 transfers/s "
                "leaves at most 100 µs of CPU per transfer for everything.\n\n"
            )
            with profiled(out, "CPU cost of one transfer", threads=False, note=note) as box:
                for _ in range(n):
                    transfer(db, *pick(rng, cfg.accounts, "transfer"))
                box["ops"], box["unit"] = n, "transfer"
                box["steps"] = ANATOMY
        finally:
            db.close()
    return out


# ----------------------------------------------------------------- report
Goal = tuple[str, str, bool]


def evaluate(cells: list[Cell], reads: ReadResult) -> list[Goal]:
    goals: list[Goal] = []
    for c in cells:
        if c.workload != "transfer":
            continue
        if c.clients == 64:
            goals.append(
                (
                    f"transfers at 64 clients ({c.mode}) ≥ 10,000/s",
                    f"{c.nonstop.ops_per_s:,.0f}/s",
                    c.nonstop.ops_per_s >= GOAL_TRANSFERS_64,
                )
            )
        if c.clients == 8 and c.sqlite is not None:
            ratio = _ratio(c.nonstop, c.sqlite)
            goals.append(
                (
                    f"transfers at 8 clients ({c.mode}) ≥ 2× SQLite",
                    f"{ratio:.2f}× ({c.nonstop.ops_per_s:,.0f} vs {c.sqlite.ops_per_s:,.0f}/s)",
                    ratio >= GOAL_RATIO_8,
                )
            )
    goals.append(
        (
            "snapshot read ≥ 200,000 objects/s in one transaction",
            f"{reads.nonstop_touch:,.0f}/s reading a field of each "
            f"({reads.nonstop_all:,.0f}/s for all() alone)",
            reads.nonstop_touch >= GOAL_SNAPSHOT,
        )
    )
    return goals


def reading(cells: list[Cell]) -> list[str]:
    """Plain sentences on the transfer cells: disk or CPU bound, and why the ratios."""
    out: list[str] = []
    top = max((c.clients for c in cells), default=0)
    for c in cells:
        if c.workload != "transfer" or c.clients != top:
            continue
        ceiling = 1e6 / c.nonstop.cpu_us if c.nonstop.cpu_us == c.nonstop.cpu_us else 0.0
        floor = f"{c.floor.ops_per_s:,.0f}/s" if c.floor else "n/a"
        out.append(
            f"* transfers, {top} {c.mode}: {c.nonstop.ops_per_s:,.0f}/s with "
            f"{c.per_group:.1f} commits per fsync'd group; the LMDB floor at batch {top} "
            f"does {floor}; nonstop spent {c.nonstop.cpu_us:,.0f} µs of CPU per transfer, "
            f"so one GIL caps it near {ceiling:,.0f}/s whatever the disk does."
        )
    for c in cells:
        if c.workload != "transfer" or c.clients != 8 or c.sqlite is None:
            continue
        out.append(
            f"* transfers, 8 {c.mode} (fsync {c.fsync_ms:.2f} ms before the row): groups of "
            f"{c.per_group:.1f} commits for 8 clients — the clients fall into two cohorts, one "
            "running while the other's group syncs.  Each group is one LMDB commit, two syncs "
            "(data, then meta page); SQLite syncs once per commit.  So when syncs dominate "
            "(fsync of a few ms) nonstop ÷ SQLite tends to commits per group ÷ 2 ≈ "
            f"{c.per_group / 2:.1f}×; when the disk is fast (fsync ≈ 0.2 ms) CPU decides: "
            f"here nonstop spent {c.nonstop.cpu_us:,.0f} µs of CPU per transfer, SQLite "
            f"{c.sqlite.cpu_us:,.0f} µs.  Measured: {_ratio(c.nonstop, c.sqlite):.2f}×."
        )
    return out


def _ratio(a: Result, b: Result) -> float:
    return a.ops_per_s / b.ops_per_s if b.ops_per_s else float("inf")


def render(
    cfg: Config,
    cells: list[Cell],
    reads: ReadResult,
    goals: list[Goal],
    profiles: list[str],
    *,
    fsync: tuple[float, float, float],
    commit_cost: tuple[float, float],
    load: tuple[tuple[float, float, float], tuple[float, float, float]],
    elapsed: float,
) -> str:
    _, loop_name = event_loop_factory()
    lines = [
        "# nonstop local benchmark",
        "",
        f"Produced by `{cfg.command}` on {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC "
        f"in {elapsed:.0f} s.",
        "",
        "| machine | |",
        "| --- | --- |",
        f"| CPUs (nproc) | {os.cpu_count()} — shared with other work: numbers are noisy |",
        f"| load average before / after | {_la(load[0])} / {_la(load[1])} |",
        f"| nonstop source | {_git_state()} |",
        f"| Python | {platform.python_version()} ({platform.python_implementation()}) |",
        f"| platform | {platform.platform()} |",
        f"| LMDB | py-lmdb {lmdb.__version__}, liblmdb {'.'.join(map(str, lmdb.version()))} |",
        f"| SQLite | {sqlite3.sqlite_version} |",
        f"| asyncio | {loop_name} |",
        f"| fsync of 4 KiB on the temp dir's disk | at the start p50 {fsync[0]:.2f} ms, "
        f"p99 {fsync[1]:.2f} ms; at the end p50 {fsync[2]:.2f} ms (it changes with the "
        "other work on the machine: see the fsync column below) |",
        f"| lone durable LMDB commits (1 update each) | {commit_cost[0]:,.0f}/s; "
        f"{commit_cost[1]:,.0f}/s with `metasync=False` (LMDB syncs twice per commit: data, "
        "then meta page) |",
        f"| each cell | {cfg.rounds} interleaved round(s) (SQLite, LMDB floor, nonstop threads, "
        f"nonstop asyncio), each {cfg.warmup:g} s warm-up then {cfg.duration / cfg.rounds:.2f} s "
        f"measured in a fresh temp directory with {cfg.accounts:,} accounts |",
        "",
        "## Goals",
        "",
        "| goal | reached | |",
        "| --- | --- | --- |",
    ]
    for name, value, ok in goals:
        lines.append(f"| {name} | {value} | {'met' if ok else '**below**'} |")
    lines += ["", *reading(cells), "", "## Transactions"]
    lines += [
        "",
        "ops/s = committed transactions per second (durable); p50/p99 = latency of one "
        "transaction in ms, as its client saw it.  fsync ms = p50 of a 4 KiB write + fsync "
        "on the same disk right before the row's cells: the disk's mood of the moment, which "
        "decides whether SQLite (one sync per commit) or CPU bounds the results.  "
        "CPU µs/op = the process's CPU time "
        "(every thread) per operation: unlike ops/s it barely moves when other work shares "
        "the machine, and with one GIL, 1,000,000 ÷ CPU µs/op is roughly the most one "
        "process can do however fast the disk is.  SQLite runs with threads in both the "
        "threads and the asyncio rows (it has no asyncio API; the asyncio row repeats the "
        "threads measurement).  LMDB floor = raw LMDB, one writer, `clients` operations per "
        "fsync'd write transaction (its latency is one batch).",
        "",
        "| workload | clients | fsync ms | mode | nonstop ops/s | p50 | p99 | CPU µs/op | "
        "commits/group | "
        "SQLite ops/s | p50 | p99 | CPU µs/op | nonstop ÷ SQLite | LMDB floor ops/s | "
        "nonstop ÷ floor |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        sq, fl = c.sqlite, c.floor
        row = [
            c.workload,
            str(c.clients),
            f"{c.fsync_ms:.2f}",
            c.mode,
            f"{c.nonstop.ops_per_s:,.0f}",
            f"{c.nonstop.p50:.2f}",
            f"{c.nonstop.p99:.2f}",
            f"{c.nonstop.cpu_us:,.0f}",
            f"{c.per_group:.1f} (max {c.largest_group})",
            f"{sq.ops_per_s:,.0f}" if sq else "—",
            f"{sq.p50:.2f}" if sq else "—",
            f"{sq.p99:.2f}" if sq else "—",
            f"{sq.cpu_us:,.0f}" if sq else "—",
            f"**{_ratio(c.nonstop, sq):.2f}×**" if sq else "—",
            f"{fl.ops_per_s:,.0f}" if fl else "—",
            f"{_ratio(c.nonstop, fl):.2f}" if fl else "—",
        ]
        lines.append("| " + " | ".join(row) + " |")
    broken = [c for c in cells if c.invariant != "ok"]
    lines.append("")
    if broken:
        lines += [
            f"**Invariant broken** in {c.workload}/{c.clients}/{c.mode}: {c.invariant}"
            for c in broken
        ]
    else:
        lines.append(
            "Every nonstop cell ended with all accounts present and, for transfers, the "
            "total balance unchanged."
        )
    retries = {
        (c.workload, c.clients): c.sqlite.extra.get("busy_retries", 0)
        for c in cells
        if c.sqlite is not None
    }
    lines += [
        "",
        "SQLite busy retries (BEGIN IMMEDIATE refused even after SQLite's busy handler): "
        + ", ".join(f"{w}/{n}: {r:,}" for (w, n), r in retries.items())
        + ".",
        "",
        "## Snapshot read",
        "",
        f"{reads.objects:,} accounts, read in one transaction (median of 3 runs).",
        "",
        "| reader | objects/s | runs |",
        "| --- | ---: | --- |",
        f'| nonstop `tx.query(Account).lock("none").all()` in a snapshot transaction | '
        f"{reads.nonstop_all:,.0f} | {_runs(reads.runs['all'])} |",
        f"| nonstop, the same plus reading `balance` of each object | "
        f"{reads.nonstop_touch:,.0f} | {_runs(reads.runs['touch'])} |",
        f"| SQLite `SELECT id, balance FROM accounts`, fetchall + sum | "
        f"{reads.sqlite:,.0f} | {_runs(reads.runs['sqlite'])} |",
        f"| raw LMDB cursor + msgpack decode + sum (floor) | "
        f"{reads.floor:,.0f} | {_runs(reads.runs['floor'])} |",
        "",
        f"nonstop ÷ SQLite: {reads.nonstop_touch / reads.sqlite:.2f}×.  "
        f"Loading the {reads.objects:,} objects (5,000 per transaction): "
        f"{reads.load_rate:,.0f} objects/s.",
        "",
    ]
    if profiles:
        lines += [
            "## Profiles",
            "",
            "Taken because a goal above is below target (or `--profile always`): the "
            "transfer cases in separate short runs after the measurements, the snapshot "
            "read on the store it was just measured on.  Profiling slows the code down: "
            "read proportions, not rates.",
            "",
        ]
        lines += profiles
    return "\n".join(lines) + "\n"


def _git_state() -> str:
    """The commit the run measured, and whether ``src/`` had uncommitted changes."""
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
        return "unknown (not a git checkout)"
    return f"commit {head}" + (" + uncommitted changes in src/" if dirty else "")


def _la(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


def _runs(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.local_bench [options]``: the same as ``bench.run --only local``."""
    from bench import run as cli

    cli.main(["--only", "local", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
