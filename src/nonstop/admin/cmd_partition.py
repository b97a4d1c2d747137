"""``nonstop partition list | define | enable | disable``: the partition table (D2-D9).

The table is state of the cluster log (docs/design/ha.md section 2): every node
applies the same entries, so ``list`` reads it from any node that answers, then
asks every node that is up which partitions it *acts* for now (lease held,
ha.md section 8) -- node-local facts the table does not hold.

``enable`` and ``disable`` change a node's own status (D7): the request goes to
that node, which submits the entry itself (the table refuses an entry one node
makes on another's behalf).  Without ``--on`` they go to every node of the
partition's list.  ``define`` goes to any node.  A refusal of the table comes
back as one line naming the culprit (an unknown node, a list that disagrees
with the existing definition, the last copy, ...), exit code 2.

Object counts per partition come from the node acting for it
(``partition.objects``: committed objects of the partition's location); they
are ``n/a`` while the data path routes by node (``ha.data = "nodes"``, the
default: objects are not placed in partitions) or no node acts for it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import click

from nonstop.admin.cmd_cluster import Target, open_client, resolve_target, target_options
from nonstop.admin.output import USAGE, fail
from nonstop.errors import Error

OPERATOR_WAIT = 6.0
"""Seconds the node may take to get an operator's entry applied (its own limit is 5 s)."""


@click.group()
def partition() -> None:
    """The partition table: list partitions, define, enable, disable them."""


def read_status(target: Target, timeout: float) -> dict[str, Any]:
    with open_client(target, timeout) as client:
        try:
            status: dict[str, Any] = client.status()
        except (Error, ValueError) as exc:
            fail(str(exc))
    if "partitions" not in status:
        fail(f"node {status.get('name')} runs no partition table (an older node or machine?)")
    return status


def node_addresses(status: dict[str, Any]) -> dict[str, str]:
    """Every node the answering node knows, with its address (up or not)."""
    return {str(n["name"]): str(n["address"]) for n in status.get("nodes", []) if n.get("address")}


def ask_node(address: str, payload: dict[str, Any], timeout: float) -> Any:
    """One request to the node at ``address`` (no failover to another node)."""
    from nonstop.client import Client

    with Client([address], timeout=timeout, rounds=1) as client:
        return client.request(payload)


def acting_by_node(status: dict[str, Any], timeout: float) -> dict[str, list[str]]:
    """Which partitions each node that is up acts for now (best effort: silent nodes omitted)."""
    out: dict[str, list[str]] = {}
    for n in status.get("nodes", []):
        if n.get("state") not in ("Self", "Up") or not n.get("address"):
            continue
        try:
            reply = ask_node(str(n["address"]), {"op": "status"}, timeout)
        except (Error, OSError):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("acting"), list):
            out[str(n["name"])] = [str(p) for p in reply["acting"]]
    return out


def objects_by_partition(
    status: dict[str, Any], acting: dict[str, list[str]], timeout: float
) -> dict[str, int]:
    """Each partition's object count, from a node acting for it (best effort; none while
    the data path routes by node)."""
    addresses = node_addresses(status)
    out: dict[str, int] = {}
    for node, parts in sorted(acting.items()):
        if not parts or node not in addresses:
            continue
        try:
            reply = ask_node(addresses[node], {"op": "partition.objects"}, timeout)
        except (Error, OSError):
            continue
        if not isinstance(reply, dict) or reply.get("routing") != "partitions":
            continue
        for name, count in (reply.get("counts") or {}).items():
            if isinstance(count, int) and name not in out:
                out[str(name)] = count
    return out


def natural_key(name: str) -> list[Any]:
    """``default.2`` before ``default.10``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def partition_rows(
    status: dict[str, Any],
    acting: dict[str, list[str]],
    objects: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The table as ``list --json`` prints it: one object per partition (``objects``:
    None = n/a)."""
    objects = objects or {}
    rows = []
    for part in sorted(status["partitions"], key=lambda p: natural_key(p["name"])):
        rows.append(
            {
                "name": part["name"],
                "location": part.get("location"),
                "policy": part["policy"],
                "state": part["state"],
                "epoch": part["epoch"],
                "active": part["active"],
                "acting_on": sorted(n for n, parts in acting.items() if part["name"] in parts),
                "nodes": part["nodes"],
                "current": part.get("current", []),
                "copying": part.get("copying", []),
                "status": part["status"],
                "objects": objects.get(part["name"]),
            }
        )
    return rows


@partition.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def partition_list(address: str | None, folder: str | None, timeout: float, as_json: bool) -> None:
    """Every partition: state, epoch, active node, current list, status per node."""
    target = resolve_target(address, folder)
    status = read_status(target, timeout)
    acting = acting_by_node(status, timeout)
    rows = partition_rows(status, acting, objects_by_partition(status, acting, timeout))
    if as_json:
        click.echo(
            json.dumps({"node": status.get("name"), "partitions": rows}, indent=2, sort_keys=True)
        )
        return
    header = ("NAME", "STATE", "EPOCH", "ACTIVE", "ACTING", "CURRENT", "COPYING", "OBJECTS")
    table = [header]
    for r in rows:
        current = ",".join(f"{n}{'' if s == 'sync' else '(async)'}" for n, s in r["current"])
        table.append(
            (
                r["name"],
                r["state"],
                str(r["epoch"]),
                r["active"] or "-",
                ",".join(r["acting_on"]) or "-",
                current or "-",
                ",".join(r["copying"]) or "-",
                "n/a" if r["objects"] is None else str(r["objects"]),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    disabled = sorted(
        f"{r['name']}@{n}" for r in rows for n, s in r["status"].items() if s == "LocalDisabled"
    )
    if disabled:
        click.echo(f"disabled (LocalDisabled): {', '.join(disabled)}")
    note = ""
    if any(r["objects"] is None for r in rows):
        note = "; OBJECTS n/a: no node acts for it, or the data path routes by node (ha.data)"
    click.echo(f"({len(rows)} partitions, table as applied on {status.get('name')}{note})")


def parse_node_list(text: str) -> list[list[str]]:
    """``A,B:async`` → ``[["A", "sync"], ["B", "async"]]`` (sync unless told)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, style = item.partition(":")
        out.append([name, style or "sync"])
    return out


def operator_request(address: str, name: str, payload: dict[str, Any], timeout: float) -> Any:
    """Send an operator request to the node ``name`` at ``address``; fail on a refusal."""
    what = f"{payload['do']} {payload['p']} on {name}"
    try:
        reply = ask_node(address, payload, timeout + OPERATOR_WAIT)
    except (Error, OSError) as exc:
        fail(f"{what}: node {name} at {address} does not answer ({exc})")
    if isinstance(reply, dict) and "error" in reply:
        code = USAGE if reply.get("error") == "Rejected" else 1
        fail(f"{what}: {reply.get('message')}", code)
    return reply


@partition.command("define")
@click.argument("name")
@click.option(
    "--nodes", "nodes", required=True, help="Priority-ordered node list: A,B:async (sync default)."
)
@click.option("--policy", default=None, help="Policy name to record (default: operator).")
@target_options
def partition_define(
    name: str,
    nodes: str,
    policy: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """Define partition NAME with a priority-ordered node list (D2); enable it after."""
    target = resolve_target(address, folder)
    status = read_status(target, timeout)
    answering = str(status.get("name"))
    addresses = node_addresses(status)
    payload = {"op": "partition", "do": "define", "p": name, "nodes": parse_node_list(nodes)}
    if policy:
        payload["policy"] = policy
    operator_request(addresses[answering], answering, payload, timeout)
    click.echo(f"defined {name}: {nodes} (enable it with `nonstop partition enable {name}`)")


def _switch(kind: str, name: str, on: tuple[str, ...], target: Target, timeout: float) -> None:
    status = read_status(target, timeout)
    addresses = node_addresses(status)
    part = next((p for p in status["partitions"] if p["name"] == name), None)
    if part is None:
        fail(f"partition {name!r} is not defined (`nonstop partition list`)", USAGE)
    nodes = list(on) or [n for n, _ in part["nodes"]]
    unknown = [n for n in nodes if n not in addresses]
    if unknown:
        fail(f"unknown node(s) {', '.join(unknown)} (nodes: {', '.join(sorted(addresses))})", USAGE)
    for node in nodes:
        reply = operator_request(
            addresses[node], node, {"op": "partition", "do": kind, "p": name}, timeout
        )
        after = reply.get("partition") or {}
        click.echo(
            f"{kind}d {name} on {node}: state {after.get('state')}, epoch {after.get('epoch')}, "
            f"active {after.get('active') or '-'}"
        )


@partition.command("enable")
@click.argument("name")
@click.option("--on", "on", multiple=True, help="Node to enable it on (default: its list).")
@target_options
def partition_enable(
    name: str, on: tuple[str, ...], address: str | None, folder: str | None, timeout: float
) -> None:
    """Enable partition NAME on nodes (D5/D7): a listed node holds it, the first is active."""
    _switch("enable", name, on, resolve_target(address, folder), timeout)


@partition.command("disable")
@click.argument("name")
@click.option("--on", "on", multiple=True, help="Node to disable it on (default: its list).")
@target_options
def partition_disable(
    name: str, on: tuple[str, ...], address: str | None, folder: str | None, timeout: float
) -> None:
    """Disable partition NAME on nodes; refused for the node holding its last in-sync copy."""
    _switch("disable", name, on, resolve_target(address, folder), timeout)
