"""One command on every node of a group (G3): :func:`run_on_group`.

A group is the active version of a ``nonstop.group`` configuration
(``nonstop.configuration.groups``), or ``all``: every member of the cluster.
The command runs once per node of the group, each time against that node alone
(no failover to another node: a node that does not answer is a failed result,
not someone else's answer), several nodes at once; the answer has one result
per node, in the group's order::

    {"group": "east", "command": "node.status", "nodes": ["A", "B"],
     "results": [{"node": "A", "ok": true, "result": {...}},
                 {"node": "B", "ok": false, "kind": "unavailable", "error": "..."}]}

Only commands whose answer depends on the node asked run per node
(``Command.per_node``: the reads, and the application commands); a change of
the cluster (``partition.enable``, ``config.activate``) is made once, through
any node, and is refused with ``--group``.

The CLI reaches each node with the caller's own credential; the admin HTTP API
with its node's bootstrap admin credential, after checking the HTTP user
against the command (so give the nodes the same ``auth.admin_file`` for group
commands over HTTP; a node that refuses it is a failed result saying so).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from nonstop.commands.cluster_commands import read_status
from nonstop.commands.config_commands import ask
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.configuration.groups import ALL, GROUP_TYPE
from nonstop.errors import Error

GROUP_NAME = r"^[A-Za-z0-9_.:-]{1,128}$"
PARALLEL = 8
"""Nodes asked at once (a node that does not answer costs its timeout, not the sum)."""


class UnknownGroup(CommandError):
    """The group named does not exist (HTTP 404, CLI exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "usage")


def group_nodes(context: CommandContext, group: str) -> list[str]:
    """The nodes of ``group``: the active version's list, or every member for ``all``."""
    if group == ALL:
        _, status = read_status(context)
        return [str(m) for m in status.get("members") or []]
    try:
        reply = ask(context, "config.show", {"type": GROUP_TYPE, "name": group})
    except CommandError as exc:
        if exc.kind == "refused":  # "no configuration ... is loaded"
            raise UnknownGroup(
                f"no group {group!r}: load a {GROUP_TYPE} configuration named so "
                f"(`nonstop config load FILE --activate`), or use {ALL!r}"
            ) from None
        raise
    active = [v for v in reply.get("versions", []) if v.get("state") == "Active"]
    if not active:
        raise CommandError(
            f"group {group!r} has no active version (`nonstop config show`)", "usage"
        )
    return [str(n) for n in (active[0].get("data") or {}).get("nodes", [])]


def run_on_group(
    context: CommandContext,
    group: str,
    run: Callable[[CommandContext], Any],
    command: str,
) -> dict[str, Any]:
    """``run(context of one node)`` on every node of ``group`` (module doc)."""
    nodes = group_nodes(context, group)
    _, status = read_status(context)
    addresses = {str(n["name"]): n.get("address") for n in status.get("nodes", [])}

    def one(node: str) -> dict[str, Any]:
        address = addresses.get(node)
        if not address:
            return {"node": node, "ok": False, "kind": "usage", "error": f"{node} is no member"}
        try:
            result = run(replace(context, addresses=[str(address)]))
        except CommandError as exc:
            return {"node": node, "ok": False, "kind": exc.kind, "error": exc.message}
        except (Error, OSError) as exc:
            return {"node": node, "ok": False, "kind": "unavailable", "error": str(exc)}
        return {"node": node, "ok": True, "result": result}

    with ThreadPoolExecutor(max_workers=max(1, min(PARALLEL, len(nodes)))) as pool:
        results = list(pool.map(one, nodes))
    return {"group": group, "command": command, "nodes": nodes, "results": results}


__all__ = ["GROUP_NAME", "UnknownGroup", "group_nodes", "run_on_group"]
