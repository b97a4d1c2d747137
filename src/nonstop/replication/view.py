"""The slice of the applied partition table the replication machine works from.

The machine never reads the table itself (``nonstop.ha`` is the layer below
and owns it): the composition hands it, after every event, one
:class:`PartitionView` per partition built from the table as applied on this
node (:func:`view_of`) plus the set of partitions this node *acts* for (ha.md
section 8: quorum, active, lease held, previous lease waited out).
"""

from __future__ import annotations

from dataclasses import dataclass

from nonstop.ha.partition_table import Partition
from nonstop.ha.policies import SYNC
from nonstop.runtime.interface import NodeId


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition at one epoch: who is active, who must hold every acknowledged record."""

    name: str
    epoch: int
    active: NodeId | None
    current: tuple[NodeId, ...]
    copying: tuple[NodeId, ...] = ()
    sync: tuple[NodeId, ...] = ()
    """Members of ``current`` with the ``sync`` style (in sync or copying)."""
    outranking: tuple[NodeId, ...] = ()
    """Copying nodes that rank before the active node: ``restored`` of one of them hands the
    partition over to it (D9), so the active node drains first (replication.md §10e)."""

    def in_sync_replicas(self) -> tuple[NodeId, ...]:
        """The replicas whose acknowledgement every record needs (I3): in-sync sync members."""
        return tuple(
            n for n in self.current if n != self.active and n in self.sync and n not in self.copying
        )

    def targets(self) -> tuple[NodeId, ...]:
        """Where the active node streams records: in-sync sync replicas and copying sync nodes."""
        return tuple(n for n in self.current if n != self.active and n in self.sync)

    def holds(self, node: NodeId) -> bool:
        return node in self.current


def view_of(part: Partition) -> PartitionView:
    """The view of one applied table record."""
    names = part.names()
    active = part.active
    outranking: tuple[NodeId, ...] = ()
    if active in names:
        rank = names.index(active)
        outranking = tuple(n for n in part.copying if n in names and names.index(n) < rank)
    return PartitionView(
        name=part.name,
        epoch=part.epoch,
        active=part.active,
        current=tuple(part.current),
        copying=tuple(part.copying),
        sync=tuple(n for n in part.current if part.style(n) == SYNC),
        outranking=outranking,
    )


__all__ = ["PartitionView", "view_of"]
