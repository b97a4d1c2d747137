"""Groups of nodes (G3): the configuration type ``nonstop.group``.

A group names a set of nodes, so that one command runs on each of them
(``nonstop.commands.groups``).  It is configuration like any other (F1):
versioned, loaded from a file, activated cluster-wide through the cluster log;
the group is the active version::

    type = "nonstop.group"
    name = "east"
    version = "1"
    nodes = ["A", "B"]
    description = "the nodes of the east data center"

A node may be in any number of groups.  The name ``all`` is reserved: the
built-in group of every member of the cluster.  The audit refuses an empty
list, a bad or repeated node name, and the reserved name.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from nonstop.configuration.types import Change, Veto, config_type

GROUP_TYPE = "nonstop.group"
ALL = "all"
NODE_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class Group(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    nodes: list[str] = Field(max_length=1024)
    description: str = Field(default="", max_length=1024)


group_type = config_type(GROUP_TYPE, Group)


@group_type.audit
def well_formed_group(change: Change) -> None:
    """Deterministic (it runs on every node at the change's place in the log)."""
    if change.kind not in ("load", "activate", "replace"):
        return
    if change.name == ALL:
        raise Veto(f"group name {ALL!r} is reserved: it is every member of the cluster")
    data = change.data
    if not isinstance(data, Group):
        return
    if not data.nodes:
        raise Veto(f"group {change.name}: name at least one node")
    bad = [n for n in data.nodes if not NODE_NAME.match(n)]
    if bad:
        raise Veto(f"group {change.name}: bad node name {bad[0]!r}")
    if len(set(data.nodes)) != len(data.nodes):
        raise Veto(f"group {change.name}: a node is listed twice")


__all__ = ["ALL", "GROUP_TYPE", "Group", "group_type"]
