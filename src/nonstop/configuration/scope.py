"""Which nodes a configuration version applies to (G3, central configuration per group).

A version applies to every node unless its file (or ``config load --group`` /
``--node``) names the nodes, with the header key ``applies_to``::

    applies_to = "east"          # a group: the active nonstop.group version "east"
    applies_to = ["A", "B"]      # these nodes

The version is still stored cluster-wide (one entry of the cluster log, so a
node that is down gets it when it returns); only the nodes it applies to see
it in their *effective* configuration and tell their notifiers about it.

Plain form (in log entries, snapshots and rows): ``None`` (every node),
``{"group": NAME}`` or ``{"nodes": [NAME, ...]}``.  A group is resolved
against the table's own state at each node, so the set of nodes follows the
group's active version (a function of the log alone: every node agrees).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from nonstop.configuration.groups import ALL, GROUP_TYPE, NODE_NAME

if TYPE_CHECKING:
    from nonstop.configuration.state import ConfigState

HEADER_KEY = "applies_to"
GROUP_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
MAX_NODES = 1024

Scope = dict[str, Any] | None


class BadScope(ValueError):
    """An ``applies_to`` that is neither a group name nor a list of node names (one line)."""


def scope_of(value: Any) -> Scope:
    """The plain scope of an ``applies_to`` value (a string or a list of strings), checked."""
    if value is None:
        return None
    if isinstance(value, str):
        if value == ALL:
            return None
        if not GROUP_NAME.match(value):
            raise BadScope(f"applies_to: bad group name {value!r}")
        return {"group": value}
    if isinstance(value, list):
        if not value or len(value) > MAX_NODES:
            raise BadScope(f"applies_to: name 1 to {MAX_NODES} nodes")
        bad = [n for n in value if not isinstance(n, str) or not NODE_NAME.match(n)]
        if bad:
            raise BadScope(f"applies_to: bad node name {bad[0]!r}")
        if len(set(value)) != len(value):
            raise BadScope("applies_to: a node is listed twice")
        return {"nodes": list(value)}
    raise BadScope(
        f"applies_to is a group name or a list of node names, not {type(value).__name__}"
    )


def checked(plain: Any) -> Scope:
    """A scope read back from a log entry or a snapshot; :class:`BadScope` if malformed."""
    if plain is None:
        return None
    if isinstance(plain, dict) and set(plain) == {"group"}:
        return scope_of(plain["group"])
    if isinstance(plain, dict) and set(plain) == {"nodes"}:
        return scope_of(plain["nodes"])
    raise BadScope(f"applies_to: malformed {plain!r:.60}")


def group_nodes(state: ConfigState, group: str) -> list[str] | None:
    """The nodes of ``group``'s active version in ``state``; None when it has none."""
    active = state.active((GROUP_TYPE, group))
    if active is None:
        return None
    nodes = state.configs[(GROUP_TYPE, group)][active].data.get("nodes")
    return [str(n) for n in nodes] if isinstance(nodes, list) else []


def applies(scope: Scope, state: ConfigState, node: str) -> bool:
    """Whether a version with ``scope`` applies to ``node`` (a group without an active
    version applies to no node)."""
    if scope is None:
        return True
    if "nodes" in scope:
        return node in scope["nodes"]
    return node in (group_nodes(state, str(scope["group"])) or [])


def describe(scope: Scope) -> str:
    """One phrase for messages and tables: ``every node``, ``group east``, ``nodes A, B``."""
    if scope is None:
        return "every node"
    if "group" in scope:
        return f"group {scope['group']}"
    return "nodes " + ", ".join(scope["nodes"])


__all__ = [
    "HEADER_KEY",
    "BadScope",
    "Scope",
    "applies",
    "checked",
    "describe",
    "group_nodes",
    "scope_of",
]
