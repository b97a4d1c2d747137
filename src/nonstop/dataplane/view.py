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
        "by_location",
        "known",
        "locations",
        "members",
        "name",
        "partitions",
        "quorum",
        "route_partitions",
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
        route_partitions: bool = False,
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
        """The partition table as applied here, with this node's acting flags (shared with
        the event, do not change it)."""
        self.route_partitions = route_partitions
        """Routing by partition (``ha.data = "partitions"``): a reference whose location
        names a partition goes to that partition's active node."""
        self.by_location: dict[int, PartitionView] = (
            {pv.location: pv for pv in self.partitions.values()} if route_partitions else {}
        )

    def is_up(self, node: str) -> bool:
        """Up per the failure detector (this node always is)."""
        return node in self.up

    def master(self, ref: bytes) -> str:
        """The node that masters ``ref`` (its location code names it)."""
        return self.route(ref)[0]

    def route(self, ref: bytes) -> tuple[str, PartitionView | None]:
        """The node that serves ``ref`` now, and its partition when it names one.

        Routing by partition: the partition's active node (Unavailable naming the
        partition while it has none that is up -- never NotFound).  A location
        that names a node's own store (objects created before the switch) routes to
        that node, as without partitions.
        """
        location = location_of(ref)
        part = self.by_location.get(location)
        if part is not None:
            return self.active_of(part), part
        node = self.locations.get(location)
        if node is None:
            raise errors.BadArgument(
                f"no node of this cluster has location {location_of(ref):016x}"
            )
        return node, None

    def active_of(self, part: PartitionView) -> str:
        """The node acting for ``part`` as far as this view knows (module doc of
        ``placement``); if none, an error naming the partition.

        This node when it is the active node, also while it does not act (a lease
        lapsed, a promotion or handover waiting out the old lease): the op's fence
        waits that out (``lapse_waits.py``) or refuses it.  ``NotActive``
        (retryable: ``@transactional`` replays it) while the active node is down and
        another holder that is up can be promoted; ``Unavailable`` when nothing here
        can take over (no holder up)."""
        node = part.active
        if node is not None and node in self.up:
            return node
        where = f"partition {part.name} (epoch {part.epoch})"
        others_up = [n for n, _ in part.current if n != node and n in self.up]
        why = "has no active node" if node is None else f"is not served: {node} is not up"
        if others_up:
            raise errors.NotActive(f"{where} {why}; taking over: {', '.join(others_up)}")
        raise errors.Unavailable(f"{where} {why}")

    def acting_nodes(self) -> tuple[dict[str, list[PartitionView]], list[PartitionView]]:
        """Each partition once: node → the partitions it serves now, and the partitions
        no node serves (their active node is down or not acting yet)."""
        by_node: dict[str, list[PartitionView]] = {}
        missing: list[PartitionView] = []
        for name in sorted(self.partitions):
            part = self.partitions[name]
            try:
                node = self.active_of(part)
            except (errors.Unavailable, errors.NotActive):
                missing.append(part)
                continue
            by_node.setdefault(node, []).append(part)
        return by_node, missing

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
