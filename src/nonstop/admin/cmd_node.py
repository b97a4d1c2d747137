"""``nonstop node start | stop | status``: one node process."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from nonstop.admin.cmd_cluster import resolve_target, target_options, tls_options
from nonstop.admin.local import LocalError, spawn_node, stop_pid
from nonstop.admin.output import USAGE, fail
from nonstop.net.tls import TLSConfig
from nonstop.node.config import ConfigError, NodeConfig, from_mapping, load, parse_join, write
from nonstop.node.datadir import DataDir


@click.group()
def node() -> None:
    """Start, stop and ask one node process."""


@node.command("start")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--name", help="Cluster-unique node name.")
@click.option("--data", type=click.Path(file_okay=False), help="Data directory.")
@click.option("--listen", help="host:port to listen on (default 127.0.0.1:7101).")
@click.option("--join", help="Comma-separated peer addresses: host:port or name@host:port.")
@click.option("--members", help="Comma-separated names: bootstrap membership of a new cluster.")
@click.option("--cluster", help="Cluster id (checked against the data directory).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-file", type=click.Path(dir_okay=False))
@click.option("--detach", is_flag=True, help="Run in the background; return once listening.")
@click.option(
    "--app",
    "apps",
    multiple=True,
    help="Application module to import at start (managed types, methods); repeatable.",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    help="The cluster secret (auth.secret_file); needed with --join.",
)
@click.option("--machine", hidden=True, help="module:factory of the protocol machine.")
@click.option("--protocol", hidden=True, help="min,max wire protocol (upgrade tests).")
def node_start(
    config_path: str | None,
    name: str | None,
    data: str | None,
    listen: str | None,
    join: str | None,
    members: str | None,
    cluster: str | None,
    log_level: str | None,
    log_file: str | None,
    detach: bool,
    apps: tuple[str, ...],
    secret_file: str | None,
    machine: str | None,
    protocol: str | None,
) -> None:
    """Start a node (in the foreground unless --detach)."""
    try:
        base = load(config_path) if config_path else NodeConfig()
    except ConfigError as exc:
        fail(str(exc), USAGE)
    overrides: dict[str, Any] = {
        key: value
        for key, value in {
            "name": name,
            "data": data,
            "listen": listen,
            "cluster": cluster,
            "log_level": log_level,
            "log_file": log_file,
            "machine": machine,
        }.items()
        if value is not None
    }
    if join is not None:
        overrides["join"] = parse_join(join)
    if members is not None:
        overrides["members"] = parse_join(members)
    if apps:
        overrides["app"] = [*base.app, *(a for a in apps if a not in base.app)]
    if secret_file is not None:
        overrides["auth"] = {**base.auth.model_dump(exclude_none=True), "secret_file": secret_file}
    if protocol is not None:
        try:
            lo, hi = (int(x) for x in protocol.split(","))
        except ValueError:
            fail("--protocol must be min,max (two integers)", USAGE)
        overrides["protocol"] = [lo, hi]
    try:
        cfg = from_mapping(overrides, base)
        cfg.validate()
    except ConfigError as exc:
        fail(str(exc), USAGE)
    if detach:
        _start_detached(cfg)
        return
    from nonstop.node.main import run

    sys.exit(run(cfg))


def _start_detached(cfg: NodeConfig) -> None:
    """Write the effective config next to the data and spawn it like ``local up`` does."""
    datadir = DataDir(cfg.data)
    datadir.path.mkdir(parents=True, exist_ok=True)
    if cfg.log_file is None:
        cfg.log_file = str(datadir.log_path)
    config_file = datadir.path / "node.toml"
    write(config_file, cfg)
    try:
        pid = spawn_node(config_file, datadir.path)
    except LocalError as exc:
        fail(str(exc))
    click.echo(f"node {cfg.name} started (pid {pid}, listening on {cfg.listen})")


@node.command("stop")
@click.option("--data", required=True, type=click.Path(file_okay=False), help="Data directory.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds before SIGKILL.")
def node_stop(data: str, timeout: float) -> None:
    """Stop the node using DATA (SIGTERM: graceful)."""
    datadir = DataDir(data)
    pid = datadir.running_pid()
    if pid is None:
        fail(f"no node is running on {datadir.path}: nothing to stop")
    stop_pid(pid, timeout)
    click.echo(f"node stopped (pid {pid})")


@node.command("status")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@tls_options
def node_status(
    address: str | None,
    folder: str | None,
    timeout: float,
    as_json: bool,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Show one node's runtime: connections, buffered bytes, refusals of its limits.

    The node asked is the first of --node (or of the local cluster) that answers.
    """
    from nonstop.admin.registered import context_for, run_registered

    target = resolve_target(address, folder)
    tls = TLSConfig(cert=tls_cert, key=tls_key, ca=tls_ca)
    stats = run_registered("node.status", context_for(target, timeout, tls), {}, target)
    name = stats["name"]
    if as_json:
        click.echo(json.dumps(stats, indent=2, sort_keys=True, default=str))
        return
    limits = stats.get("limits", {})
    conns = limits.get("connections", {})
    click.echo(
        f"node {name}: connections client {conns.get('client', 0)}, peer "
        f"{conns.get('peer', 0)}, handshaking {conns.get('handshaking', 0)}; buffered "
        f"{limits.get('buffered_bytes', 0):,} of {limits.get('buffer_budget_bytes', 0):,} bytes"
    )
    refusals = limits.get("refusals", {})
    click.echo("refusals: " + ", ".join(f"{k} {v}" for k, v in sorted(refusals.items())))
