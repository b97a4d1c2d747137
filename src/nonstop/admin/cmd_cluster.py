"""``nonstop cluster status | join | leave | remove``: ask a running cluster.

Which cluster: the nodes given with ``--node``, else the local cluster of
``--dir`` (default ``./.nonstop/local``), whose cluster id is then checked on
connect.  Without either the command refuses with a hint rather than show
whatever happens to answer on a default port.

Membership changes go through the cluster log (the leader commits a new
view).  Removing a node does not move its data yet (issue 10): the node that
takes the request refuses to remove a node whose object store holds objects,
naming how many of which types, or that cannot be asked (dataplane/holdings.py);
there is no ``--force``: its objects would turn into ``NotFound``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import click

from nonstop.admin.local import LocalCluster
from nonstop.admin.output import USAGE, emit_status, fail
from nonstop.client.credentials import CREDENTIALS_ENV
from nonstop.errors import AuthenticationFailed, Error
from nonstop.net.tls import TLSConfig

DIR_HELP = "Local cluster folder whose nodes to ask (default ./.nonstop/local)."


@dataclass
class Target:
    """The addresses to ask, the cluster id expected ('' = any) and where they came from."""

    addresses: str
    cluster: str
    source: str
    folder: str | None = None
    tls: TLSConfig | None = None
    """The local cluster's TLS files (its nodes use TLS), unless given on the command line."""
    credentials: str | None = None


def resolve_target(
    address: str | None, folder: str | None, credentials: str | None = None
) -> Target:
    """``--node`` wins; else the local cluster of ``--dir``; else a one-line refusal.

    The credential: ``--credentials``, else ``$NONSTOP_CREDENTIALS``, else the local
    cluster folder's (``nonstop.client.credentials``).
    """
    from nonstop.admin.local import DEFAULT_DIR

    if address:
        return Target(address, "", "--node", credentials=credentials)
    lc = LocalCluster(folder or DEFAULT_DIR)
    layout = lc.load()
    if layout is None:
        fail(
            f"no local cluster in {lc.dir}: pass --node HOST:PORT of a node, or --dir of a "
            "local cluster folder (`nonstop local up` creates one)",
            USAGE,
        )
    return Target(
        ",".join(lc.addresses(layout)),
        layout["cluster"],
        str(lc.layout_path),
        str(lc.dir),
        lc.client_tls(layout),
        credentials,
    )


def open_client(target: Target, timeout: float, tls: TLSConfig | None = None) -> Any:
    """A connected client, or a one-line failure with what to do."""
    from nonstop.client import connect

    if tls is None or not tls.enabled:
        tls = target.tls
    try:
        return connect(
            target.addresses,
            cluster=target.cluster,
            timeout=timeout,
            tls=tls,
            credentials=target.credentials,
            folder=target.folder,
            # Admin requests are not a load to spread (H5): the node named first
            # answers while it is up, so two commands in a row see the same node's view.
            balance="first",
        )
    except AuthenticationFailed as exc:
        fail(f"{exc} (--credentials FILE, or NONSTOP_CREDENTIALS)")
    except (Error, ValueError) as exc:
        if target.folder is not None:
            fail(
                f"no node of the local cluster in {target.folder} answers ({exc}): "
                f"start it with `nonstop local up --dir {target.folder}`"
            )
        fail(str(exc))


def tls_options(f: Any) -> Any:
    for option in (
        click.option("--tls-key", type=click.Path(dir_okay=False), help="Client private key."),
        click.option("--tls-cert", type=click.Path(dir_okay=False), help="Client certificate."),
        click.option("--tls-ca", type=click.Path(dir_okay=False), help="CA file: talk TLS."),
    ):
        f = option(f)
    return f


def _use_credentials(_ctx: Any, _param: Any, value: str | None) -> None:
    """``--credentials FILE``: what this command (and anything it starts, Spark's workers
    included, which inherit the environment) proves to the nodes."""
    if value:
        os.environ[CREDENTIALS_ENV] = os.path.abspath(value)


credentials_option = click.option(
    "--credentials",
    expose_value=False,
    callback=_use_credentials,
    help="Credentials file to connect with (default $NONSTOP_CREDENTIALS, else the "
    "local cluster folder's).",
)


def target_options(f: Any) -> Any:
    f = credentials_option(f)
    for option in (
        click.option("--timeout", default=3.0, show_default=True, help="Seconds per node."),
        click.option("--dir", "folder", help=DIR_HELP),
        click.option("--node", "address", help="Node address(es) to ask, comma-separated."),
    ):
        f = option(f)
    return f


@click.group()
def cluster() -> None:
    """Ask a running cluster: status, membership."""


@cluster.command("status")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@tls_options
def cluster_status(
    address: str | None,
    folder: str | None,
    timeout: float,
    as_json: bool,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Show the cluster id, view, quorum, leader, and every node's state and membership."""
    from nonstop.admin.registered import context_for, run_registered

    target = resolve_target(address, folder)
    tls = TLSConfig(cert=tls_cert, key=tls_key, ca=tls_ca)
    status = run_registered("cluster.status", context_for(target, timeout, tls), {}, target)
    cluster_id = status.pop("cluster")
    metrics = None
    if target.folder is not None:
        lc = LocalCluster(target.folder)
        layout = lc.load()
        metrics = lc.metrics_addresses(layout) if layout is not None else None
    emit_status(status, as_json, cluster=cluster_id, source=target.source, metrics=metrics)
    if not as_json and status.get("partitions"):
        click.echo(partitions_summary(status))


def partitions_summary(status: dict[str, Any]) -> str:
    """One line on the partition table (``nonstop partition list`` shows it whole)."""
    parts = status["partitions"]
    states: dict[str, int] = {}
    for part in parts:
        states[part["state"]] = states.get(part["state"], 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    acting = len(status.get("acting") or [])
    return (
        f"partitions: {len(parts)} ({counts}); {status.get('name')} acts for {acting} "
        "(`nonstop partition list`)"
    )


@cluster.command("join")
@click.argument("name")
@click.argument("node_address", metavar="ADDRESS")
@target_options
def cluster_join_cmd(
    name: str, node_address: str, address: str | None, folder: str | None, timeout: float
) -> None:
    """Add node NAME at ADDRESS (host:port) to the membership, through the cluster log.

    The node itself must be running without bootstrap members (it waits to be added).
    """
    arguments = {"name": name, "node_address": node_address}
    reply = membership("cluster.join", resolve_target(address, folder), timeout, arguments)
    click.echo(f"{name} is a member: view {reply.get('view')}, members {_names(reply)}")


@cluster.command("remove")
@click.argument("name")
@target_options
def cluster_remove(name: str, address: str | None, folder: str | None, timeout: float) -> None:
    """Remove node NAME from the membership (refused while its store holds objects)."""
    remove_member(resolve_target(address, folder), timeout, name)


@cluster.command("leave")
@credentials_option
@click.option("--node", "address", required=True, help="Address of the node that leaves.")
@click.option("--timeout", default=3.0, show_default=True, help="Seconds per node.")
def cluster_leave(address: str, timeout: float) -> None:
    """The node at --node leaves the membership (refused while its store holds objects)."""
    target = Target(address, "", "--node")
    with open_client(target, timeout) as client:
        try:
            name = client.ping()["name"]
        except (Error, ValueError) as exc:
            fail(str(exc))
    remove_member(target, timeout, name)


def remove_member(target: Target, timeout: float, name: str) -> None:
    """Remove member ``name``; the node asked refuses if it holds objects (one line)."""
    reply = membership("cluster.remove", target, timeout, {"name": name})
    click.echo(f"{name} removed: view {reply.get('view')}, members {_names(reply)}")


def membership(command: str, target: Target, timeout: float, arguments: dict[str, Any]) -> Any:
    """Run a registered membership command (nonstop.commands.membership_commands)."""
    from nonstop.admin.registered import context_for, run_registered

    return run_registered(command, context_for(target, timeout), arguments, target)


def _names(reply: dict[str, Any]) -> str:
    return ",".join(reply.get("members") or []) or "-"
