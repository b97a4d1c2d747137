"""The ``nonstop`` command line (G1, G2): node life cycle, cluster status, local clusters.

Every command prints either a human table or, with ``--json``, one JSON
document on stdout; errors are one line on stderr (``nonstop: error: ...``)
and a non-zero exit code, so scripts can rely on both.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from nonstop.admin.local import (
    DEFAULT_DIR,
    LocalCluster,
    LocalError,
    spawn_node,
    stop_pid,
)
from nonstop.admin.pipeline import pipeline
from nonstop.admin.scrub import store
from nonstop.errors import Error
from nonstop.node.config import ConfigError, NodeConfig, load, parse_join
from nonstop.node.datadir import DataDir

DEFAULT_NODE = "127.0.0.1:7101"


def fail(message: str, code: int = 1) -> None:
    click.echo(f"nonstop: error: {message}", err=True)
    sys.exit(code)


@click.group()
@click.version_option(package_name="nonstop")
def cli() -> None:
    """nonstop: a highly available transactional object store."""


# ================================================================= node
@cli.group()
def node() -> None:
    """Start and stop one node process."""


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
    machine: str | None,
    protocol: str | None,
) -> None:
    """Start a node (in the foreground unless --detach)."""
    try:
        cfg = load(config_path) if config_path else NodeConfig()
    except ConfigError as exc:
        fail(str(exc), 2)
        return
    overrides: dict[str, Any] = {
        "name": name,
        "data": data,
        "listen": listen,
        "cluster": cluster,
        "log_level": log_level,
        "log_file": log_file,
        "machine": machine,
    }
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    if join is not None:
        cfg.join = parse_join(join)
    if members is not None:
        cfg.members = parse_join(members)
    if apps:
        cfg.app = [*cfg.app, *(a for a in apps if a not in cfg.app)]
    if protocol is not None:
        try:
            lo, hi = (int(x) for x in protocol.split(","))
        except ValueError:
            fail("--protocol must be min,max", 2)
            return
        cfg.protocol = [lo, hi]
    try:
        cfg.validate()
    except ConfigError as exc:
        fail(str(exc), 2)
        return
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
    from nonstop.admin.local import toml_value

    lines = []
    for key, value in cfg.to_dict().items():
        if key in ("tls", "discovery", "extra") or value is None:
            continue
        lines.append(f"{key} = {toml_value(value)}\n")
    for section in ("tls", "discovery"):
        table = {k: v for k, v in cfg.to_dict()[section].items() if v is not None}
        body = "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
        lines.append(f"[{section}]\n{body}")
    config_file.write_text("".join(lines))
    try:
        pid = spawn_node(config_file, datadir.path)
    except LocalError as exc:
        fail(str(exc))
        return
    click.echo(f"node {cfg.name} started (pid {pid}, listening on {cfg.listen})")


@node.command("stop")
@click.option("--data", required=True, type=click.Path(file_okay=False), help="Data directory.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds before SIGKILL.")
def node_stop(data: str, timeout: float) -> None:
    """Stop the node using DATA (SIGTERM: graceful)."""
    datadir = DataDir(data)
    pid = datadir.running_pid()
    if pid is None:
        fail(f"no node is running on {datadir.path}")
        return
    stop_pid(pid, timeout)
    click.echo(f"node stopped (pid {pid})")


# ============================================================== cluster
@cli.group()
def cluster() -> None:
    """Ask a running cluster."""


def _default_addresses(folder: str) -> str:
    layout = LocalCluster(folder).load()
    if layout:
        return ",".join(LocalCluster(folder).addresses(layout))
    return DEFAULT_NODE


@cluster.command("status")
@click.option("--node", "address", help="Node address(es) to ask, comma-separated.")
@click.option("--dir", "folder", default=DEFAULT_DIR, help="Local cluster folder (default source).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--timeout", default=3.0, show_default=True)
@click.option("--tls-ca", type=click.Path(dir_okay=False), help="CA file: talk TLS to the nodes.")
@click.option("--tls-cert", type=click.Path(dir_okay=False), help="Client certificate (PEM).")
@click.option("--tls-key", type=click.Path(dir_okay=False), help="Client private key (PEM).")
def cluster_status(
    address: str | None,
    folder: str,
    as_json: bool,
    timeout: float,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Show view, quorum, leader and every node's state."""
    from nonstop.client import connect
    from nonstop.net.tls import TLSConfig

    addresses = address or _default_addresses(folder)
    tls = TLSConfig(cert=tls_cert, key=tls_key, ca=tls_ca)
    try:
        with connect(addresses, timeout=timeout, tls=tls) as client:
            status = client.status()
    except (Error, ValueError) as exc:
        fail(str(exc))
        return
    emit_status(status, as_json)


def emit_status(status: dict[str, Any], as_json: bool) -> None:
    nodes = [
        {
            "name": n.get("name"),
            "address": n.get("address"),
            "state": n.get("state"),
            "pid": n.get("pid"),
            **{k: v for k, v in n.items() if k not in ("name", "address", "state", "pid")},
        }
        for n in status.get("nodes", [])
    ]
    status = {**status, "nodes": nodes}
    if as_json:
        click.echo(json.dumps(status, indent=2, sort_keys=True))
        return
    leader = status.get("leader")
    click.echo(
        f"node {status.get('name')}: view {status.get('view')}  quorum {status.get('quorum')}  "
        f"leader {leader if leader else '-'} (term {status.get('term', 0)})"
    )
    if "members" in status:
        # The committed view: configured members, and those its leader saw Up when deciding it.
        members = ",".join(status.get("members") or []) or "-"
        live = ",".join(status.get("live") or []) or "-"
        click.echo(f"view {status.get('view')}: members {members}  live {live}")
    rows = [("NAME", "ADDRESS", "STATE", "PID")] + [
        (str(n["name"]), str(n["address"] or "-"), str(n["state"]), str(n["pid"] or "-"))
        for n in nodes
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for warning in status.get("warnings", []):
        click.echo(f"warning: {warning}")


# ================================================================ local
@cli.group()
def local() -> None:
    """A cluster of node processes on this machine (127.0.0.1)."""


@local.command("up")
@click.option("-n", "count", default=3, show_default=True, help="Number of nodes.")
@click.option("--dir", "folder", default=DEFAULT_DIR, show_default=True)
@click.option("--base-port", type=int, help="First port (default: free ports).")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for Active.")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--option", "options", multiple=True, help="key=value node config (JSON value), repeatable."
)
@click.option(
    "--app", "apps", multiple=True, help="Application module every node imports; repeatable."
)
def local_up(
    count: int,
    folder: str,
    base_port: int | None,
    timeout: float,
    as_json: bool,
    options: tuple[str, ...],
    apps: tuple[str, ...],
) -> None:
    """Start N nodes (or the missing ones of an existing local cluster), wait for Active."""
    lc = LocalCluster(folder)
    layout = lc.load()
    parsed: dict[str, Any] = {}
    for opt in options:
        key, _, raw = opt.partition("=")
        try:
            parsed[key] = json.loads(raw)
        except ValueError:
            parsed[key] = raw
    if apps:
        parsed["app"] = list(dict.fromkeys(apps))
    if layout is None:
        try:
            layout = lc.create(count, base_port, parsed)
        except LocalError as exc:
            fail(str(exc))
            return
    else:
        if parsed:
            layout.setdefault("options", {}).update(parsed)
            lc.layout_path.write_text(json.dumps(layout, indent=2))
        if len(layout["nodes"]) != count:
            click.echo(
                f"note: {lc.dir} holds a {len(layout['nodes'])}-node cluster; using it", err=True
            )
    started = []
    for n in lc.nodes(layout):
        if DataDir(n.data).running_pid() is not None:
            continue
        lc.write_config(layout, n)
        try:
            spawn_node(n.config, n.data)
        except LocalError as exc:
            fail(f"node {n.name}: {exc}")
            return
        started.append(n.name)
    if not as_json:
        click.echo(f"started: {', '.join(started) if started else 'none (all running)'}")
    status = wait_active(lc.addresses(layout), timeout)
    if status is None:
        fail(f"cluster did not become Active within {timeout:.0f}s (see {lc.dir}/*/node.log)")
        return
    emit_status(status, as_json)


def wait_active(addresses: list[str], timeout: float) -> dict[str, Any] | None:
    """Poll status until every node reports quorum Active and the same leader.

    Returns the first node's last status, or None on timeout.  Waiting for an
    agreed leader too means the status printed after ``local up`` is settled.
    """
    from nonstop.client import Client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = []
        for address in addresses:
            try:
                with Client([address], timeout=1.0, rounds=1) as c:
                    statuses.append(c.status())
            except Error:
                break
        leaders = {s.get("leader") for s in statuses}
        if (
            len(statuses) == len(addresses)
            and all(s.get("quorum") == "Active" for s in statuses)
            and len(leaders) == 1
            and None not in leaders
        ):
            return statuses[0]
        time.sleep(0.1)
    return None


@local.command("down")
@click.option("--dir", "folder", default=DEFAULT_DIR, show_default=True)
def local_down(folder: str) -> None:
    """Stop every node of the local cluster (graceful); data is kept."""
    lc = LocalCluster(folder)
    layout = lc.load()
    if layout is None:
        fail(f"no local cluster in {lc.dir}")
        return
    stopped = []
    for n in lc.nodes(layout):
        pid = DataDir(n.data).running_pid()
        if pid is not None and stop_pid(pid):
            stopped.append(n.name)
    click.echo(f"stopped: {', '.join(stopped) if stopped else 'none (nothing running)'}")


# ============================================================= pipeline
cli.add_command(pipeline)  # the Spark jobs: nonstop.admin.pipeline
cli.add_command(store)  # nonstop store verify: nonstop.admin.scrub


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="nonstop")


if __name__ == "__main__":
    main()
