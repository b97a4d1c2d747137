"""The data-path scenario routed by partition (``ScenarioConfig.partitions``; ha.md "Routing
by partition (as built)").

Every node runs the HA cluster node (:class:`~nonstop.ha.cluster_node.HaClusterNode`,
as real nodes do) with two static partitions per node and one copy each
(replicas = 0: sync replication of the data is not built yet, so a partition's
only holder going down makes it Unavailable until it returns).  Accounts and
transfer records are placed by the consistent hash of their unique key; the
initial accounts are loaded into their partition's holder.

Besides the scenario's own checks, one invariant of the routing itself:

* **ack-acting**: a node answers a peer's branch op fenced by ``(P, e)``
  without an error only if, at that instant, it acts for ``P`` (its cluster
  node's ``acting(now, P)``: lease held, ha.md §8) and its applied table has
  ``P`` at epoch ``e``.  Within one simulator step (one instant) the node may
  answer and then apply a change (a table entry, a quorum change): acting at the
  start of the step or at its end counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from nonstop.dataplane.placement import routing_key
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.failover import PromoterConfig
from nonstop.ha.lease import LeaseConfig
from nonstop.ha.mapper import ConsistentHashMapper, map_object
from nonstop.ha.partition_table import partition_location
from nonstop.ha.policies import SYNC, PartitionDef
from nonstop.model.ref import Ref
from nonstop.runtime.interface import Action, Event, NodeId, Received, Send
from nonstop.sim.core import Simulation
from nonstop.sim.scenarios.bank_types import ACCOUNT, TRANSFER

PARTITIONS_PER_NODE = 2


class SimPlacement:
    """Accounts by number, transfers by id: the consistent hash over the partitions."""

    UNIQUE = {ACCOUNT: "number", TRANSFER: "tid"}

    def __init__(self, partitions: Sequence[str]) -> None:
        self.partitions = list(partitions)
        self.mapper = ConsistentHashMapper()

    def partition_for(self, type_name: str, key: bytes | None) -> str:
        return map_object(self.mapper, type_name, key, self.partitions)

    def unique_field(self, type_name: str) -> str | None:
        return self.UNIQUE.get(type_name)


class PartitionRouting:
    """The layout, placement and HA cluster node of a partitioned run (module doc)."""

    def __init__(self, names: Sequence[NodeId], replicas: int = 0) -> None:
        n = len(names)
        self.owner = {f"P{j}": names[j % n] for j in range(PARTITIONS_PER_NODE * n)}
        # With replicas, P's copies are its owner's successors: both partitions of a node
        # have the same replicas (a one-node commit's records travel together).
        self.holders = {
            p: tuple(names[(names.index(node) + k) % n] for k in range(min(replicas, n - 1) + 1))
            for p, node in self.owner.items()
        }
        self.layout = [
            PartitionDef(p, tuple((node, SYNC) for node in nodes), "static")
            for p, nodes in self.holders.items()
        ]
        self.placement = SimPlacement(list(self.owner))
        self.cluster_factory: Callable[..., HaClusterNode] = functools.partial(
            HaClusterNode,
            layout=self.layout,
            promoter=PromoterConfig(retry=0.3),
            lease=LeaseConfig(0.6, 0.0),
        )

    def partition_of_account(self, number: int) -> str:
        return self.placement.partition_for(ACCOUNT, routing_key(number))

    def node_of_account(self, number: int) -> NodeId:
        return self.owner[self.partition_of_account(number)]

    def account_ref(self, number: int) -> bytes:
        """An initial account, as if loaded before the run (epoch 0: creates come later)."""
        return Ref.make(partition_location(self.partition_of_account(number)), 0, number).raw

    def table_observer(
        self, fail: Callable[[str, str], None]
    ) -> Callable[[Simulation, NodeId, Event, list[Action]], None]:
        """``table-told``: after every step of a node, its data plane routes by the partition
        table its cluster node applied (each partition's active node and epoch) -- also
        after the table came in a snapshot, which is no ``pt.changed`` (a node that caught
        up that way kept refusing ``NotActive`` for partitions it had not seen)."""

        def observe(sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
            machine = sim.machine(node)
            ha = getattr(getattr(machine, "node", None), "cluster", None)
            plane = getattr(machine, "dataplane", None)
            if not isinstance(ha, HaClusterNode) or plane is None:
                return
            applied = {n: (p.active, p.epoch) for n, p in ha.partition_table.partitions.items()}
            told = {n: (p.active, p.epoch) for n, p in plane.view.partitions.items()}
            if told != applied:
                wrong = sorted(
                    n for n in applied.keys() | told.keys() if told.get(n) != applied.get(n)
                )
                fail(
                    "table-told",
                    f"{node}'s data plane routes by another table than it applied: "
                    + ", ".join(f"{n} {told.get(n)} != {applied.get(n)}" for n in wrong[:3]),
                )

        return observe

    def ack_observer(
        self, fail: Callable[[str, str], None]
    ) -> Callable[[Simulation, NodeId, Event, list[Action]], None]:
        """The ack-acting check (module doc) as a simulator observer."""
        fenced: dict[tuple[NodeId, str, Any], list[Any]] = {}

        def observe(sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
            if isinstance(event, Received) and isinstance(event.payload, dict):
                msg = event.payload
                if msg.get("t") == "data.req" and msg.get("pe"):
                    fenced[(node, event.sender, msg.get("id"))] = msg["pe"]
            for action in actions:
                if not isinstance(action, Send) or not isinstance(action.payload, dict):
                    continue
                rep = action.payload
                if rep.get("t") != "data.rep":
                    continue
                pe = fenced.pop((node, action.to, rep.get("id")), None)
                body = rep.get("p")
                if pe is None or not isinstance(body, dict) or "error" in body:
                    continue
                machine = sim.machine(node)
                ha = getattr(getattr(machine, "node", None), "cluster", None)
                if not isinstance(ha, HaClusterNode):
                    continue
                before = getattr(machine, "acting_at_start", {})
                for name, epoch in pe:
                    part = ha.partition_table.get(name)
                    applied = None if part is None else part.epoch
                    # Acting at the instant of the answer: before the step's own changes
                    # (an entry or a quorum change handled after the answer, at the same
                    # instant) or after them.
                    was = before.get(name, (False, None)) == (True, epoch)
                    if not was and (applied != epoch or not ha.acting(sim.now, name)):
                        fail(
                            "ack-acting",
                            f"{node} answered {action.to}'s op on {name} at epoch {epoch} "
                            f"(applied {applied}, acting {ha.acting(sim.now, name)})",
                        )

        return observe


__all__ = ["PARTITIONS_PER_NODE", "PartitionRouting", "SimPlacement"]
