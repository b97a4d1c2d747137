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
from nonstop.model.ref import LOCATION_BYTES, REF_SIZE, location_prefix
from nonstop.replication.view import PartitionView, view_of


class AppliedTable:
    """A node's applied partition table, as the replication host reads it (module doc)."""

    def __init__(self, ha: HaClusterNode) -> None:
        self.ha = ha
        self._views: tuple[int, dict[str, PartitionView]] = (-1, {})
        self._locations: dict[bytes, str] = {}
        self._acting: tuple[tuple[int, float, bool], float, float, list[str]] | None = None
        """(inputs, computed at, valid until, answer) of the last :meth:`acting`."""

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
        # The answer depends on the table (``table_version``), the lease held (``held_until``),
        # quorum (``enabled``), the waits for a previous active node (changed only with the
        # table) and the time; for the same inputs it changes by time alone only at
        # ``next_change``: until then the last answer stands (asked after every event).
        ha = self.ha
        leases = ha.leases
        key = (ha.table_version, leases.held_until, ha.enabled)
        cached = self._acting
        if cached is not None and cached[0] == key and cached[1] <= now < cached[2]:
            return list(cached[3])
        me = ha.name
        # Only a partition this node is active for can be acted for: the lease check is
        # asked for those alone.
        acting = [
            n
            for n, p in ha.partition_table.partitions.items()
            if p.active == me and ha.acting(now, n)
        ]
        self._acting = (key, now, leases.next_change(now), acting)
        return list(acting)

    def partition_of(self, ref: bytes) -> str | None:
        """The partition a reference belongs to; None for a node's own location."""
        names = self.ha.partition_table.partitions
        if len(self._locations) != len(names):
            # Keyed by the references' 8-byte location prefix: a slice and a dict lookup
            # per record (a 200,000-row swap asks for each of its records on the loop).
            self._locations = {location_prefix(partition_location(n)): n for n in names}
        if len(ref) != REF_SIZE:
            raise ValueError(f"a reference is {REF_SIZE} bytes, got {len(ref)}")
        return self._locations.get(bytes(ref[:LOCATION_BYTES]))


__all__ = ["AppliedTable"]
