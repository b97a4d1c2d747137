"""Measurement helpers and the peers nonstop is compared with.

Helpers: :func:`run_threads` and :func:`run_tasks` drive N concurrent clients
(threads or asyncio tasks) for a fixed time and return a :class:`Result`
(throughput, p50 and p99 latency of the operations finished in the measured
window, after a warm-up).

Peers, all durable (each commit is on disk when it returns):

* :class:`SqlitePeer` — stdlib ``sqlite3``, ``journal_mode=WAL``,
  ``synchronous=FULL``, one connection per client thread, writes in
  ``BEGIN IMMEDIATE`` transactions; a busy database is retried by SQLite's own
  busy handler (``timeout=60``), then by a randomized back-off loop.
  SQLite has no asyncio API, so it only runs with threads.
* :class:`LmdbFloor` — raw LMDB (``sync=True``), one writer applying ``batch``
  read-modify-writes per write transaction: what perfect group commit could
  reach on this disk with this engine, with no transaction layer at all.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgpack

# One client operation: takes the client's random generator, does one transaction.
SyncOp = Callable[[random.Random], Any]
AsyncOp = Callable[[random.Random], Awaitable[Any]]

WORKLOADS = ("rmw", "transfer")

# Called as hook(native thread id, (CPU seconds, seconds runnable but waiting for a CPU))
# when a client thread ends, so that a profiler can account for it (it is gone after).
on_thread_exit: list[Callable[[int, tuple[float, float]], None]] = []


def thread_sched(tid: int | None = None) -> tuple[float, float]:
    """(CPU seconds, seconds spent runnable waiting for a CPU) of a thread (Linux).

    ``tid`` None: the calling thread.  Falls back to ``time.thread_time()`` and nan.
    """
    path = "/proc/thread-self/schedstat" if tid is None else f"/proc/self/task/{tid}/schedstat"
    try:
        with open(path) as f:
            run_ns, wait_ns, _ = f.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        if tid is None:
            return time.thread_time(), float("nan")
        raise


# --------------------------------------------------------------- measuring
@dataclass(slots=True)
class Result:
    """What one measured cell produced."""

    ops: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # seconds, one per op
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        """Latency percentile in milliseconds (q in 0..100); nan when nothing was measured."""
        if not self.latencies:
            return float("nan")
        data = sorted(self.latencies)
        idx = min(len(data) - 1, max(0, round(q / 100 * (len(data) - 1))))
        return data[idx] * 1000.0

    @property
    def cpu_us(self) -> float:
        """Process CPU time (all threads) per operation, in µs: robust to a busy machine."""
        return float(self.extra.get("cpu_us", float("nan")))

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p99(self) -> float:
        return self.percentile(99)


def pick(rng: random.Random, n: int, workload: str) -> tuple[int, ...]:
    """Uniform random account numbers: one for ``rmw``, two distinct ones for ``transfer``."""
    a = rng.randrange(n)
    if workload == "rmw":
        return (a,)
    b = rng.randrange(n - 1)
    return (a, b + 1 if b >= a else b)


def run_threads(
    clients: int,
    make_op: Callable[[int], tuple[SyncOp, Callable[[], None]]],
    duration: float,
    warmup: float,
    seed: int = 1,
) -> Result:
    """Run ``clients`` threads; ``make_op(i)`` (called in thread i) returns (op, cleanup)."""
    barrier = threading.Barrier(clients + 1)
    window: list[float] = [0.0, 0.0]
    per_thread: list[list[float]] = [[] for _ in range(clients)]
    done = [0] * clients
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        try:
            op, cleanup = make_op(i)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
            return
        lat = per_thread[i]
        count = 0
        try:
            barrier.wait()
            start, end = window
            clock = time.perf_counter
            while True:
                t0 = clock()
                if t0 >= end:
                    break
                op(rng)
                count += 1
                t1 = clock()
                if t0 >= start and t1 < end:
                    lat.append(t1 - t0)
            done[i] = count
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            cleanup()
            if on_thread_exit:
                sched = thread_sched()
                for hook in on_thread_exit:
                    hook(threading.get_native_id(), sched)

    threads = [
        threading.Thread(target=worker, args=(i,), name=f"bench-client-{i}") for i in range(clients)
    ]
    for t in threads:
        t.start()
    now = time.perf_counter()
    window[0] = now + warmup
    window[1] = now + warmup + duration
    cpu0 = time.process_time()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0
    if errors:
        raise errors[0]
    lats = [x for lat in per_thread for x in lat]
    return Result(len(lats), duration, lats, {"cpu_us": _per_op(cpu, sum(done))})


def _per_op(cpu: float, ops: int) -> float:
    return cpu / ops * 1e6 if ops else float("nan")


async def run_tasks(
    clients: int, op: AsyncOp, duration: float, warmup: float, seed: int = 1
) -> Result:
    """Run ``clients`` asyncio tasks on the running loop, each calling ``op`` in a loop."""
    now = time.perf_counter()
    start, end = now + warmup, now + warmup + duration
    lats: list[float] = []
    done = [0]

    async def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        clock = time.perf_counter
        while True:
            t0 = clock()
            if t0 >= end:
                break
            await op(rng)
            done[0] += 1
            t1 = clock()
            if t0 >= start and t1 < end:
                lats.append(t1 - t0)

    cpu0 = time.process_time()
    await asyncio.gather(*(worker(i) for i in range(clients)))
    cpu = time.process_time() - cpu0
    return Result(len(lats), duration, lats, {"cpu_us": _per_op(cpu, done[0])})


AsyncClientFactory = Callable[[int], Awaitable[tuple[AsyncOp, Callable[[], Awaitable[Any]]]]]


async def run_clients(
    clients: int, make: AsyncClientFactory, duration: float, warmup: float, seed: int = 1
) -> Result:
    """Like :func:`run_tasks`, but each task has its own client: ``await make(i)`` returns
    (op, async close) — e.g. one database connection per client task.

    ``extra``: ``cpu_us`` (this process, per op), ``done`` (ops finished, warm-up
    included), ``window`` (the measured interval, ``time.perf_counter`` start and end).
    """
    pairs = await asyncio.gather(*(make(i) for i in range(clients)))
    now = time.perf_counter()
    start, end = now + warmup, now + warmup + duration
    lats: list[float] = []
    done = [0]

    async def worker(i: int) -> None:
        op = pairs[i][0]
        rng = random.Random(seed * 1000 + i)
        clock = time.perf_counter
        while True:
            t0 = clock()
            if t0 >= end:
                break
            await op(rng)
            done[0] += 1
            t1 = clock()
            if t0 >= start and t1 < end:
                lats.append(t1 - t0)

    cpu0 = time.process_time()
    try:
        await asyncio.gather(*(worker(i) for i in range(clients)))
    finally:
        cpu = time.process_time() - cpu0
        await asyncio.gather(*(close() for _, close in pairs), return_exceptions=True)
    extra = {"cpu_us": _per_op(cpu, done[0]), "done": done[0], "window": (start, end)}
    return Result(len(lats), duration, lats, extra)


def fsync_cost(directory: str, rounds: int = 50) -> tuple[float, float]:
    """p50 and p99 (ms) of write(4 KiB) + fsync on ``directory``'s disk."""
    path = os.path.join(directory, "fsync.probe")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    times: list[float] = []
    try:
        block = os.urandom(4096)
        for i in range(rounds):
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % 16) * 4096)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return statistics.median(times) * 1000, times[int(0.99 * (len(times) - 1))] * 1000


# ------------------------------------------------------------------ SQLite
class SqlitePeer:
    """SQLite, WAL, ``synchronous=FULL``: the same durability as nonstop's default."""

    def __init__(self, directory: str, accounts: int) -> None:
        self.path = os.path.join(directory, "bench.sqlite")
        self.accounts = accounts
        con = self.connect()
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
        con.execute("BEGIN")
        con.executemany(
            "INSERT INTO accounts (id, balance) VALUES (?, ?)",
            ((i, 1000) for i in range(accounts)),
        )
        con.execute("COMMIT")
        con.close()
        self.busy_retries = 0
        self._retry_lock = threading.Lock()

    def connect(self) -> sqlite3.Connection:
        # SQLite's own busy handler (timeout) retries a refused BEGIN IMMEDIATE without
        # holding the GIL; it beat a Python-level retry loop by far at 8 and 64 threads.
        con = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        con.execute("PRAGMA synchronous=FULL")  # journal_mode=WAL is persistent: set once
        return con

    def _begin(self, con: sqlite3.Connection, rng: random.Random) -> None:
        delay = 0.0001
        while True:
            try:
                con.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                with self._retry_lock:
                    self.busy_retries += 1
                time.sleep(rng.uniform(0, delay))
                delay = min(delay * 2, 0.01)

    def make_op(self, workload: str) -> Callable[[int], tuple[SyncOp, Callable[[], None]]]:
        n = self.accounts

        def make(_: int) -> tuple[SyncOp, Callable[[], None]]:
            con = self.connect()
            select = "SELECT balance FROM accounts WHERE id = ?"
            update = "UPDATE accounts SET balance = ? WHERE id = ?"

            def op(rng: random.Random) -> None:
                ids = pick(rng, n, workload)
                self._begin(con, rng)
                try:
                    if len(ids) == 1:
                        (bal,) = con.execute(select, ids).fetchone()
                        con.execute(update, (bal + 1, ids[0]))
                    else:
                        a, b = ids
                        (ba,) = con.execute(select, (a,)).fetchone()
                        (bb,) = con.execute(select, (b,)).fetchone()
                        con.execute(update, (ba - 1, a))
                        con.execute(update, (bb + 1, b))
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise

            return op, con.close

        return make

    def total(self) -> int:
        con = self.connect()
        try:
            return int(con.execute("SELECT SUM(balance) FROM accounts").fetchone()[0])
        finally:
            con.close()

    def scan(self) -> tuple[int, int]:
        """Read every row in one transaction; returns (rows, sum of balances)."""
        con = self.connect()
        try:
            con.execute("BEGIN")
            rows = con.execute("SELECT id, balance FROM accounts").fetchall()
            con.execute("COMMIT")
            return len(rows), sum(r[1] for r in rows)
        finally:
            con.close()


# -------------------------------------------------------------------- LMDB
class LmdbFloor:
    """Raw LMDB with ``sync=True``: one writer, ``batch`` read-modify-writes per commit."""

    _KEY = ">Q"

    def __init__(self, directory: str, accounts: int, *, metasync: bool = True) -> None:
        """``metasync=False`` (not durable for the last commit) shows what the second
        sync of each LMDB commit, the meta page's, costs."""
        self.accounts = accounts
        self.env = lmdb.open(
            os.path.join(directory, "lmdb-floor"),
            map_size=1 << 34,
            sync=True,
            metasync=metasync,
            readahead=False,
        )
        with self.env.begin(write=True) as txn:
            for i in range(accounts):
                txn.put(self._k(i), msgpack.packb({"number": i, "balance": 1000}))

    @staticmethod
    def _k(i: int) -> bytes:
        return i.to_bytes(8, "big")

    def run(self, workload: str, batch: int, duration: float, warmup: float) -> Result:
        """Each write transaction applies ``batch`` operations; latency is one batch's time."""
        rng = random.Random(7)
        n = self.accounts
        k = self._k
        clock = time.perf_counter
        now = clock()
        start, end = now + warmup, now + warmup + duration
        ops = total = 0
        lats: list[float] = []
        cpu0 = time.process_time()
        while True:
            t0 = clock()
            if t0 >= end:
                break
            with self.env.begin(write=True) as txn:
                for _ in range(batch):
                    ids = pick(rng, n, workload)
                    for j, i in enumerate(ids):
                        rec = msgpack.unpackb(txn.get(k(i)))
                        rec["balance"] += 1 if j == len(ids) - 1 else -1
                        txn.put(k(i), msgpack.packb(rec))
            t1 = clock()
            total += batch
            if t0 >= start and t1 < end:
                ops += batch
                lats.append(t1 - t0)
        cpu = time.process_time() - cpu0
        return Result(ops, duration, lats, {"cpu_us": _per_op(cpu, total)})

    def scan(self) -> tuple[int, int]:
        """Cursor over every record, msgpack-decoded; returns (records, sum of balances)."""
        total = count = 0
        with self.env.begin() as txn:
            for _, raw in txn.cursor():
                total += msgpack.unpackb(raw)["balance"]
                count += 1
        return count, total

    def close(self) -> None:
        self.env.close()
