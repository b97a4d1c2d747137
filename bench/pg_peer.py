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

``python -m bench.pg_peer [--clients 1,16,64] [--duration 4]`` measures it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import glob
import os
import random
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
        self._stopped = False
        atexit.register(self.stop)
        try:
            self._start()
            self._load()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------ server
    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", SERVER_USER, "--", *args] if self._as_root else list(args)

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
        )
        if init.returncode != 0:
            # e.g. the server user cannot reach a directory under a private parent
            raise RuntimeError(f"initdb failed in {self.data}:\n{init.stderr.strip()}")
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "max_connections": "200",
            "shared_buffers": "128MB",
        }
        args = [str(self.bin / "postgres"), "-D", str(self.data)]
        for k, v in settings.items():
            args += ["-c", f"{k}={v}"]
        log = open(self.dir / "server.log", "wb")  # noqa: SIM115 (the server holds it)
        self._proc = subprocess.Popen(
            self._cmd(*args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start:\n{self.server_log()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                if self._ready():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not start in 30 s:\n{self.server_log()}")

    def _ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.dsn, connect_timeout=2) as con:
                con.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "server.log").read_text(errors="replace")[-4000:]
        return ""

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def server_pids(self) -> list[int]:
        """The postmaster and its backends (for CPU accounting)."""
        if self._proc is None:
            return []
        root = self._proc.pid
        pids = [root]
        # runuser forks the postmaster as its child when we are root.
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

    def stop(self) -> None:
        """Immediate shutdown, then the directory is removed.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            # Immediate shutdown (SIGQUIT to the postmaster's group: runuser included).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 3)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

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

    def total(self) -> tuple[int, int]:
        """(sum of balances, transfers recorded)."""
        import psycopg

        with psycopg.connect(self.dsn) as con:
            (bal,) = con.execute("SELECT sum(balance) FROM accounts").fetchone() or (0,)
            (n,) = con.execute("SELECT count(*) FROM transfers").fetchone() or (0,)
        return int(bal), int(n)

    # -------------------------------------------------------- workload
    def make_op(
        self, pick: Callable[[random.Random], tuple[int, int]]
    ) -> Callable[[int], Awaitable[tuple[Callable[[random.Random], Awaitable[None]], Callable]]]:
        """An async client factory for :func:`bench.peers.run_clients`: one connection each.

        ``pick(rng)`` chooses (source, destination) account ids.
        """
        import psycopg

        dsn = self.dsn

        async def make(_: int) -> tuple[Callable[[random.Random], Awaitable[None]], Callable]:
            con = await psycopg.AsyncConnection.connect(dsn)

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
    ) -> Result:
        """Transfers by ``clients`` concurrent async connections; CPU includes the server's."""
        pids = self.server_pids()
        cpu0 = proc_cpu(pids)
        res = await run_clients(clients, self.make_op(pick), duration, warmup)
        await asyncio.sleep(0.2)  # the postmaster reaps the closed backends
        server_cpu = proc_cpu(pids) - cpu0
        done = res.extra.get("done", res.ops)
        res.extra["server_cpu_us"] = server_cpu / done * 1e6 if done else float("nan")
        return res


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
    args = p.parse_args(argv)
    n = args.accounts

    def pick(rng: random.Random) -> tuple[int, int]:
        a = rng.randrange(n)
        b = rng.randrange(n - 1)
        return a, (b + 1 if b >= a else b)

    # SIGTERM ends like Ctrl-C: through the finally below, so the server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    peer = PostgresPeer(n)
    try:
        print(f"PostgreSQL {peer.version} on 127.0.0.1:{peer.port} in {peer.dir}")
        for c in (int(x) for x in args.clients.split(",")):
            r = asyncio.run(peer.run(c, args.duration, args.warmup, pick))
            print(
                f"{c:3d} clients: {r.ops_per_s:8.0f} transfers/s  p50 {r.p50:6.2f} ms"
                f"  p99 {r.p99:6.2f} ms  client CPU {r.cpu_us:.0f} µs/op"
                f"  server CPU {r.extra['server_cpu_us']:.0f} µs/op"
            )
        total, transfers = peer.total()
        print(f"total {total} (expected {1000 * n}), {transfers} transfers recorded")
        assert total == 1000 * n
    finally:
        peer.stop()


if __name__ == "__main__":
    main()
