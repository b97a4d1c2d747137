"""PostgreSQL as a benchmark peer: Debian's server, started on loopback in a temp dir.

:class:`PostgresPeer` runs ``initdb`` and ``postgres`` (``/usr/lib/postgresql/<v>/bin``)
in a fresh temporary directory, listening on 127.0.0.1 on a free port only, with the
durability nonstop has by default: ``fsync=on``, ``synchronous_commit=on``,
``full_page_writes=on``.  PostgreSQL refuses to run as root, so when this process is
root the server runs as the ``postgres`` system user (``runuser``) and the directory
is handed to it.  The server is stopped (immediate shutdown) and the directory removed
by :meth:`PostgresPeer.stop`, which also runs at exit and is safe to call twice.

The transfer is the one nonstop runs, as a single-node transaction::

    BEGIN;
    UPDATE accounts SET balance = balance - 1 WHERE id = <lower id> ...;   -- ordered by id:
    UPDATE accounts SET balance = balance + 1 WHERE id = <higher id> ...;  -- no deadlocks
    INSERT INTO transfers (tid, src, dst, amount) VALUES (...);           -- unique tid
    COMMIT;

driven by ``psycopg`` 3 async connections, one per client task.

:class:`PostgresSyncPeer` is the same server plus a **synchronous streaming standby**
on loopback, as a replicated peer for nonstop's sync replicas: the primary is loaded,
``pg_basebackup -X stream -R`` copies it into a second data directory (the standby's
``standby.signal`` and ``primary_conninfo`` written by ``-R``), the standby starts on
its own port (``hot_standby=on``, the same durability settings), and only then the
primary gets ``synchronous_standby_names = '*'`` (``ALTER SYSTEM`` + reload: set
earlier, the load and the base backup's own WAL stream would wait on it).  The peer
is ready once ``pg_stat_replication`` shows the standby ``streaming`` and ``sync``.
Each client connection picks its commit level (``synchronous_commit``, per session):

* ``on``: COMMIT returns once the standby has *flushed* the WAL (durable on two
  machines; the standby may not have applied it yet, so a read there can be stale);
* ``remote_apply``: once the standby has also *applied* it (a read on the standby
  sees every acknowledged commit).

Both servers are stopped and the directory removed by :meth:`PostgresPeer.stop`.

``python -m bench.pg_peer [--clients 1,16,64] [--duration 4] [--standby]`` measures it
alone.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import glob
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.peers import Result, run_clients

TransferOp = Callable[[random.Random], Awaitable[None]]
Close = Callable[[], Awaitable[None]]

PG_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
SERVER_USER = "postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin_dir() -> Path:
    for d in reversed(PG_BINS):  # newest installed major version
        if os.path.exists(os.path.join(d, "postgres")):
            return Path(d)
    raise RuntimeError(
        "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin "
        "(Debian: apt-get install postgresql)"
    )


SYNC_COMMIT_LEVELS = ("on", "remote_apply")
"""The ``synchronous_commit`` levels a client of :class:`PostgresSyncPeer` may ask for."""
START_TIMEOUT = 30.0
"""Seconds a server may take to accept connections, and the standby to become sync."""


def server_settings(port: int, socket_dir: str | Path) -> dict[str, str]:
    """The settings of every server the benchmark starts: loopback only, durable."""
    return {
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        "unix_socket_directories": str(socket_dir),
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "max_connections": "200",
        "shared_buffers": "128MB",
    }


def primary_settings(port: int, socket_dir: str | Path) -> dict[str, str]:
    """A primary that streams its WAL to a standby (PostgreSQL 15's defaults, stated).

    ``synchronous_standby_names`` is not among them: it is set once the standby
    streams (:data:`SYNC_STANDBY_SQL`), and a command-line setting would override that.
    """
    return {
        **server_settings(port, socket_dir),
        "wal_level": "replica",
        "max_wal_senders": "4",
    }


def standby_settings(port: int, socket_dir: str | Path) -> dict[str, str]:
    """The standby: its own port, the same durability, read-only queries allowed (for
    the checks); ``max_connections`` must be at least the primary's."""
    return {**server_settings(port, socket_dir), "hot_standby": "on"}


SYNC_STANDBY_SQL = "ALTER SYSTEM SET synchronous_standby_names = '*'"
"""Any standby that streams is a synchronous one (there is exactly one)."""


def postgres_command(bin_dir: Path, data: Path, settings: dict[str, str]) -> list[str]:
    """``postgres -D data -c key=value ...``: settings on the command line win over
    every configuration file (``postgresql.conf``, ``postgresql.auto.conf``)."""
    args = [str(bin_dir / "postgres"), "-D", str(data)]
    for key, value in settings.items():
        args += ["-c", f"{key}={value}"]
    return args


def basebackup_command(bin_dir: Path, primary_port: int, target: Path) -> list[str]:
    """Copy the running primary into ``target`` as a standby of it.

    ``-X stream``: the WAL written during the copy comes along; ``-R``: writes
    ``standby.signal`` and the ``primary_conninfo`` pointing back at the primary;
    ``-c fast``: an immediate checkpoint rather than a spread one.
    """
    return [
        str(bin_dir / "pg_basebackup"),
        *("-h", "127.0.0.1", "-p", str(primary_port), "-U", "postgres"),
        *("-D", str(target), "-X", "stream", "-R", "-c", "fast"),
    ]


def session_options(synchronous_commit: str | None) -> str:
    """libpq ``options`` for a connection that commits at ``synchronous_commit``."""
    if synchronous_commit is None:
        return ""
    if synchronous_commit not in SYNC_COMMIT_LEVELS:
        raise ValueError(
            f"synchronous_commit {synchronous_commit!r}: expected one of {SYNC_COMMIT_LEVELS}"
        )
    return f"-c synchronous_commit={synchronous_commit}"


class PostgresPeer:
    """A throw-away PostgreSQL server with an ``accounts`` and a ``transfers`` table."""

    def __init__(self, accounts: int, tmpdir: str | None = None) -> None:
        self.accounts = accounts
        self.bin = _bin_dir()
        self.version = self.bin.parent.name
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="nonstop-pg-", dir=tmpdir))
        self.data = self.dir / "data"
        self._as_root = os.geteuid() == 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        """Every server started, by role (``primary``, ``standby``): stopped by stop()."""
        self._stopped = False
        atexit.register(self.stop)
        try:
            self._start()
            self._load()
            self._after_load()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------ server
    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", SERVER_USER, "--", *args] if self._as_root else list(args)

    def _settings(self) -> dict[str, str]:
        return server_settings(self.port, self.dir)

    def _start(self) -> None:
        if self._as_root:
            # The server user must own its data directory and reach it through /tmp.
            shutil.chown(self.dir, SERVER_USER, SERVER_USER)
            os.chmod(self.dir, 0o700)
        init = subprocess.run(
            self._cmd(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-instructions",
                "-E",
                "UTF8",
                "--locale=C",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if init.returncode != 0:
            # e.g. the server user cannot reach a directory under a private parent
            raise RuntimeError(f"initdb failed in {self.data}:\n{init.stderr.strip()}")
        self._proc = self._spawn("primary", self.data, self._settings(), self.port)

    def _spawn(
        self, role: str, data: Path, settings: dict[str, str], port: int
    ) -> subprocess.Popen[bytes]:
        """Start ``postgres`` on ``data``; return once it answers on ``port`` (bounded)."""
        log = open(self.dir / f"{role}.log", "wb")  # noqa: SIM115 (the server holds it)
        proc = subprocess.Popen(
            self._cmd(*postgres_command(self.bin, data, settings)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._procs[role] = proc
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres ({role}) exited at start:\n{self.server_log(role)}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", port), timeout=0.2),
            ):
                if self._ready(port):
                    return proc
            time.sleep(0.1)
        raise RuntimeError(
            f"postgres ({role}) did not start in {START_TIMEOUT:.0f} s:\n{self.server_log(role)}"
        )

    def _after_load(self) -> None:
        """Hook: what a subclass sets up once the data is loaded."""

    def _ready(self, port: int | None = None) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn_at(port or self.port), connect_timeout=2) as con:
                con.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def server_log(self, role: str = "primary") -> str:
        with contextlib.suppress(OSError):
            return (self.dir / f"{role}.log").read_text(errors="replace")[-4000:]
        return ""

    @staticmethod
    def dsn_at(port: int) -> str:
        return f"host=127.0.0.1 port={port} user=postgres dbname=postgres"

    @property
    def dsn(self) -> str:
        return self.dsn_at(self.port)

    def role_pids(self) -> dict[str, list[int]]:
        """Per server (``primary``, ``standby``): its postmaster and the processes under it."""
        return {role: _process_tree(proc.pid) for role, proc in self._procs.items()}

    def server_pids(self) -> list[int]:
        """The postmasters and their backends, of every server (for CPU accounting)."""
        return [pid for pids in self.role_pids().values() for pid in pids]

    def stop(self) -> None:
        """Immediate shutdown of every server, then the directory is removed.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for proc in reversed(list(self._procs.values())):  # the standby first
            if proc.poll() is None:
                # Immediate shutdown (SIGQUIT to the postmaster's group: runuser included).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 3)
        for proc in self._procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def alive(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    # ------------------------------------------------------------- data
    def _load(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as con:
            con.execute("CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL)")
            con.execute(
                "CREATE TABLE transfers (tid uuid PRIMARY KEY, src integer NOT NULL,"
                " dst integer NOT NULL, amount bigint NOT NULL)"
            )
            con.execute(
                "INSERT INTO accounts SELECT g, 1000 FROM generate_series(0, %s) g",
                (self.accounts - 1,),
            )
            con.execute("VACUUM ANALYZE accounts")

    def total(self, port: int | None = None) -> tuple[int, int]:
        """(sum of balances, transfers recorded), on the primary or the server at ``port``."""
        import psycopg

        with psycopg.connect(self.dsn_at(port or self.port)) as con:
            (bal,) = con.execute("SELECT sum(balance) FROM accounts").fetchone() or (0,)
            (n,) = con.execute("SELECT count(*) FROM transfers").fetchone() or (0,)
        return int(bal), int(n)

    # -------------------------------------------------------- workload
    def make_op(
        self,
        pick: Callable[[random.Random], tuple[int, int]],
        synchronous_commit: str | None = None,
    ) -> Callable[[int], Awaitable[tuple[TransferOp, Close]]]:
        """An async client factory for :func:`bench.peers.run_clients`: one connection each.

        ``pick(rng)`` chooses (source, destination) account ids; ``synchronous_commit``
        (one of :data:`SYNC_COMMIT_LEVELS`) the session's commit level, None: the server's.
        """
        import psycopg

        dsn = self.dsn
        options = session_options(synchronous_commit)

        async def make(_: int) -> tuple[TransferOp, Close]:
            con = await psycopg.AsyncConnection.connect(dsn, options=options)
            if synchronous_commit is not None:  # the level asked for is the one in force
                cur = await con.execute("SHOW synchronous_commit")
                level = await cur.fetchone()
                if level is None or level[0] != synchronous_commit:
                    raise RuntimeError(f"synchronous_commit is {level}, not {synchronous_commit}")
                # SHOW opened a transaction: ended, or each transfer would be a savepoint
                # inside it, never committed.
                await con.rollback()
            # Each transfer must be a transaction of its own (COMMIT waits for the standby).
            assert con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

            async def op(rng: random.Random) -> None:
                src, dst = pick(rng)
                first, second = sorted((src, dst))
                delta = {src: -1, dst: 1}
                async with con.transaction(), con.cursor() as cur:
                    await cur.execute(
                        "UPDATE accounts SET balance = balance + %s WHERE id = %s",
                        (delta[first], first),
                    )
                    await cur.execute(
                        "UPDATE accounts SET balance = balance + %s WHERE id = %s",
                        (delta[second], second),
                    )
                    await cur.execute(
                        "INSERT INTO transfers (tid, src, dst, amount) VALUES (%s, %s, %s, 1)",
                        (uuid.uuid4(), src, dst),
                    )

            async def close() -> None:
                await con.close()

            return op, close

        return make

    async def run(
        self,
        clients: int,
        duration: float,
        warmup: float,
        pick: Callable[[random.Random], tuple[int, int]],
        synchronous_commit: str | None = None,
    ) -> Result:
        """Transfers by ``clients`` concurrent async connections; CPU includes the servers'.

        ``extra``: ``server_cpu_us`` (every server, per transfer) and
        ``server_cpu_us_by_role`` (``primary``, and ``standby`` when there is one).
        """
        roles = self.role_pids()
        cpu0 = {role: proc_cpu(pids) for role, pids in roles.items()}
        make = self.make_op(pick, synchronous_commit)
        res = await run_clients(clients, make, duration, warmup)
        await asyncio.sleep(0.2)  # the postmaster reaps the closed backends
        used = {role: proc_cpu(pids) - cpu0[role] for role, pids in roles.items()}
        done = res.extra.get("done", res.ops)
        per = {role: cpu / done * 1e6 if done else float("nan") for role, cpu in used.items()}
        res.extra["server_cpu_us_by_role"] = per
        res.extra["server_cpu_us"] = sum(per.values())
        return res

    def pgbench(self, clients: int, seconds: float) -> dict[str, float]:
        """PostgreSQL's own load driver on the same transfer (:data:`PGBENCH_TRANSFER`):
        ``clients`` connections for ``seconds``; its committed transactions per second
        (``tps``), its mean latency (``latency_ms``) and the servers' CPU per transfer
        (``server_cpu_us``; pgbench's own CPU, C and prepared statements, is not counted).
        """
        roles = self.role_pids()
        cpu0 = sum(proc_cpu(pids) for pids in roles.values())
        with tempfile.TemporaryDirectory(prefix="pgbench-") as tmp:
            script = Path(tmp) / "transfer.sql"
            script.write_text(PGBENCH_TRANSFER)
            os.chmod(tmp, 0o755)
            os.chmod(script, 0o644)
            command = [
                str(_bin_dir() / "pgbench"),
                *("-n", "-M", "prepared", "-f", str(script)),
                *("-c", str(clients), "-j", str(min(clients, 2))),
                *("-T", str(max(1, round(seconds)))),
                *("-D", f"n={self.accounts}", "-h", "127.0.0.1", "-p", str(self.port)),
                *("-U", "postgres", "postgres"),
            ]
            run = subprocess.run(
                command, capture_output=True, text=True, timeout=seconds + 60, check=False
            )
        if run.returncode != 0:
            raise RuntimeError(f"pgbench failed ({run.returncode}): {run.stderr.strip()[-500:]}")
        tps = re.search(r"^tps = ([0-9.]+)", run.stdout, re.M)
        latency = re.search(r"^latency average = ([0-9.]+) ms", run.stdout, re.M)
        done = re.search(r"^number of transactions actually processed: (\d+)", run.stdout, re.M)
        if tps is None or done is None:
            raise RuntimeError(f"pgbench printed no figures: {run.stdout.strip()[-500:]}")
        used = sum(proc_cpu(pids) for pids in self.role_pids().values()) - cpu0
        n = int(done.group(1))
        return {
            "tps": float(tps.group(1)),
            "latency_ms": float(latency.group(1)) if latency else float("nan"),
            "server_cpu_us": used / n * 1e6 if n else float("nan"),
        }


PGBENCH_TRANSFER = """\\set a random(0, :n - 1)
\\set b random(0, :n - 2)
\\set b (case when :b >= :a then :b + 1 else :b end)
\\set lo least(:a, :b)
\\set hi greatest(:a, :b)
BEGIN;
UPDATE accounts SET balance = balance + (case when :lo = :a then -1 else 1 end) WHERE id = :lo;
UPDATE accounts SET balance = balance + (case when :hi = :a then -1 else 1 end) WHERE id = :hi;
INSERT INTO transfers (tid, src, dst, amount) VALUES (gen_random_uuid(), :a, :b, 1);
END;
"""
"""The benchmark's transfer as a pgbench script: two distinct random accounts, locked in
id order (no deadlocks, like :meth:`PostgresPeer.make_op`), one unit moved, one transfer
row: the same statements as the Python client, sent by C with prepared statements."""


class PostgresSyncPeer(PostgresPeer):
    """:class:`PostgresPeer` plus one synchronous streaming standby on loopback."""

    def __init__(self, accounts: int, tmpdir: str | None = None) -> None:
        self.standby_port = free_port()
        super().__init__(accounts, tmpdir)

    @property
    def standby_data(self) -> Path:
        return self.dir / "standby"

    def _settings(self) -> dict[str, str]:
        return primary_settings(self.port, self.dir)

    def _after_load(self) -> None:
        if not (self.bin / "pg_basebackup").exists():
            raise RuntimeError(
                f"pg_basebackup not found in {self.bin} (Debian: apt-get install postgresql)"
            )
        # Loaded first, then copied: the rows reach the standby in the base backup.
        backup = subprocess.run(
            self._cmd(*basebackup_command(self.bin, self.port, self.standby_data)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if backup.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed:\n{backup.stderr.strip()}")
        self._spawn(
            "standby",
            self.standby_data,
            standby_settings(self.standby_port, self.dir),
            self.standby_port,
        )
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as con:
            con.execute(SYNC_STANDBY_SQL)
            con.execute("SELECT pg_reload_conf()")
        self._wait_sync()

    def replication(self) -> list[tuple[str, str, str]]:
        """``pg_stat_replication`` on the primary: (application_name, state, sync_state)."""
        import psycopg

        with psycopg.connect(self.dsn) as con:
            rows = con.execute(
                "SELECT application_name, state, sync_state FROM pg_stat_replication"
            ).fetchall()
        return [(str(a), str(b), str(c)) for a, b, c in rows]

    def _wait_sync(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        rows: list[tuple[str, str, str]] = []
        while time.monotonic() < deadline:
            rows = self.replication()
            if any(state == "streaming" and sync == "sync" for _, state, sync in rows):
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"the standby is not a streaming sync standby after {START_TIMEOUT:.0f} s "
            f"(pg_stat_replication: {rows}):\n{self.server_log('standby')}"
        )

    def standby_total(self, timeout: float = 10.0) -> tuple[int, int]:
        """(sum of balances, transfers recorded) read on the standby, once it has replayed
        what the primary holds now (bounded: after ``timeout`` the standby's own view)."""
        want = self.total()
        deadline = time.monotonic() + timeout
        seen = self.total(self.standby_port)
        while seen != want and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = self.total(self.standby_port)
        return seen


def _process_tree(root: int) -> list[int]:
    """``root`` and its descendants (``runuser`` forks the postmaster when we are root)."""
    pids = [root]
    frontier = [root]
    while frontier:
        p = frontier.pop()
        with contextlib.suppress(OSError):
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                pids += kids
                frontier += kids
    return pids


def proc_cpu(pids: list[int]) -> float:
    """User+system CPU seconds of the given processes (those alive) and their reaped children."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime, stime, and cutime, cstime: the CPU of exited children the process
            # waited for (the postmaster reaps the backends of closed connections).
            total += sum(int(x) for x in fields[11:15])
    return total / tick


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pg_peer", description=__doc__)
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--accounts", type=int, default=10_000)
    p.add_argument(
        "--standby",
        action="store_true",
        help="with a synchronous standby: each client count at synchronous_commit "
        "on and remote_apply",
    )
    args = p.parse_args(argv)
    n = args.accounts

    def pick(rng: random.Random) -> tuple[int, int]:
        a = rng.randrange(n)
        b = rng.randrange(n - 1)
        return a, (b + 1 if b >= a else b)

    # SIGTERM ends like Ctrl-C: through the finally below, so the server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    peer = PostgresSyncPeer(n) if args.standby else PostgresPeer(n)
    levels: tuple[str | None, ...] = SYNC_COMMIT_LEVELS if args.standby else (None,)
    try:
        print(f"PostgreSQL {peer.version} on 127.0.0.1:{peer.port} in {peer.dir}")
        if isinstance(peer, PostgresSyncPeer):
            print(f"standby on 127.0.0.1:{peer.standby_port}: {peer.replication()}")
        for c in (int(x) for x in args.clients.split(",")):
            for level in levels:
                r = asyncio.run(peer.run(c, args.duration, args.warmup, pick, level))
                by_role = r.extra["server_cpu_us_by_role"]
                print(
                    f"{c:3d} clients{f' {level}' if level else ''}: {r.ops_per_s:8.0f} "
                    f"transfers/s  p50 {r.p50:6.2f} ms  p99 {r.p99:6.2f} ms  client CPU "
                    f"{r.cpu_us:.0f} µs/op  server CPU {r.extra['server_cpu_us']:.0f} µs/op ("
                    + ", ".join(f"{role} {us:.0f}" for role, us in by_role.items())
                    + ")"
                )
        total, transfers = peer.total()
        print(f"total {total} (expected {1000 * n}), {transfers} transfers recorded")
        assert total == 1000 * n
        if isinstance(peer, PostgresSyncPeer):
            print(f"on the standby: {peer.standby_total()}")
    finally:
        peer.stop()


if __name__ == "__main__":
    main()
