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
follower).  ``{"op": "status"}`` gains ``"partitions"`` (the table, described)
and ``"acting"`` (this node's acting partitions at the request's time, with
``"now"``, ``"acting_until"`` and ``"released_at"`` on the node's clock).  ``{"op": "partition"}``
requests are operators' ``define``/``enable``/``disable`` (:mod:`nonstop.ha.operator`).

A handover's old active node tells the new one when it stopped acting
(``{"k": "lease", "b": {"t": "released", ...}}``, ha.md section 8), so the new
one need not wait out a whole lease.

Whenever the set of partitions this node acts for changes -- by an applied
entry, a lease renewal, a lapsed lease or the end of a wait -- the node emits
``Notify("pt.acting", {"acting": [...], "until": t})``; a timer (``ha.acting``)
wakes it when only time would change the answer.  The data plane listens to it
and to ``pt.changed`` (``table_version`` counts the table's changes).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from nonstop.cluster.node import ClusterConfig, ClusterNode
from nonstop.cluster.raft import ROLE_LEADER
from nonstop.ha.failover import Promoter, PromoterConfig, Restorer
from nonstop.ha.lease import LeaseConfig, LeaseKeeper
from nonstop.ha.operator import OP, OperatorRequests, rejected
from nonstop.ha.partition_table import DISABLE, ENABLE, TABLE, PartitionTable
from nonstop.ha.policies import PartitionDef
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    NodeId,
    Notify,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)

ACTING_TIMER = "ha.acting"
"""Wakes the node when its acting set may change by time alone (section 8 waits, leases)."""
LEASE = "lease"
"""Envelope kind of the leases' own messages between nodes (``released``)."""


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
        self.operator = OperatorRequests(
            self.name, self._describe_one, retry=(promoter or PromoterConfig()).retry
        )
        self.table_version = 0
        """+1 whenever the table changed here (an applied change, a snapshot installed)."""
        self.acting_set: frozenset[str] = frozenset()
        """The partitions this node acted for at its last event."""
        self._acting_recheck = float("-inf")
        self._acting_wake = float("inf")
        self._releases: list[Action] = []
        """``released`` messages the lease keeper asked for while observing an event."""

    def _make_leases(self, config: LeaseConfig | None) -> LeaseKeeper:
        return LeaseKeeper(self.name, self.incarnation, self.partition_table, config)

    def acting(self, now: float, partition: str) -> bool:
        """May this node acknowledge for ``partition`` now (quorum, active, lease)?"""
        return self.leases.acting(now, partition, enabled=self.enabled)

    def _make_table(self) -> PartitionTable:
        return PartitionTable(members=lambda: self.view_members, live=lambda: self.view_live)

    def handle(self, event: Event) -> list[Action]:
        now = event.now
        actions: list[Action]
        if isinstance(event, ClientRequest) and isinstance(event.payload, dict):
            op = event.payload.get("op")
            if op == "status":
                return [Reply(event.request_id, self.status_at(now))]
            if op == OP:
                actions = self._operator_request(now, event.request_id, event.payload)
            else:
                actions = super().handle(event)
        elif isinstance(event, TimerFired) and event.name == ACTING_TIMER:
            self._acting_wake = float("inf")
            actions = []
        else:
            actions = super().handle(event)
        touched = self._observe(now, actions)
        more = self._ha_proposals(now)
        touched |= self._observe(now, more)
        out = actions + more + self._releases
        self._releases = []
        out += self.operator.answers(out)
        out += self._operator_due(now)
        out += self._acting_changes(now, touched)
        return out

    def _observe(self, now: float, actions: list[Action]) -> bool:
        """Feed the lease keeper what was applied here, in log order; did acting inputs change?"""
        touched = False
        for action in actions:
            if not isinstance(action, Notify):
                continue
            if action.kind == "pt.lease":
                self.leases.on_lease(now, action.data)
                touched = touched or action.data.get("node") == self.name
            elif action.kind == "pt.changed":
                release = self.leases.on_changed(now, action.data)
                if release is not None:
                    to, body = release
                    self._releases.append(Send(to, self._envelope(LEASE, body)))
                self.table_version += 1
                touched = True
            elif action.kind == "pt.released":
                touched = True
            elif action.kind == "applied" and action.data.get("kind") == "snapshot":
                self.leases.on_snapshot(now)
                self.table_version += 1
                touched = True
            elif action.kind == "quorum":
                touched = True
            elif action.kind == "pt.rejected" and (
                action.data.get("by"),
                action.data.get("kind"),
            ) == (self.name, DISABLE):
                self.restorer.held.discard(str(action.data.get("p")))  # refused: not held off
        return touched

    def _on_other_kind(self, now: float, sender: NodeId, kind: Any, body: Any) -> list[Action]:
        if kind != LEASE:
            return super()._on_other_kind(now, sender, kind, body)
        if not self.leases.on_released(now, sender, body):
            return []
        assert isinstance(body, dict)
        return [Notify("pt.released", {"p": body.get("p"), "e": body.get("e"), "from": sender})]

    # ------------------------------------------------------------ acting
    def _acting_changes(self, now: float, touched: bool) -> list[Action]:
        """``pt.acting`` when the acting set changed; the timer for the next change by time."""
        if not touched and now < self._acting_recheck:
            return []
        acting = frozenset(p for p in self.partition_table.partitions if self.acting(now, p))
        self._acting_recheck = self.leases.next_change(now)
        out: list[Action] = []
        if acting != self.acting_set:
            self.acting_set = acting
            out.append(
                Notify("pt.acting", {"acting": sorted(acting), "until": self.leases.held_until})
            )
        # Wake up for a change by time alone only when it could start acting: a lapsing
        # lease is seen at the next event anyway (the detector's timers tick every interval),
        # and the data plane checks ``until`` itself.
        wake = self.leases.next_change(now) if self._may_start_acting() else float("inf")
        if wake != float("inf") and wake < self._acting_wake:
            self._acting_wake = wake
            out.append(SetTimer(ACTING_TIMER, max(0.0, wake - now)))
        return out

    def _may_start_acting(self) -> bool:
        return any(
            part.active == self.name and name not in self.acting_set
            for name, part in self.partition_table.partitions.items()
        )

    def acting_view(self, now: float) -> dict[str, Any]:
        """This node's acting partitions at ``now`` and until when its lease holds (None
        before its first accepted renewal: the status is JSON, which has no -inf)."""
        acting = sorted(p for p in self.partition_table.partitions if self.acting(now, p))
        until = self.leases.held_until
        return {
            "now": now,
            "acting": acting,
            "acting_until": until if math.isfinite(until) else None,
            # When this node handed a partition over and told the new active node so: its
            # acting for it ended then, before acting_until (ha.md section 8).
            "released_at": dict(self.leases.released_at),
        }

    # ------------------------------------------------------------ operators
    def _operator_request(
        self, now: float, request_id: int, payload: dict[str, Any]
    ) -> list[Action]:
        if not self.enabled:
            return [Reply(request_id, rejected(f"node {self.name} has no quorum (Disabled)"))]
        entry, refusal = self.operator.start(now, request_id, payload)
        if refusal is not None:
            return [refusal]
        assert entry is not None
        name = str(payload.get("p"))
        if payload.get("do") == DISABLE:
            self.restorer.held.add(name)  # the operator's word stands until they enable again
        elif payload.get("do") == ENABLE:
            self.restorer.held.discard(name)
        return self.submit(now, TABLE, entry)

    def _operator_due(self, now: float) -> list[Action]:
        if not len(self.operator):
            return []
        resend, replies = self.operator.due(now)
        out: list[Action] = list(replies)
        for entry in resend:
            out += self.submit(now, TABLE, entry)
        return out

    def _describe_one(self, name: str) -> dict[str, Any] | None:
        part = self.partition_table.get(name)
        if part is None:
            return None
        return next(iter(self.partition_table.describe(self.view_members, only=name)), None)

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
        partitions = self.partition_table.describe(self.view_members)
        if not self.enabled:
            # D16: without quorum this node makes its partitions Unavailable (it acts for
            # none); the state the table last had here stays visible as ``table_state``.
            for part in partitions:
                part["table_state"] = part["state"]
                part["state"] = self.partition_table.local_state(part["name"], enabled=False)
        status["partitions"] = partitions
        # What this node's configuration defines (the restorer proposes each until the
        # table has it): a partition missing from the table is not served yet.
        status["layout"] = [p.name for p in self.restorer.layout]
        return status

    def status_at(self, now: float) -> dict[str, Any]:
        """:meth:`status` plus what this node acts for at ``now`` (module doc)."""
        return {**self.status(), **self.acting_view(now)}


__all__ = ["HaClusterNode"]
