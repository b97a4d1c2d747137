"""``nonstop local up | down | add | remove | stop | start | destroy``: a cluster on 127.0.0.1.

Every node of the folder is in ``DIR/local.json`` (:mod:`nonstop.admin.local`).
``up`` starts the missing nodes and stops again what it started when the
cluster does not come up; it warns when asked for another layout than the
folder's (it never silently changes ports or node count).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

import click

from nonstop.admin.cmd_cluster import Target
from nonstop.admin.local import (
    DEFAULT_DIR,
    LocalCluster,
    LocalError,
    spawn_node,
    spawn_nodes,
    stop_pid,
)
from nonstop.admin.output import USAGE, emit_status, fail, note
from nonstop.admin.served import partitions_served
from nonstop.errors import Error
from nonstop.net.tls import TLSConfig, setup_problem
from nonstop.node.config import ConfigError, check_options
from nonstop.node.datadir import DataDir

DIR_OPTION = click.option("--dir", "folder", default=DEFAULT_DIR, show_default=True)


@click.group()
def local() -> None:
    """A cluster of node processes on this machine (127.0.0.1)."""


def parse_options(options: tuple[str, ...], apps: tuple[str, ...]) -> dict[str, Any]:
    """``--option key=value`` (JSON values, else strings) checked against the config schema."""
    parsed: dict[str, Any] = {}
    for opt in options:
        key, eq, raw = opt.partition("=")
        if not eq or not key.strip():
            fail(f"--option {opt!r} is not key=value (e.g. --option lock_wait=2)", USAGE)
        try:
            parsed[key.strip()] = json.loads(raw)
        except ValueError:
            parsed[key.strip()] = raw
    if apps:
        parsed["app"] = list(dict.fromkeys(apps))
    try:
        checked = check_options(parsed)
    except ConfigError as exc:
        fail(f"--option: {exc}", USAGE)
    if "tls" in checked:
        checked["tls"] = absolute_tls_files(checked["tls"])
    return checked


def absolute_tls_files(tls: dict[str, Any]) -> dict[str, Any]:
    """The ``tls`` option with its files made absolute (the nodes run in other folders)
    and checked now: a missing file or a bad key is refused with the reason at once."""
    out = {
        key: os.path.abspath(value) if key in ("cert", "key", "ca") and value else value
        for key, value in tls.items()
    }
    known = {
        k: out[k]
        for k in ("cert", "key", "ca", "require_client_cert", "check_hostname")
        if k in out
    }
    problem = setup_problem(TLSConfig(**known))
    if problem is not None:
        fail(f"--option tls: {problem}", USAGE)
    return out


def show_status(
    lc: LocalCluster, layout: dict[str, Any], status: dict[str, Any], as_json: bool
) -> None:
    """The status table (or JSON) of the folder's cluster, with each node's metrics address."""
    emit_status(
        status,
        as_json,
        cluster=layout["cluster"],
        source=str(lc.layout_path),
        metrics=lc.metrics_addresses(layout),
    )
    consoles = lc.admin_addresses(layout)
    if consoles and not as_json:
        scheme = "https" if lc.client_tls(layout) is not None else "http"
        first = sorted(consoles)[0]
        click.echo(
            f"console: {scheme}://{consoles[first]}/console/ (node {first}; every node has one; "
            f"log in with the user and password of {lc.credentials_path})"
        )


def load_layout(lc: LocalCluster) -> dict[str, Any]:
    layout = lc.load()
    if layout is None:
        fail(
            f"no local cluster in {lc.dir}: create one with `nonstop local up --dir {lc.dir}`",
            USAGE,
        )
    return layout


@local.command("up")
@click.option("-n", "count", type=click.IntRange(min=1), help="Number of nodes (new folder: 3).")
@DIR_OPTION
@click.option(
    "--base-port", type=click.IntRange(1, 65535), help="First port (default: free ports)."
)
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for Active.")
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--option", "options", multiple=True, help="key=value node config (JSON value), repeatable."
)
@click.option(
    "--app", "apps", multiple=True, help="Application module every node imports; repeatable."
)
def local_up(
    count: int | None,
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
    parsed = parse_options(options, apps)
    if layout is None:
        try:
            layout = lc.create(count or 3, base_port, parsed)
        except (LocalError, ConfigError) as exc:
            fail(str(exc), USAGE)
    else:
        warn_other_layout(lc, layout, count, base_port)
        if parsed:
            layout.setdefault("options", {}).update(parsed)
            lc.save(layout)
    running = lc.running(layout)
    missing = [n for n in lc.nodes(layout) if n.name not in running]
    for n in missing:  # one by one: each write also rewrites the layout file
        lc.write_config(layout, n)
    try:
        started = spawn_nodes(missing)  # at once; a failure stops every one of them
    except LocalError as exc:
        fail(str(exc))
    if not as_json:
        click.echo(f"started: {', '.join(started) if started else 'none (all running)'}")
    status = wait_active(lc.addresses(layout), timeout, lc.client_tls(layout))
    if status is None:
        stop_started(started)
        fail(
            f"cluster did not become Active within {timeout:.0f}s{_stopped_note(started)}: "
            f"see {lc.dir}/*/node.log"
        )
    show_status(lc, layout, status, as_json)
    if not as_json:
        addresses = ",".join(lc.addresses(layout))
        click.echo(
            f'connect: nonstop.connect("{addresses}")   '
            f"status: nonstop cluster status --dir {folder}"
        )


def warn_other_layout(
    lc: LocalCluster, layout: dict[str, Any], count: int | None, base_port: int | None
) -> None:
    """A folder keeps its layout: say so when the command line asks for another one."""
    nodes = lc.nodes(layout)
    ports = [int(n.listen.rpartition(":")[2]) for n in nodes]
    hint = f"`nonstop local destroy --dir {lc.dir}` first for a new layout"
    if count is not None and count != len(nodes):
        note(
            f"{lc.dir} holds a {len(nodes)}-node cluster; -n {count} ignored "
            f"(`nonstop local add`/`remove` change it, or {hint})"
        )
    if base_port is not None and ports != [base_port + i for i in range(len(ports))]:
        note(
            f"{lc.dir} uses ports {', '.join(map(str, ports))}; --base-port {base_port} "
            f"ignored ({hint})"
        )


def stop_started(started: dict[str, int]) -> None:
    for pid in started.values():
        stop_pid(pid)


def _stopped_note(started: dict[str, int]) -> str:
    return f" (stopped again: {', '.join(started)})" if started else ""


def wait_active(
    addresses: list[str], timeout: float, tls: TLSConfig | None = None
) -> dict[str, Any] | None:
    """Poll status until every node reports quorum Active and the same leader, and every
    partition is served (:func:`~nonstop.admin.served.partitions_served`).

    Returns the first node's last status, or None on timeout.  Waiting for an
    agreed leader too means the status printed after ``local up`` is settled; waiting
    for the partitions means the first transaction after it is not refused.
    """
    from nonstop.client import Client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        statuses = []
        for address in addresses:
            try:
                with Client([address], timeout=1.0, rounds=1, tls=tls) as c:
                    statuses.append(c.status())
            except Error:
                break
        leaders = {s.get("leader") for s in statuses}
        if (
            len(statuses) == len(addresses)
            and all(s.get("quorum") == "Active" for s in statuses)
            and len(leaders) == 1
            and None not in leaders
            and partitions_served({str(s.get("name")): s for s in statuses})
        ):
            return statuses[0]
        time.sleep(0.1)
    return None


@local.command("down")
@DIR_OPTION
def local_down(folder: str) -> None:
    """Stop every node of the local cluster (graceful); data is kept."""
    lc = LocalCluster(folder)
    layout = load_layout(lc)
    stopped = [name for name, pid in lc.running(layout).items() if stop_pid(pid)]
    click.echo(f"stopped: {', '.join(stopped) if stopped else 'none (nothing running)'}")


@local.command("stop")
@click.argument("name")
@DIR_OPTION
def local_stop(name: str, folder: str) -> None:
    """Stop node NAME (graceful); it stays a member and keeps its data."""
    lc = LocalCluster(folder)
    layout = load_layout(lc)
    node = _node(lc, layout, name)
    pid = DataDir(node.data).running_pid()
    if pid is None:
        fail(f"node {name} is not running (start it with `nonstop local start {name}`)", USAGE)
    stop_pid(pid)
    click.echo(f"stopped: {name}")


@local.command("start")
@click.argument("name")
@DIR_OPTION
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for Active.")
def local_start(name: str, folder: str, timeout: float) -> None:
    """Start node NAME again on its data and wait until the cluster is Active."""
    lc = LocalCluster(folder)
    layout = load_layout(lc)
    node = _node(lc, layout, name)
    if DataDir(node.data).running_pid() is not None:
        fail(f"node {name} is already running", USAGE)
    try:
        lc.write_config(layout, node)
        pid = spawn_node(node.config, node.data)
    except LocalError as exc:
        fail(f"node {name}: {exc}")
    click.echo(f"started: {name} (pid {pid}, {node.listen})")
    _wait_running(lc, layout, timeout)


@local.command("add")
@DIR_OPTION
@click.option("--name", help="Name of the new node (default: the next letter).")
@click.option("--timeout", default=30.0, show_default=True, help="Seconds to wait for Active.")
def local_add(folder: str, name: str | None, timeout: float) -> None:
    """Add a node to the local cluster: it starts and joins through the cluster log."""
    lc = LocalCluster(folder)
    layout = load_layout(lc)
    if not lc.running(layout):
        fail(
            f"the local cluster in {lc.dir} is down: "
            f"start it with `nonstop local up --dir {folder}`"
        )
    try:
        node = lc.add(layout, name)
    except LocalError as exc:
        fail(str(exc), USAGE)
    try:
        lc.write_config(layout, node)
        pid = spawn_node(node.config, node.data)
    except LocalError as exc:
        lc.forget(layout, node.name)
        fail(f"node {node.name}: {exc}")
    click.echo(f"started: {node.name} (pid {pid}, {node.listen}); joining")
    _wait_running(lc, layout, timeout)


@local.command("remove")
@click.argument("name")
@DIR_OPTION
@click.option("--timeout", default=10.0, show_default=True, help="Seconds per request.")
def local_remove(name: str, folder: str, timeout: float) -> None:
    """Remove node NAME: leave the membership, stop it, delete its data and config.

    Refused while its store holds objects (they would be lost), or while it is stopped
    and a member (what it holds cannot be counted).
    """
    from nonstop.admin.cmd_cluster import open_client, remove_member

    lc = LocalCluster(folder)
    layout = load_layout(lc)
    node = _node(lc, layout, name)
    others = [n.listen for n in lc.nodes(layout) if n.name != name]
    if not others:
        fail(f"{name} is the last node: use `nonstop local destroy --dir {folder}`", USAGE)
    pid = DataDir(node.data).running_pid()
    target = Target(
        ",".join(others),
        layout["cluster"],
        str(lc.layout_path),
        str(lc.dir),
        lc.client_tls(layout),
    )
    with open_client(target, timeout) as client:
        member = _is_member(client, name)  # an added node that never joined is not
    if member:
        remove_member(target, timeout, name)
    if pid is not None:
        stop_pid(pid)
    lc.forget(layout, name)
    click.echo(f"removed: {name} (data deleted)")


@local.command("destroy")
@DIR_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def local_destroy(folder: str, yes: bool) -> None:
    """Stop every node and delete the folder with all their data."""
    lc = LocalCluster(folder)
    layout = load_layout(lc)
    if not yes:
        if not sys.stdin.isatty():
            fail(f"destroy deletes all data in {lc.dir}: pass --yes to confirm", USAGE)
        click.confirm(f"Delete every node and all data in {lc.dir}?", abort=True)
    for pid in lc.running(layout).values():
        stop_pid(pid)
    shutil.rmtree(lc.dir)
    click.echo(f"destroyed: {lc.dir}")


def _node(lc: LocalCluster, layout: dict[str, Any], name: str) -> Any:
    try:
        return lc.node(layout, name)
    except LocalError as exc:
        fail(str(exc), USAGE)


def _is_member(client: Any, name: str) -> bool:
    try:
        return name in (client.status().get("members") or [])
    except (Error, ValueError) as exc:
        fail(str(exc))


def _wait_running(lc: LocalCluster, layout: dict[str, Any], timeout: float) -> None:
    """Wait until the running nodes agree on an Active quorum; print the status."""
    running = set(lc.running(layout))
    addresses = [n.listen for n in lc.nodes(layout) if n.name in running]
    status = wait_active(addresses, timeout, lc.client_tls(layout))
    if status is None:
        fail(f"cluster did not become Active within {timeout:.0f}s: see {lc.dir}/*/node.log")
    show_status(lc, layout, status, False)
