"""What a node hosting the replication machine reads of its applied partition table.

Both hosts (the simulator's data-path node and the real node, replication.md §10d)
hand the machine the same things after every event: the views of the applied
table (cached per applied index: the table changes only when an entry or a
snapshot is applied), the partitions this node acts for now, and the partition
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
        self._views: tuple[tuple[int, bytes], dict[str, PartitionView]] = ((-1, b""), {})
        self._locations: dict[int, str] = {}

    def views(self) -> dict[str, PartitionView]:
        ha = self.ha
        at, views = self._views
        if at != (ha.applied_index, ha.applied_digest):
            views = {n: view_of(p) for n, p in ha.partition_table.partitions.items()}
            self._views = ((ha.applied_index, ha.applied_digest), views)
        return views

    def acting(self, now: float) -> list[str]:
        """The partitions this node acts for at ``now`` (lease held, active in the table)."""
        ha = self.ha
        return [n for n in ha.partition_table.partitions if ha.acting(now, n)]

    def partition_of(self, ref: bytes) -> str | None:
        """The partition a reference belongs to; None for a node's own location."""
        names = self.ha.partition_table.partitions
        if len(self._locations) != len(names):
            self._locations = {partition_location(n): n for n in names}
        return self._locations.get(Ref(ref).location)


__all__ = ["AppliedTable"]
