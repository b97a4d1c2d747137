"""What a node hosting the replication machine reads of its applied partition table.

Both hosts (the simulator's data-path node and the real node, replication.md §10d)
hand the machine the same things after every event: the views of the applied
table (cached per ``table_version``: it counts every applied change of the table
and every snapshot installed), the partitions this node acts for now, and the partition
of an object reference (its location code names it).
"""

from __future__ import annotations

from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.partition_table import partition_location
from nonstop.model.ref import Ref
from nonstop.replication.view import PartitionView, view_of


class AppliedTable:
    """A node's applied partition table, as the replication host reads it (module doc)."""

    def __init__(self, ha: HaClusterNode) -> None:
        self.ha = ha
        self._views: tuple[int, dict[str, PartitionView]] = (-1, {})
        self._locations: dict[int, str] = {}

    def views(self) -> dict[str, PartitionView]:
        # Keyed by the table's own version, not the cluster log's applied index: every
        # transfer's decision entry moves the index, and a new mapping here makes the
        # machine look at every stream again (its ``fresh``).
        ha = self.ha
        at, views = self._views
        if at != ha.table_version:
            views = {n: view_of(p) for n, p in ha.partition_table.partitions.items()}
            self._views = (ha.table_version, views)
        return views

    def acting(self, now: float) -> list[str]:
        """The partitions this node acts for at ``now`` (lease held, active in the table)."""
        ha, me = self.ha, self.ha.name
        # Only a partition this node is active for can be acted for: the lease check (the
        # costly part, after every event) is asked for those alone.
        return [
            n
            for n, p in ha.partition_table.partitions.items()
            if p.active == me and ha.acting(now, n)
        ]

    def partition_of(self, ref: bytes) -> str | None:
        """The partition a reference belongs to; None for a node's own location."""
        names = self.ha.partition_table.partitions
        if len(self._locations) != len(names):
            self._locations = {partition_location(n): n for n in names}
        return self._locations.get(Ref(ref).location)


__all__ = ["AppliedTable"]
