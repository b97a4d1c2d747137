"""Local clusters: N node processes on 127.0.0.1 with their data under one folder.

``DIR/local.json`` remembers the layout (cluster id, node names, ports) so that
``local up`` on a stopped or partly running cluster starts exactly the missing
nodes again on their old data and ports.  Each node gets ``DIR/<name>/`` as its
data directory (its log in ``DIR/<name>/node.log``, JSON lines that ``nonstop
logs`` merges), ``DIR/<name>.toml`` as its configuration, which an operator can
read to see how a node is started, and a port of its own for its Prometheus
metrics (``metrics.listen``, on 127.0.0.1), and its admin API and console
(``admin.listen``, on 127.0.0.1).

Authentication: the folder holds the cluster secret (``DIR/cluster.secret``) and
the bootstrap admin's credentials (``DIR/credentials.json``), both mode 0600 and
named in every node's config; the CLI (``--dir``) and ``nonstop.connect()`` in
the folder use the credentials file, so nobody has to type a password.  The
admin credential is generated, unless ``$NONSTOP_CREDENTIALS`` names one: then
that user and password become the new cluster's admin (one credential for
every local cluster an operator -- or a test run -- creates).

The layout keeps every node of the folder, also those added later
(``local add``): ``members`` is the bootstrap membership the founding nodes
were started with; a node added later starts without it and joins the
running cluster through the others' addresses.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nonstop.client.credentials import (
    CREDENTIALS_ENV,
    CREDENTIALS_FILE,
    SECRET_FILE,
    load_credentials,
    new_password,
    remember_credential,
    write_credentials,
    write_secret,
)
from nonstop.net.tls import TLSConfig
from nonstop.node.config import ConfigError, check_options, from_mapping, write
from nonstop.node.datadir import DataDir, pid_alive

DEFAULT_DIR = "./.nonstop/local"


class LocalError(Exception):
    """A one-line reason the local cluster command failed."""


@dataclass
class LocalNode:
    name: str
    listen: str
    data: Path
    config: Path
    metrics: str | None = None
    """``host:port`` of its metrics endpoint (None in folders made before there was one)."""
    admin: str | None = None
    """``host:port`` of its admin API and console (None in folders made before there was one)."""


_PORTS_GIVEN: set[int] = set()
"""Ports this process handed out already (never twice: the node may not listen yet)."""


def _ephemeral_low() -> int:
    """The lowest port of the kernel's range for outgoing connections (Linux; 32768 else)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, below the kernel's ephemeral range.

    The kernel's own choice (``bind(0)``) is an ephemeral port, which any outgoing
    connection on the machine may take between now and the node's ``listen``: ``make
    demo`` once failed so ("cannot listen for metrics ...: port in use").  A random free
    port below that range is one no outgoing connection is given.
    """
    low = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(100):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _PORTS_GIVEN:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _PORTS_GIVEN.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _metrics_address() -> str:
    # Loopback only: the endpoint has no authentication yet (docs/security.md).
    return f"127.0.0.1:{free_port()}"


def node_names(n: int) -> list[str]:
    if n <= 26:
        return list(string.ascii_uppercase[:n])
    return [f"n{i + 1}" for i in range(n)]


class LocalCluster:
    """The layout of one local cluster folder."""

    def __init__(self, folder: str | Path = DEFAULT_DIR) -> None:
        self.dir = Path(folder).resolve()
        self.layout_path = self.dir / "local.json"
        self.secret_path = self.dir / SECRET_FILE
        self.credentials_path = self.dir / CREDENTIALS_FILE

    def ensure_auth_files(self) -> None:
        """Write the cluster secret and the admin credentials if the folder has none."""
        if not self.secret_path.exists():
            write_secret(self.secret_path)
        if not self.credentials_path.exists():
            env = os.environ.get(CREDENTIALS_ENV)
            if env:
                given = load_credentials(env)
                write_credentials(self.credentials_path, given.user, given.password)
            else:
                write_credentials(self.credentials_path, "admin", new_password())

    def load(self) -> dict[str, Any] | None:
        try:
            layout: dict[str, Any] = json.loads(self.layout_path.read_text())
        except (OSError, ValueError):
            return None
        self.remember(layout)
        return layout

    def remember(self, layout: dict[str, Any]) -> None:
        """Clients of this process use the folder's admin credential for its nodes."""
        if self.credentials_path.exists():
            with contextlib.suppress(Exception):
                credential = load_credentials(self.credentials_path)
                remember_credential(self.addresses(layout), credential)

    def create(
        self, n: int, base_port: int | None, options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write a new layout: names A, B, C..., free ports, one cluster id.

        ``options`` are node config keys for every node, checked against the schema
        (:class:`~nonstop.node.config.ConfigError` names a bad key).
        """
        if n < 1:
            raise LocalError("a local cluster needs at least one node")
        checked = check_options(options or {})
        self.dir.mkdir(parents=True, exist_ok=True)
        names = node_names(n)
        ports = [base_port + i if base_port else free_port() for i in range(n)]
        layout = {
            "cluster": "local-" + secrets.token_hex(4),
            "members": names,
            "nodes": [
                {"name": name, "listen": f"127.0.0.1:{port}", "metrics": _metrics_address()}
                for name, port in zip(names, ports, strict=True)
            ],
            "options": checked,
        }
        self.save(layout)
        self.ensure_auth_files()
        self.remember(layout)
        return layout

    def save(self, layout: dict[str, Any]) -> None:
        tmp = self.layout_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(layout, indent=2))
        os.replace(tmp, self.layout_path)

    def add(self, layout: dict[str, Any], name: str | None = None) -> LocalNode:
        """Append a node (next free name, a free port) to the layout and save it."""
        taken = {entry["name"] for entry in layout["nodes"]}
        if name is None:
            candidates = node_names(len(taken) + 1)
            if len(taken) >= 26:
                candidates = [f"n{i}" for i in range(1, len(taken) + 2)]
            name = next(n for n in candidates if n not in taken)
        elif name in taken:
            raise LocalError(f"{self.dir} already has a node named {name!r}")
        layout["nodes"].append(
            {"name": name, "listen": f"127.0.0.1:{free_port()}", "metrics": _metrics_address()}
        )
        self.save(layout)
        self.remember(layout)
        return self.node(layout, name)

    def forget(self, layout: dict[str, Any], name: str) -> None:
        """Drop node ``name`` from the layout and delete its config and data."""
        node = self.node(layout, name)
        layout["nodes"] = [e for e in layout["nodes"] if e["name"] != name]
        self.save(layout)
        node.config.unlink(missing_ok=True)
        shutil.rmtree(node.data, ignore_errors=True)

    def node(self, layout: dict[str, Any], name: str) -> LocalNode:
        for node in self.nodes(layout):
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes(layout))
        raise LocalError(f"{self.dir} has no node named {name!r} (it has {names})")

    def running(self, layout: dict[str, Any]) -> dict[str, int]:
        """``name → pid`` of the nodes of the layout that run now."""
        out = {}
        for node in self.nodes(layout):
            pid = DataDir(node.data).running_pid()
            if pid is not None:
                out[node.name] = pid
        return out

    def nodes(self, layout: dict[str, Any]) -> list[LocalNode]:
        return [
            LocalNode(
                name=entry["name"],
                listen=entry["listen"],
                data=self.dir / entry["name"],
                config=self.dir / f"{entry['name']}.toml",
                metrics=entry.get("metrics"),
                admin=entry.get("admin"),
            )
            for entry in layout["nodes"]
        ]

    def write_config(self, layout: dict[str, Any], node: LocalNode) -> None:
        """Write ``DIR/<name>.toml`` (checked against the schema, written with tomli-w)."""
        others = [n for n in self.nodes(layout) if n.name != node.name]
        # Layouts written before "members" was kept: every node was a founder.
        founders = layout.get("members", [n.name for n in self.nodes(layout)])
        values: dict[str, Any] = {
            "name": node.name,
            "cluster": layout["cluster"],
            "data": str(node.data),
            "listen": node.listen,
            "join": [f"{o.name}@{o.listen}" for o in others],
            # A node added after the founding joins the running cluster instead.
            "members": founders if node.name in founders else [],
            "log_file": str(node.data / "node.log"),
            "auth": {
                "secret_file": str(self.secret_path),
                "admin_file": str(self.credentials_path),
            },
        }
        entry = next(e for e in layout["nodes"] if e["name"] == node.name)
        if "metrics" not in entry:
            # A folder made before nodes had a metrics endpoint: give this one its port now.
            entry["metrics"] = node.metrics = _metrics_address()
            self.save(layout)
        if node.metrics is not None:
            values["metrics"] = {"listen": node.metrics}
        if "admin" not in entry:
            # Every node serves the admin API and console on a port of its own (loopback).
            entry["admin"] = node.admin = f"127.0.0.1:{free_port()}"
            self.save(layout)
        values["admin"] = {"listen": node.admin}
        self.ensure_auth_files()
        options = dict(layout.get("options", {}))
        if isinstance(options.get("auth"), dict):  # e.g. --option auth='{"enabled": false}'
            values["auth"] = {**values["auth"], **options.pop("auth")}
        values.update(options)
        try:
            write(node.config, from_mapping(values))
        except ConfigError as exc:
            raise LocalError(f"{self.layout_path}: {exc}") from None

    def addresses(self, layout: dict[str, Any]) -> list[str]:
        return [n.listen for n in self.nodes(layout)]

    @staticmethod
    def client_tls(layout: dict[str, Any]) -> TLSConfig | None:
        """How the CLI talks to the nodes: TLS with the nodes' own files when they use TLS.

        The nodes' certificate doubles as the client certificate, so a mutual-TLS
        cluster (``tls.ca`` set) accepts the commands of ``nonstop local``.
        """
        tls = layout.get("options", {}).get("tls")
        if not isinstance(tls, dict) or not (tls.get("cert") or tls.get("ca")):
            return None
        return TLSConfig(
            cert=tls.get("cert"),
            key=tls.get("key"),
            ca=tls.get("ca"),
            check_hostname=bool(tls.get("check_hostname", True)),
        )

    def metrics_addresses(self, layout: dict[str, Any]) -> dict[str, str]:
        """``name → host:port`` of each node's metrics endpoint."""
        return {n.name: n.metrics for n in self.nodes(layout) if n.metrics is not None}

    def admin_addresses(self, layout: dict[str, Any]) -> dict[str, str]:
        """``name → host:port`` of each node's admin API and console."""
        return {n.name: n.admin for n in self.nodes(layout) if n.admin is not None}

    def log_files(self, layout: dict[str, Any]) -> dict[str, Path]:
        """``name → DIR/<name>/node.log`` of each node of the layout."""
        return {n.name: n.data / "node.log" for n in self.nodes(layout)}


def spawn_node(
    config: Path,
    data: Path,
    timeout: float = 15.0,
    *,
    prefix: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> int:
    """Start a detached node process; return its pid once it listens.

    The child runs in its own session (so a terminal's Ctrl-C or a test
    runner's process group kill does not take it down by accident); we wait
    until it wrote its pid file, or report its own one-line error if it exits.
    ``prefix`` runs the command through another one that execs it (``ip netns
    exec NS``: the pid stays the node's); ``env`` replaces this process's
    environment for the child.
    """
    return _wait_listening(_launch(config, data, prefix, env), timeout)


def spawn_nodes(
    nodes: Sequence[LocalNode],
    timeout: float = 15.0,
    *,
    prefixes: Mapping[str, Sequence[str]] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Start several nodes at once; return ``{name: pid}`` once every one listens.

    Each process spends most of a second importing nonstop before it listens, so
    one after the other costs seconds per cluster.  If any node fails to start,
    every node launched here is killed and a :class:`LocalError` is raised: the
    failed node's name and its own one-line reason, then the others stopped again.
    Nothing is left running.  ``prefixes`` and ``env`` as in :func:`spawn_node`
    (``prefixes`` by node name).
    """
    launched = {
        n.name: _launch(n.config, n.data, (prefixes or {}).get(n.name, ()), env) for n in nodes
    }
    deadline = time.monotonic() + timeout
    pids: dict[str, int] = {}
    try:
        for name, started in launched.items():
            pids[name] = _wait_listening(started, max(0.1, deadline - time.monotonic()))
    except LocalError as exc:
        for started in launched.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.proc.pid, signal.SIGKILL)
        for started in launched.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                started.proc.wait(timeout=10)
        others = [n for n in launched if n != name]
        note = f" (stopped again: {', '.join(others)})" if others else ""
        raise LocalError(f"node {name}: {exc}{note}") from None
    return pids


@dataclass
class _Launched:
    proc: subprocess.Popen[bytes]
    config: Path
    data: Path
    err_path: Path


def _launch(
    config: Path, data: Path, prefix: Sequence[str], env: Mapping[str, str] | None
) -> _Launched:
    data.mkdir(parents=True, exist_ok=True)
    err_path = data / "start.err"
    command = [sys.executable, "-m", "nonstop.admin.cli", "node", "start", "--config", str(config)]
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [*prefix, *command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    return _Launched(proc, config, data, err_path)


def _wait_listening(started: _Launched, timeout: float) -> int:
    """The pid once the node wrote its pid file; its own error if it exited first."""
    proc = started.proc
    datadir = DataDir(started.data)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            lines = [line for line in started.err_path.read_text().splitlines() if line.strip()]
            reason = lines[-1] if lines else f"exit code {code}"
            raise LocalError(reason.removeprefix("nonstop: error: "))
        if datadir.running_pid() == proc.pid:
            return proc.pid
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    raise LocalError(f"node with config {started.config} did not start within {timeout:.0f}s")


def stop_pid(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM, wait for a graceful exit, SIGKILL after ``timeout``; True if it was running."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True
