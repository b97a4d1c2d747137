"""A local cluster owned by one Python process: started, crashed, restarted, always stopped.

The cluster demo, the distributed benchmark and the end-to-end tests need the
same thing: N real node processes on 127.0.0.1 with an application module
loaded, a way to SIGKILL one and start it again on its data, and the certainty
that nothing is left running whatever happens — an exception, Ctrl-C, SIGTERM
or a normal exit.  :class:`OwnedCluster` is that: every node runs in its own
process group, and :meth:`OwnedCluster.close` (also run at interpreter exit and
on SIGTERM/SIGHUP while the cluster is open) stops them gracefully and then
SIGKILLs whatever is left.

    with OwnedCluster(folder, 3, apps=["nonstop.demos.bank"]) as oc:
        client = nonstop.connect(oc.addresses)
        oc.kill("B"); oc.restart("B")
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from nonstop.admin.local import LocalCluster, LocalNode, spawn_node, spawn_nodes
from nonstop.admin.served import partitions_served
from nonstop.client.handle import Client
from nonstop.errors import Error
from nonstop.node.datadir import pid_alive


def _dead(pid: int) -> bool:
    return not pid_alive(pid)


# Defaults for a cluster on one loaded machine: a dead node is seen Down in about a
# second; the data directories are durable (fsync on).
DEFAULT_OPTIONS: dict[str, Any] = {
    "keepalive_interval": 0.1,
    "nonresponse_timeout": 0.5,
    "sync": True,
}


class NodeProcesses:
    """The node processes of one cluster layout, each in its own process group: started,
    SIGKILLed, asked for their status, stopped.

    :class:`OwnedCluster` (on 127.0.0.1) and the partition harness's cluster (one
    network namespace per node, tests/jepsen/cluster.py) are this with their own layout;
    the harness also starts each node through ``ip netns exec`` (:meth:`command_prefix`).
    """

    status_timeout = 2.0
    """How long :meth:`status` waits for a node's answer."""

    def __init__(
        self, lc: LocalCluster, layout: dict[str, Any], env: Mapping[str, str] | None = None
    ) -> None:
        self.lc = lc
        self.layout = layout
        self.nodes: dict[str, LocalNode] = {node.name: node for node in lc.nodes(layout)}
        self.pids: dict[str, int] = {}
        self._all_pids: set[int] = set()
        self._env = env

    # ------------------------------------------------------------------ nodes
    @property
    def names(self) -> list[str]:
        return list(self.nodes)

    @property
    def addresses(self) -> list[str]:
        return [node.listen for node in self.nodes.values()]

    def address(self, name: str) -> str:
        return self.nodes[name].listen

    def log_path(self, name: str) -> Path:
        return self.nodes[name].data / "node.log"

    def command_prefix(self, name: str) -> list[str]:
        """What node ``name``'s command runs through (nothing: it runs here)."""
        return []

    def start(self, name: str, timeout: float = 30.0) -> int:
        """Start node ``name`` (on its old data if any); returns once it listens."""
        node = self.nodes[name]
        self.lc.write_config(self.layout, node)
        env = None if not self._env else {**os.environ, **self._env}
        pid = spawn_node(
            node.config, node.data, timeout=timeout, prefix=self.command_prefix(name), env=env
        )
        self.pids[name] = pid
        self._all_pids.add(pid)
        return pid

    def start_all(self, timeout: float = 60.0) -> None:
        """Start every node and wait until each reports quorum ``Active`` and every
        partition is served (what ``nonstop local up`` waits for: until then a first
        transaction may meet the retryable ``NotActive`` of a partition moving to its
        preferred node; under routing by node it is at once)."""
        for node in self.nodes.values():  # one by one: each also rewrites the layout file
            self.lc.write_config(self.layout, node)
        env = None if not self._env else {**os.environ, **self._env}
        prefixes = {name: self.command_prefix(name) for name in self.nodes}
        pids = spawn_nodes(list(self.nodes.values()), timeout, prefixes=prefixes, env=env)
        self.pids.update(pids)
        self._all_pids.update(pids.values())
        self.wait_active(timeout=timeout)
        self.wait_served(timeout=timeout)

    def kill(self, name: str) -> None:
        """SIGKILL node ``name`` (a crash: no graceful shutdown) and wait until it is gone."""
        pid = self.pids.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _wait(lambda: not pid_alive(pid), 10, f"{name} to die")

    def status(self, name: str) -> dict[str, Any]:
        with Client([self.address(name)], timeout=self.status_timeout, rounds=1) as c:
            return c.status()

    def active(self, names: list[str] | None = None) -> bool:
        """Whether every node in ``names`` (default: all running) reports quorum Active
        with every member live."""
        for n in names or list(self.pids):
            st = self.status(n)
            if st.get("quorum") != "Active" or sorted(st.get("live", [])) != sorted(
                st.get("members", [])
            ):
                return False
        return True

    def wait_active(self, names: list[str] | None = None, timeout: float = 60.0) -> float:
        """Until :meth:`active`; returns the seconds it took."""
        started = time.monotonic()
        _wait(lambda: self.active(names), timeout, "quorum Active on every node")
        return time.monotonic() - started

    def wait_served(self, timeout: float = 60.0) -> float:
        """Until every partition is served by a running node
        (:func:`~nonstop.admin.served.partitions_served`); returns the seconds it took."""
        started = time.monotonic()

        def served() -> bool:
            try:
                statuses = {n: self.status(n) for n in self.alive()}
            except Exception:
                return False
            return partitions_served(statuses)

        _wait(served, timeout, "every partition served")
        return time.monotonic() - started

    def alive(self) -> list[str]:
        return [n for n, pid in self.pids.items() if pid_alive(pid)]

    # --------------------------------------------------------------- stopping
    def stop(self, timeout: float = 15.0) -> None:
        """Graceful stop of every node (SIGTERM), SIGKILL after ``timeout``."""
        for pid in list(self.pids.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for pid in list(self.pids.values()):
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.pids.clear()
        self._kill_all()

    def _kill_all(self) -> None:
        for pid in self._all_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)
                os.killpg(pid, signal.SIGKILL)


class OwnedCluster(NodeProcesses):
    """``n`` node processes in ``folder`` (names A, B, C…), owned by this process."""

    def __init__(
        self,
        folder: str | Path,
        n: int = 3,
        *,
        apps: list[str] | None = None,
        options: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        opts = {**DEFAULT_OPTIONS, **(options or {})}
        if apps:
            opts["app"] = list(apps)
        lc = LocalCluster(folder)
        super().__init__(lc, lc.create(n, None, opts), env)
        self._closed = False
        self._old_handlers: dict[int, Any] = {}
        atexit.register(self.close)
        self._install_signal_handlers()

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Start a killed node again on its data; returns once the cluster is Active."""
        self.start(name)
        self.wait_active(timeout=timeout)

    def close(self) -> None:
        """Stop everything this object started.  Idempotent; also runs at exit."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop()
        finally:
            self._kill_all()
            self._restore_signal_handlers()
            with contextlib.suppress(Exception):
                atexit.unregister(self.close)

    def __enter__(self) -> OwnedCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        # SIGTERM/SIGHUP would end the interpreter without atexit: turn them into
        # SystemExit so that finally blocks and close() run.  Only the main thread
        # may set handlers; elsewhere atexit and the caller's finally must do.
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                self._old_handlers[sig] = signal.signal(sig, _exit_on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(sig, old)
        self._old_handlers.clear()


def kill_leftovers(folder: str | Path) -> list[int]:
    """SIGKILL every node still running on a data directory under ``folder``.

    For a folder about to be reused: an earlier owner that was itself SIGKILLed
    could not stop its nodes.  Returns the pids killed.
    """
    from nonstop.node.datadir import DataDir

    killed = []
    for pid_file in Path(folder).glob("**/node.pid"):
        pid = DataDir(pid_file.parent).running_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
    for pid in killed:
        _wait(functools.partial(_dead, pid), 10, f"leftover node {pid} to die")
    return killed


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    sys.exit(128 + signum)


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (Error, OSError) as exc:
            last_error, value = exc, None
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last_error})")
