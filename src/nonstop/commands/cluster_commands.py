"""``cluster.status`` and ``node.status``: look at a running cluster (permission ``status``)."""

from __future__ import annotations

from typing import Any

from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import NoArguments, command
from nonstop.errors import Error
from nonstop.security.roles import STATUS


def status_rows(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The status's nodes, with no pid for a node that is not up (it would be stale)."""
    rows = []
    for n in status.get("nodes", []):
        state = n.get("state")
        up = state in ("Self", "Up")
        rows.append(
            {
                "name": n.get("name"),
                "address": n.get("address"),
                "state": state,
                "pid": n.get("pid") if up else None,
                **{k: v for k, v in n.items() if k not in ("name", "address", "state", "pid")},
            }
        )
    return rows


def read_status(context: CommandContext) -> tuple[str | None, dict[str, Any]]:
    """The cluster id and the status of the first node that answers."""
    with context.client() as client:
        try:
            cluster_id = client.ping().get("cluster")
            status: dict[str, Any] = client.status()
        except (Error, ValueError) as exc:
            raise CommandError(str(exc), "unavailable") from None
    return cluster_id, status


@command("cluster.status", permission=STATUS)
def cluster_status(context: CommandContext, _: NoArguments) -> dict[str, Any]:
    """The cluster id, view, quorum, leader, partitions, and every node's state."""
    cluster_id, status = read_status(context)
    return {**status, "nodes": status_rows(status), "cluster": cluster_id}


@command("node.status", permission=STATUS)
def node_status(context: CommandContext, _: NoArguments) -> dict[str, Any]:
    """One node's runtime: connections, buffered bytes, refusals of its limits."""
    with context.client() as client:
        try:
            name = client.ping().get("name")
            stats = client.request({"op": "runtime_stats"})
        except (Error, ValueError) as exc:
            raise CommandError(str(exc), "unavailable") from None
    if not isinstance(stats, dict):
        raise CommandError(f"unexpected runtime_stats reply: {stats!r}")
    return {"name": name, **stats}


__all__ = ["cluster_status", "node_status", "read_status", "status_rows"]
