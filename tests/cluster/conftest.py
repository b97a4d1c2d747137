"""Real node processes on 127.0.0.1 for the cluster tests.

Every node runs in its own session (process group); the fixture's finalizer
SIGKILLs every group it started, whatever the test's outcome, so no process
outlives a test run.  Ports are picked free by the kernel.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nonstop.admin.local import LocalCluster, spawn_node, spawn_nodes
from nonstop.admin.served import partitions_served
from nonstop.client import Client
from nonstop.errors import Error
from nonstop.node.datadir import DataDir, pid_alive
from nonstop.node.log_events import read_events

KEEPALIVE = 0.1
NONRESPONSE = 0.5
DETECT_WITHIN = 4 * NONRESPONSE + 1.0
"""Down must be seen this soon after a kill: timeout + one reconnect + scheduling slack
on a loaded 2-core machine."""


# The machine the node processes run: the real cluster node (failure detector,
# Raft cluster log, quorum).  NONSTOP_TEST_MACHINE may name another factory to
# debug the transport alone; the default suite always tests the real one.
MACHINE = os.environ.get("NONSTOP_TEST_MACHINE", "nonstop.node.machine:build_cluster_node")
REAL_CLUSTER = MACHINE.endswith("build_cluster_node")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout: float, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Error:
            last = None
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Procs:
    """A local cluster under test: start, kill, stop, pause, ask."""

    def __init__(self, folder: Path, n: int, options: dict[str, Any] | None = None) -> None:
        opts = {
            "keepalive_interval": KEEPALIVE,
            "nonresponse_timeout": NONRESPONSE,
            "machine": MACHINE,
            "sync": True,
            **(options or {}),
        }
        self.lc = LocalCluster(folder)
        self.layout = self.lc.create(n, None, opts)
        self.nodes = {node.name: node for node in self.lc.nodes(self.layout)}
        self.pids: dict[str, int] = {}
        self.all_pids: set[int] = set()

    def start(self, name: str) -> int:
        node = self.nodes[name]
        self.lc.write_config(self.layout, node)
        pid = spawn_node(node.config, node.data)
        self.pids[name] = pid
        self.all_pids.add(pid)
        return pid

    def start_all(self) -> None:
        """Every node at once (``spawn_nodes``, as ``nonstop local up`` does): each start
        waits about a second for its process to import nonstop and write its pid file.
        (The configurations first, one by one: writing one also rewrites the layout file.)"""
        for node in self.nodes.values():
            self.lc.write_config(self.layout, node)
        pids = spawn_nodes(list(self.nodes.values()))
        self.pids.update(pids)
        self.all_pids.update(pids.values())

    def start_extra(
        self, name: str, join: list[str], protocol: tuple[int, int] = (1, 1)
    ) -> tuple[int, str]:
        """Start a node outside the layout (no bootstrap members): it joins via ``join``."""
        port = free_port()
        data = self.lc.dir / name
        config = self.lc.dir / f"{name}.toml"
        config.write_text(
            f'name = "{name}"\ncluster = "{self.layout["cluster"]}"\ndata = "{data}"\n'
            f'listen = "127.0.0.1:{port}"\njoin = {json.dumps(join)}\n'
            f'log_file = "{data / "node.log"}"\nmachine = "{MACHINE}"\n'
            f"keepalive_interval = {KEEPALIVE}\nnonresponse_timeout = {NONRESPONSE}\n"
            f"protocol = [{protocol[0]}, {protocol[1]}]\n"
            f'[auth]\nsecret_file = "{self.lc.secret_path}"\n'
            f'admin_file = "{self.lc.credentials_path}"\n'
        )
        pid = spawn_node(config, data)
        self.pids[name] = pid
        self.all_pids.add(pid)
        return pid, f"127.0.0.1:{port}"

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.pids[name], sig)

    def kill(self, name: str) -> None:
        pid = self.pids.pop(name)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 5, f"{name} to die")

    def address(self, name: str) -> str:
        return self.nodes[name].listen

    def status(self, name: str) -> dict[str, Any]:
        with Client([self.address(name)], timeout=1.0, rounds=1) as c:
            return c.status()

    def states(self, name: str) -> dict[str, str]:
        return {n["name"]: n["state"] for n in self.status(name)["nodes"]}

    def wait_quorum(self, names: list[str], quorum: str, timeout: float = 15) -> None:
        wait_until(
            lambda: all(self.status(n)["quorum"] == quorum for n in names),
            timeout,
            f"quorum {quorum} on {names}",
        )

    def wait_served(self, names: list[str] | None = None, timeout: float = 60) -> None:
        """Until every partition is settled on its active node (what ``nonstop local up``
        waits for, admin/served.py): quorum Active alone still leaves a moment of the
        retryable ``NotActive`` while the nodes take their partitions by priority, which a
        plain ``with c.transaction()`` does not replay.  Under node routing: at once."""
        wait_until(
            lambda: partitions_served({n: self.status(n) for n in names or list(self.pids)}),
            timeout,
            "every partition served",
        )

    def active_nodes(self, asked: str) -> dict[str, str]:
        """Partition name -> its active node, in ``asked``'s partition table."""
        return {
            str(p["name"]): str(p.get("active")) for p in self.status(asked).get("partitions") or []
        }

    def keys_active_on(
        self, node: str, type_name: str, field: str, candidates: list[Any], count: int
    ) -> list[Any]:
        """The first ``count`` of ``candidates`` (values of ``type_name``'s unique key
        ``field``) whose partition's active node is ``node`` now: how a test places objects
        on a node under routing by partition (``bulk.route`` maps them as a create does)."""
        from nonstop.model.codec import pack

        with Client([self.address(node)], timeout=10, rounds=1) as c:
            routed = c.call(
                {
                    "op": "bulk.route",
                    "type": type_name,
                    "key": field,
                    "rows": pack({field: candidates}),
                    "format": "columns",
                }
            )
        active = self.active_nodes(node)
        names = [routed["partitions"][i] for i in routed["of"]]
        chosen = [v for v, name in zip(candidates, names, strict=True) if active[name] == node]
        assert len(chosen) >= count, f"{len(chosen)} of {len(candidates)} keys map to {node}"
        return chosen[:count]

    def notifications(self, name: str, kind: str) -> list[dict[str, Any]]:
        """The ``Notify`` records of ``kind`` in a node's log, in order."""
        out = []
        log_path = self.nodes[name].data / "node.log"
        with contextlib.suppress(OSError):
            # JSON lines or text lines: the notification is the message either way.
            for event in read_events(log_path.read_text().splitlines(), name):
                if event.logger == "nonstop.notify":
                    rec = json.loads(event.message)
                    if rec.get("kind") == kind:
                        out.append(rec)
        return out

    def cleanup(self) -> None:
        for pid in self.all_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)
        for node in self.nodes.values():
            with contextlib.suppress(OSError):
                (node.data / "node.pid").unlink()


@contextlib.contextmanager
def app_cluster(folder: Path, n: int, options: dict[str, Any]) -> Iterator[Procs]:
    """``n`` nodes that import the repository's test modules (``app``), Active, then gone."""
    root = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, old]))
    procs = Procs(folder, n, options)
    try:
        procs.start_all()
        procs.wait_quorum(list(procs.nodes), "Active", 30)
        procs.wait_served(list(procs.nodes))
        yield procs
    finally:
        procs.cleanup()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[..., Procs]]:
    made: list[Procs] = []

    def make(n: int = 3, **options: Any) -> Procs:
        p = Procs(tmp_path / f"c{len(made)}", n, options)
        made.append(p)
        return p

    try:
        yield make
    finally:
        for p in made:
            p.cleanup()


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    """The folder of a local cluster made by the CLI; its nodes are killed afterwards."""
    d = tmp_path / "local"
    try:
        yield d
    finally:
        kill_dir_nodes(d)


def run_cli(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """Run ``nonstop ARGS`` in a subprocess; (exit code, stdout, stderr)."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "nonstop.admin.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


def run_cli_here(*args: str) -> tuple[int, str, str]:
    """``nonstop ARGS`` in this process: the CLI's own code path (its commands print and
    exit the same; each reports its errors itself, ``fail``), without the Python start-up
    of about a second a process costs.  For the tests of what a command does; the CLI as
    a process of its own (``run_cli``) is tests/cluster/test_cli.py's business.  The
    environment is put back afterwards: ``--credentials FILE`` sets the process's
    ``$NONSTOP_CREDENTIALS``, as it should for the command's one process."""
    from click.testing import CliRunner

    from nonstop.admin.cli import cli

    saved = dict(os.environ)
    try:
        result = CliRunner().invoke(cli, list(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return result.exit_code, result.stdout, result.stderr


def kill_dir_nodes(folder: Path) -> None:
    """SIGKILL every node whose pid file lies under ``folder`` (test cleanup)."""
    for pid_file in folder.glob("**/node.pid"):
        pid = DataDir(pid_file.parent).running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)
