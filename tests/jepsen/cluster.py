"""Node processes inside the namespaces of a :class:`~tests.jepsen.netns.Network`.

Each node listens on its namespace's address (``10.77.X.<i>:7100``; the port
can be the same everywhere, every node has its own network) and knows the
others by those addresses, so every byte between two nodes crosses the bridge
and the faults.  The configuration is written the way ``nonstop local`` writes
it (:class:`~nonstop.admin.local.LocalCluster`), only with these addresses.

Nodes run ``ip netns exec <ns> python -m nonstop.admin.cli node start``
(``ip netns exec`` execs, so the pid is the node's) in their own session;
:meth:`NetnsCluster.close` SIGKILLs every group it started, whatever happened.
The children get ``PYTHONPATH`` with the repository root, so they can import
the harness's application module (:mod:`tests.jepsen.app`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nonstop.admin.local import LocalCluster, LocalNode
from nonstop.client import Client
from nonstop.errors import Error
from nonstop.node.config import check_options
from nonstop.node.datadir import DataDir, pid_alive
from tests.jepsen.netns import Network

PORT = 7100
APP = "tests.jepsen.app"
ROOT = Path(__file__).resolve().parents[2]

OPTIONS: dict[str, Any] = {
    # A node silent this long is Down (as the end-to-end tests run them).
    "keepalive_interval": 0.1,
    "nonresponse_timeout": 0.5,
    "sync": True,
    "app": [APP],
}


class NetnsCluster:
    """The nodes of ``net``, one per namespace (names = the network's node names)."""

    def __init__(self, folder: Path, net: Network, options: dict[str, Any] | None = None) -> None:
        self.net = net
        self.lc = LocalCluster(folder)
        self.lc.dir.mkdir(parents=True, exist_ok=True)
        self.layout: dict[str, Any] = {
            "cluster": "jepsen-" + secrets.token_hex(4),
            "members": list(net.names),
            "nodes": [{"name": n, "listen": f"{net.address(n)}:{PORT}"} for n in net.names],
            "options": check_options({**OPTIONS, **(options or {})}),
        }
        self.lc.save(self.layout)
        # Nodes require the cluster secret, clients a user (auth): the folder's files,
        # and this process's clients prove its admin credential.
        self.lc.ensure_auth_files()
        self.lc.remember(self.layout)
        self.nodes: dict[str, LocalNode] = {n.name: n for n in self.lc.nodes(self.layout)}
        self.pids: dict[str, int] = {}
        self._all: set[int] = set()

    @property
    def names(self) -> list[str]:
        return list(self.nodes)

    @property
    def addresses(self) -> list[str]:
        return [n.listen for n in self.nodes.values()]

    def address(self, name: str) -> str:
        return self.nodes[name].listen

    # ------------------------------------------------------------ processes
    def start(self, name: str, timeout: float = 30.0) -> int:
        node = self.nodes[name]
        self.lc.write_config(self.layout, node)
        node.data.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
        err_path = node.data / "start.err"
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [
                    *self.net.exec_prefix(name),
                    sys.executable,
                    "-m",
                    "nonstop.admin.cli",
                    "node",
                    "start",
                    "--config",
                    str(node.config),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                env=env,
            )
        self._all.add(proc.pid)
        datadir = DataDir(node.data)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:
                lines = [ln for ln in err_path.read_text().splitlines() if ln.strip()]
                raise RuntimeError(f"node {name} exited: {lines[-1] if lines else code}")
            if datadir.running_pid() == proc.pid:
                self.pids[name] = proc.pid
                return proc.pid
            time.sleep(0.05)
        raise RuntimeError(f"node {name} did not start within {timeout:.0f}s")

    def start_all(self, timeout: float = 60.0) -> None:
        for name in self.nodes:
            self.start(name)
        self.wait_active(timeout=timeout)

    def kill(self, name: str) -> None:
        pid = self.pids.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, f"{name} to die")

    def close(self) -> None:
        """SIGTERM every node, SIGKILL what is left after a few seconds."""
        for pid in list(self.pids.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for pid in list(self.pids.values()):
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.pids.clear()
        for pid in self._all:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)

    def __enter__(self) -> NetnsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ asking
    def status(self, name: str, timeout: float = 1.0) -> dict[str, Any]:
        """Node ``name``'s ``status`` (asked from the host: clients are never cut
        unless a fault says so)."""
        with Client([self.address(name)], timeout=timeout, rounds=1) as c:
            return c.status()

    def leader(self) -> str | None:
        """The cluster-log leader the most nodes agree on right now."""
        votes: dict[str, int] = {}
        for name in self.pids:
            with contextlib.suppress(Error, OSError):
                lead = self.status(name).get("leader")
                if lead:
                    votes[lead] = votes.get(lead, 0) + 1
        return max(votes, key=lambda k: votes[k]) if votes else None

    def active(self) -> bool:
        for name in self.pids:
            st = self.status(name)
            if st.get("quorum") != "Active" or sorted(st.get("live", [])) != sorted(
                st.get("members", [])
            ):
                return False
        return True

    def wait_active(self, timeout: float = 60.0) -> float:
        """Until every running node reports quorum Active with every member live;
        returns the seconds it took."""
        start = time.monotonic()
        wait_for(self.active, timeout, "quorum Active on every node")
        return time.monotonic() - start

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.nodes[name].data / "node.log"
        with contextlib.suppress(OSError):
            return "\n".join(path.read_text().splitlines()[-lines:])
        return ""


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (Error, OSError) as exc:
            last, value = exc, None
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
