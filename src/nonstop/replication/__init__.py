"""Synchronous replication of partitions, sans-I/O (replication.md, ha.md sections 5-7).

One :class:`~nonstop.replication.machine.ReplicationMachine` per node plays the
active side for the partitions it acts for and the replica side for the others
it holds: records (one-phase commits, prepared records, outcomes, restore
copies) flow from the active node to every in-sync sync replica in one ``rep``
message per node and flush, in the active node's order, fenced by the
partition's epoch.  The composition that drives it (the simulator's
:mod:`nonstop.sim.scenarios.replication`; the real node later) feeds it the
applied partition table and the node's ``acting`` answer after every event.
"""

from nonstop.replication.actions import Completed, Failed, Resolve, Submit
from nonstop.replication.machine import ReplicationConfig, ReplicationMachine
from nonstop.replication.view import PartitionView

__all__ = [
    "Completed",
    "Failed",
    "PartitionView",
    "ReplicationConfig",
    "ReplicationMachine",
    "Resolve",
    "Submit",
]
