"""What the data plane knows of the cluster: members, who is up, quorum, who masters what.

Built from the latest :class:`~nonstop.dataplane.events.ClusterChanged`; pure.
The scope and audit rules of queries and lookups (seed 000: query scope
audits, data-path.md §7) and the master of a reference (the node whose
location code is the reference's first 8 bytes) are answered here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from nonstop import errors
from nonstop.dataplane.events import PartitionView
from nonstop.model.wire import AUDITS, location_of

QUORUM_DISABLED = "Disabled"


class ClusterView:
    """One snapshot of the cluster as this node sees it (replaced on every change)."""

    __slots__ = (
        "known",
        "locations",
        "members",
        "name",
        "partitions",
        "quorum",
        "up",
        "up_members",
    )

    def __init__(
        self,
        name: str,
        members: Iterable[str] = (),
        up: Iterable[str] = (),
        quorum: str = "Active",
        locations: Mapping[int, str] | None = None,
        partitions: Mapping[str, PartitionView] | None = None,
    ) -> None:
        self.name = name
        others = sorted({m for m in members if isinstance(m, str) and m != name})
        self.members: tuple[str, ...] = (name, *others)
        """This node first, then the others in name order."""
        self.up: frozenset[str] = frozenset(up) | {name}
        self.quorum = quorum
        self.locations: dict[int, str] = dict(locations or {})
        self.known: frozenset[str] = frozenset(self.members) | frozenset(self.locations.values())
        """Every node this one knows of (members and peers it has a hello from)."""
        self.up_members = [n for n in self.members if n in self.up]
        """The members that are up, in ``members`` order (do not change it)."""
        self.partitions: Mapping[str, PartitionView] = partitions or {}
        """The partition table as applied here, with this node's acting flags (not used
        for routing yet; shared with the event, do not change it)."""

    def is_up(self, node: str) -> bool:
        """Up per the failure detector (this node always is)."""
        return node in self.up

    def master(self, ref: bytes) -> str:
        """The node that masters ``ref`` (its location code names it)."""
        node = self.locations.get(location_of(ref))
        if node is None:
            raise errors.BadArgument(
                f"no node of this cluster has location {location_of(ref):016x}"
            )
        return node

    def scope_nodes(self, scope: Any) -> list[str]:
        """The nodes a scope names: ``"local"``, ``"cluster"`` (default) or node names."""
        if scope == "local":
            return [self.name]
        if scope == "cluster" or scope is None:
            return list(self.members)
        if isinstance(scope, list) and scope and all(isinstance(n, str) for n in scope):
            unknown = [n for n in scope if n not in self.known]
            if unknown:
                raise errors.BadArgument(f"unknown node(s) in the scope: {', '.join(unknown)}")
            return list(dict.fromkeys(scope))
        raise errors.BadArgument(
            f"scope must be 'local', 'cluster' or a list of node names, not {scope!r:.60}"
        )

    def audited(self, scope: Any, audit: Any) -> list[str]:
        """The nodes a query runs on, after the scope audit (seed 000: query scope audits).

        The list returned may be shared: callers do not change it.
        """
        if (scope == "cluster" or scope is None) and audit == "skip_down":
            return self.up_members  # the common case, without a copy
        if audit not in AUDITS:
            raise errors.BadArgument(f"audit must be one of {', '.join(AUDITS)}, not {audit!r:.40}")
        nodes = self.scope_nodes(scope)
        up = [n for n in nodes if n in self.up]
        if audit == "fail_if_down" and len(up) != len(nodes):
            down = sorted(set(nodes) - set(up))
            raise errors.Unavailable(f"node(s) of the query scope are down: {', '.join(down)}")
        if not up:
            raise errors.Unavailable(f"no node of the query scope is up: {', '.join(nodes)}")
        return up

    def left_out(self, scope: Any, nodes: list[str]) -> list[str]:
        """The nodes of ``scope`` not in ``nodes`` (what an audit skipped), sorted."""
        if nodes is self.up_members and len(nodes) == len(self.members):
            return []
        return sorted(set(self.scope_nodes(scope)) - set(nodes))


__all__ = ["QUORUM_DISABLED", "ClusterView"]
