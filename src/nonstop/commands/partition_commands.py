"""``partition.list | define | enable | disable``: the partition table (D2-D9).

The table is state of the cluster log (docs/design/ha.md section 2): every node
applies the same entries, so ``list`` reads it from any node that answers, then
asks every node that is up which partitions it *acts* for now (lease held,
ha.md section 8) -- node-local facts the table does not hold.

``enable`` and ``disable`` change a node's own status (D7): the request goes to
that node, which submits the entry itself (the table refuses an entry one node
makes on another's behalf).  Without ``on`` they go to every node of the
partition's list.  ``define`` goes to any node.  A refusal of the table comes
back as a ``refused`` :class:`CommandError` naming the culprit.

Permission ``admin``: the node's router asks the same for the ``partition`` op.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from nonstop.commands.cluster_commands import read_status
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError, ErrorKind
from nonstop.commands.registry import Arguments, NoArguments, command
from nonstop.errors import Error
from nonstop.security.roles import ADMIN_OPS as ADMIN
from nonstop.security.roles import STATUS

OPERATOR_WAIT = 6.0
"""Seconds the node may take to get an operator's entry applied (its own limit is 5 s)."""

PARTITION_NAME = r"^[A-Za-z0-9_.:-]{1,128}$"
NODE_NAME = r"^[A-Za-z0-9_.@-]{1,64}$"


def table_status(context: CommandContext) -> dict[str, Any]:
    _, status = read_status(context)
    if "partitions" not in status:
        raise CommandError(
            f"node {status.get('name')} runs no partition table (an older node or machine?)"
        )
    return status


def node_addresses(status: dict[str, Any]) -> dict[str, str]:
    """Every node the answering node knows, with its address (up or not)."""
    return {str(n["name"]): str(n["address"]) for n in status.get("nodes", []) if n.get("address")}


def acting_by_node(context: CommandContext, status: dict[str, Any]) -> dict[str, list[str]]:
    """Which partitions each node that is up acts for now (best effort: silent nodes omitted)."""
    out: dict[str, list[str]] = {}
    for n in status.get("nodes", []):
        if n.get("state") not in ("Self", "Up") or not n.get("address"):
            continue
        try:
            reply = context.ask_node(str(n["address"]), {"op": "status"})
        except (Error, OSError):
            continue
        if isinstance(reply, dict) and isinstance(reply.get("acting"), list):
            out[str(n["name"])] = [str(p) for p in reply["acting"]]
    return out


def objects_by_partition(
    context: CommandContext, status: dict[str, Any], acting: dict[str, list[str]]
) -> dict[str, int]:
    """Each partition's object count, from a node acting for it (best effort; none while
    the data path routes by node)."""
    addresses = node_addresses(status)
    out: dict[str, int] = {}
    for node, parts in sorted(acting.items()):
        if not parts or node not in addresses:
            continue
        try:
            reply = context.ask_node(addresses[node], {"op": "partition.objects"})
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
    """The table as ``list`` answers it: one object per partition (``objects``: None = n/a)."""
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


@command("partition.list", permission=STATUS)
def partition_list(context: CommandContext, _: NoArguments) -> dict[str, Any]:
    """Every partition: state, epoch, active node, current list, status per node."""
    status = table_status(context)
    acting = acting_by_node(context, status)
    rows = partition_rows(status, acting, objects_by_partition(context, status, acting))
    return {"node": status.get("name"), "partitions": rows}


def operator_request(
    context: CommandContext, address: str, name: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """Send an operator request to the node ``name`` at ``address``; refuse on its refusal."""
    what = f"{payload['do']} {payload['p']} on {name}"
    try:
        reply = context.ask_node(address, payload, context.timeout + OPERATOR_WAIT)
    except (Error, OSError) as exc:
        raise CommandError(
            f"{what}: node {name} at {address} does not answer ({exc})", "unavailable"
        ) from None
    if isinstance(reply, dict) and "error" in reply:
        kinds: dict[str, ErrorKind] = {"Rejected": "refused", "NotAuthorized": "forbidden"}
        kind = kinds.get(str(reply.get("error")), "failed")
        raise CommandError(f"{what}: {reply.get('message')}", kind)
    return reply if isinstance(reply, dict) else {"reply": reply}


class DefineArguments(Arguments):
    name: str = Field(pattern=PARTITION_NAME, description="Partition name.")
    nodes: str = Field(
        min_length=1,
        max_length=4096,
        description="Priority-ordered node list: A,B:async (sync unless told).",
    )
    policy: str | None = Field(
        default=None, max_length=128, description="Policy name to record (default: operator)."
    )


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


@command(
    "partition.define",
    arguments=DefineArguments,
    permission=ADMIN,
    changes=True,
    positional=("name",),
)
def partition_define(context: CommandContext, args: DefineArguments) -> dict[str, Any]:
    """Define a partition with a priority-ordered node list (D2); enable it after."""
    status = table_status(context)
    answering = str(status.get("name"))
    addresses = node_addresses(status)
    payload: dict[str, Any] = {
        "op": "partition",
        "do": "define",
        "p": args.name,
        "nodes": parse_node_list(args.nodes),
    }
    if args.policy:
        payload["policy"] = args.policy
    operator_request(context, addresses[answering], answering, payload)
    return {"defined": args.name, "nodes": payload["nodes"], "on": answering}


class SwitchArguments(Arguments):
    name: str = Field(pattern=PARTITION_NAME, description="Partition name.")
    on: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Nodes to change it on (default: every node of its list).",
    )


def switch(context: CommandContext, kind: str, args: SwitchArguments) -> dict[str, Any]:
    status = table_status(context)
    addresses = node_addresses(status)
    part = next((p for p in status["partitions"] if p["name"] == args.name), None)
    if part is None:
        raise CommandError(
            f"partition {args.name!r} is not defined (`nonstop partition list`)", "usage"
        )
    nodes = list(args.on) or [n for n, _ in part["nodes"]]
    unknown = [n for n in nodes if n not in addresses]
    if unknown:
        raise CommandError(
            f"unknown node(s) {', '.join(unknown)} (nodes: {', '.join(sorted(addresses))})",
            "usage",
        )
    results = []
    for node in nodes:
        reply = operator_request(
            context, addresses[node], node, {"op": "partition", "do": kind, "p": args.name}
        )
        after = reply.get("partition") or {}
        results.append(
            {
                "node": node,
                "state": after.get("state"),
                "epoch": after.get("epoch"),
                "active": after.get("active"),
            }
        )
    return {"partition": args.name, "done": kind, "results": results}


@command(
    "partition.enable",
    arguments=SwitchArguments,
    permission=ADMIN,
    changes=True,
    positional=("name",),
)
def partition_enable(context: CommandContext, args: SwitchArguments) -> dict[str, Any]:
    """Enable a partition on nodes (D5/D7): a listed node holds it, the first is active."""
    return switch(context, "enable", args)


@command(
    "partition.disable",
    arguments=SwitchArguments,
    permission=ADMIN,
    changes=True,
    positional=("name",),
)
def partition_disable(context: CommandContext, args: SwitchArguments) -> dict[str, Any]:
    """Disable a partition on nodes; refused for the node holding its last in-sync copy."""
    return switch(context, "disable", args)


__all__ = ["node_addresses", "parse_node_list", "partition_rows"]
