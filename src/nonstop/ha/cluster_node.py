"""A cluster node with the partition table and its proposers: :class:`HaClusterNode`.

The composition the simulator runs (ha.md section 11) and the shape the real
node will take: a :class:`~nonstop.cluster.node.ClusterNode` with the
:class:`~nonstop.ha.partition_table.PartitionTable` registered as a table of
its log, whose ``members``/``live`` are the node's *committed* view (applied in
the same stream as the table's entries, so identical on every node at the same
index).  After every event, if the node has quorum:

* as leader, the :class:`~nonstop.ha.failover.Promoter` proposes failovers and
  drops from the committed view's live set;
* always, the :class:`~nonstop.ha.failover.Restorer` defines/enables this
  node's partitions and reports finished restores where it is active, and the
  :class:`~nonstop.ha.lease.LeaseKeeper` renews this node's lease; it is fed
  every applied ``pt.lease``/``pt.changed`` and answers :meth:`acting` -- may
  this node acknowledge for a partition now (ha.md section 8).

Proposals go through :meth:`ClusterNode.submit` (forwarded to the leader by a
follower).  ``{"op": "status"}`` gains ``"partitions"`` (the table, described).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from nonstop.cluster.node import ClusterConfig, ClusterNode
from nonstop.cluster.raft import ROLE_LEADER
from nonstop.ha.failover import Promoter, PromoterConfig, Restorer
from nonstop.ha.lease import LeaseConfig, LeaseKeeper
from nonstop.ha.partition_table import TABLE, PartitionTable
from nonstop.ha.policies import PartitionDef
from nonstop.runtime.interface import Action, ClientRequest, Event, Notify, Reply


class HaClusterNode(ClusterNode):
    """ClusterNode + partition table + promoter/restorer (module doc)."""

    def __init__(
        self,
        config: ClusterConfig,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        layout: Sequence[PartitionDef] = (),
        promoter: PromoterConfig | None = None,
        lease: LeaseConfig | None = None,
    ) -> None:
        super().__init__(config, rng, recovered)
        self.partition_table = self._make_table()
        self.register_table(self.partition_table)
        self.promoter = Promoter(self.partition_table, promoter)
        self.restorer = Restorer(self.name, self.partition_table, layout, promoter)
        self.leases = self._make_leases(lease)

    def _make_leases(self, config: LeaseConfig | None) -> LeaseKeeper:
        return LeaseKeeper(self.name, self.incarnation, self.partition_table, config)

    def acting(self, now: float, partition: str) -> bool:
        """May this node acknowledge for ``partition`` now (quorum, active, lease)?"""
        return self.leases.acting(now, partition, enabled=self.enabled)

    def _make_table(self) -> PartitionTable:
        return PartitionTable(members=lambda: self.view_members, live=lambda: self.view_live)

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, ClientRequest):
            payload = event.payload
            if isinstance(payload, dict) and payload.get("op") == "status":
                return [Reply(event.request_id, self.status())]
        actions = super().handle(event)
        self._observe(event.now, actions)
        more = self._ha_proposals(event.now)
        self._observe(event.now, more)
        return actions + more

    def _observe(self, now: float, actions: list[Action]) -> None:
        """Feed the lease keeper what was applied here, in log order."""
        for action in actions:
            if not isinstance(action, Notify):
                continue
            if action.kind == "pt.lease":
                self.leases.on_lease(now, action.data)
            elif action.kind == "pt.changed":
                self.leases.on_changed(now, action.data)
            elif action.kind == "applied" and action.data.get("kind") == "snapshot":
                self.leases.on_snapshot(now)

    def _ha_proposals(self, now: float) -> list[Action]:
        if not self.enabled:
            return []  # D16: a node without quorum does not act
        entries = self.restorer.proposals(now, self.view_live)
        renewal = self.leases.renewal(now)
        if renewal is not None:
            entries.append(renewal)
        if self.raft.role == ROLE_LEADER:
            entries += self.promoter.proposals(now, self.view_live)
        actions: list[Action] = []
        for entry in entries:
            actions += self.submit(now, TABLE, entry)
        return actions

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["partitions"] = self.partition_table.describe(self.view_members)
        return status


__all__ = ["HaClusterNode"]
