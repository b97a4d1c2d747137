"""The replication scenario's node: HA cluster node + replication machine + a tiny data service.

:class:`ReplicatedNode` is an :class:`~nonstop.ha.cluster_node.HaClusterNode`
(cluster log, partition table, promoter, restorer, leases) that also runs

* the :class:`~nonstop.replication.machine.ReplicationMachine` -- its
  ``rep.*`` messages and timers go there, and after every event it gets the
  applied table and this node's acting set (``on_table``); its ``Submit``
  actions become partition-table entries, its ``Resolve`` actions decision-log
  lookups (and an ``abort`` proposal when nothing is decided); the restorer
  proposes ``restored`` only once the machine's copy to the node is done;
* the decision table of distributed commit (:class:`~nonstop.dtx.log_table.
  DecisionLogTable`) as a table of the same cluster log;
* a small data service for the simulated clients (the data plane's part in
  production): ``append`` (one-phase, exactly once per request id), ``prepare``
  / ``outcome`` (a branch of a two-partition transaction) and ``decide`` (the
  coordinating client's decision, into the decision log).  Keys map to
  partitions by :func:`partition_of`; a key named in a prepared record is
  locked (``Locked``) until its outcome.  Objects are lists (list-append).

``Persist`` tokens: the cluster's ``t`` becomes ``2t``, the machine's ``2t+1``.

The broken variant ``local_promotion`` (a node that makes itself active
without a log entry when its table's active node is not live) is a subclass
here: :class:`LocalPromotionNode`.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from nonstop.cluster.node import ClusterConfig
from nonstop.dtx.decisions import DECIDED, LOOKUP, PROPOSE, UNKNOWN, parse_gtid
from nonstop.dtx.log_table import DecisionLogTable
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.failover import PromoterConfig
from nonstop.ha.lease import LeaseConfig
from nonstop.ha.partition_table import TABLE
from nonstop.ha.policies import PartitionDef
from nonstop.replication import (
    Completed,
    Failed,
    PartitionView,
    ReplicationConfig,
    ReplicationMachine,
    Resolve,
    Submit,
)
from nonstop.replication.applied_table import AppliedTable
from nonstop.replication.machine import PREFIX
from nonstop.replication.records import OUTCOME_ABORT, OUTCOME_COMMIT, PREPARE
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Persist,
    Persisted,
    Received,
    Reply,
    TimerFired,
)

CLIENT_OPS = ("append", "prepare", "outcome", "decide")
REQUEST_KEY = "r:"
"""Prefix of the request-id record an append or a branch writes with its object (H2)."""


def partition_of(key: str, partitions: Sequence[str]) -> str:
    """The partition of ``key`` (a stable hash; the same on every node and in the checker)."""
    names = sorted(partitions)
    return names[zlib.crc32(key.encode()) % len(names)]


class ReplicatedNode(HaClusterNode):
    """HA cluster node + replication + decision table + data service (module doc)."""

    def __init__(
        self,
        config: ClusterConfig,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        layout: Sequence[PartitionDef],
        promoter: PromoterConfig,
        lease: LeaseConfig,
        replication: ReplicationConfig,
    ) -> None:
        super().__init__(config, rng, recovered, layout, promoter, lease)
        self.decisions = DecisionLogTable(self)
        self.register_table(self.decisions)
        self.partition_names = sorted(p.name for p in layout)
        self.replication = ReplicationMachine(
            self.name, random.Random(rng.getrandbits(64)), recovered, replication
        )
        self.restorer.copy_done = self.replication.copy_done
        self._table = AppliedTable(self)
        self._waiting_decision: dict[str, list[int]] = {}
        self._resolving: dict[str, str] = {}

    # ------------------------------------------------------------ routing
    def handle(self, event: Event) -> list[Action]:
        now = event.now
        rep = self.replication
        if _is_rep_event(event):
            actions = self._from_rep(now, rep.handle(event))
        elif isinstance(event, Persisted):
            inner, owner = divmod(event.token, 2)
            if owner:
                actions = self._from_rep(now, rep.handle(Persisted(now, inner)))
            else:
                actions = self._from_cluster(super().handle(Persisted(now, inner)))
        elif isinstance(event, ClientRequest) and _client_op(event.payload) in CLIENT_OPS:
            actions = self._client(now, event.request_id, event.payload)
        else:
            actions = self._from_cluster(super().handle(event))
        actions += self._decision_answers(now)
        return actions + self._from_rep(
            now, rep.on_table(now, self.rep_views(), self.acting_now(now))
        )

    def rep_views(self) -> dict[str, PartitionView]:
        return self._table.views()

    def acting_now(self, now: float) -> list[str]:
        return [n for n in self.partition_table.partitions if self.acting(now, n)]

    def _from_cluster(self, actions: list[Action]) -> list[Action]:
        return [Persist(2 * a.token, a.writes) if isinstance(a, Persist) else a for a in actions]

    def _from_rep(self, now: float, actions: list[Any]) -> list[Action]:
        out: list[Action] = []
        for action in actions:
            if isinstance(action, Persist):
                out.append(Persist(2 * action.token + 1, action.writes))
            elif isinstance(action, Submit):
                out += self._from_cluster(self.submit(now, TABLE, dict(action.entry)))
            elif isinstance(action, Resolve):
                self._resolving[action.txid] = action.partition
                out += self._from_cluster(
                    self.decisions.request(now, {"t": LOOKUP, "g": action.txid})
                )
            elif isinstance(action, Completed | Failed):
                out += self._answer_client(action)
            else:
                out.append(action)
        return out

    def _decision_answers(self, now: float) -> list[Action]:
        """The decision log's answers to this node: resolutions and clients' decisions."""
        out: list[Action] = []
        for answer in self.decisions.take_answers():
            txid, kind = answer.get("g"), answer.get("t")
            if not isinstance(txid, str):
                continue
            if kind == DECIDED:
                for rid in self._waiting_decision.pop(txid, []):
                    out.append(Reply(rid, {"ok": True, "o": answer["o"]}))
                partition = self._resolving.pop(txid, None)
                if partition is not None:
                    out += self._from_rep(
                        now, self.replication.outcome(now, None, partition, txid, answer["o"])
                    )
            elif kind == UNKNOWN and txid in self._resolving:
                # Nothing decided: propose abort; whatever the log holds first is the outcome.
                proposal = {"t": PROPOSE, "g": txid, "o": OUTCOME_ABORT, "n": []}
                out += self._from_cluster(self.decisions.request(now, proposal))
        return out

    # ------------------------------------------------------------ data service
    def _client(self, now: float, rid: int, payload: dict[str, Any]) -> list[Action]:
        op = payload["op"]
        if op == "decide":
            txid, outcome = payload.get("txid"), payload.get("o")
            if parse_gtid(txid) is None or outcome not in (OUTCOME_COMMIT, OUTCOME_ABORT):
                return [Reply(rid, {"error": "BadRequest"})]
            assert isinstance(txid, str)
            self._waiting_decision.setdefault(txid, []).append(rid)
            proposal = {"t": PROPOSE, "g": txid, "o": outcome, "n": []}
            return self._from_cluster(self.decisions.request(now, proposal))
        key = payload.get("k")
        if op == "outcome":
            key = payload.get("p")
            partition = key if key in self.partition_names else None
        else:
            partition = partition_of(key, self.partition_names) if isinstance(key, str) else None
        if partition is None:
            return [Reply(rid, {"error": "BadRequest"})]
        part = self.partition_table.get(partition)
        if part is None or not self.acting(now, partition):
            return [Reply(rid, {"error": "NotActive", "active": part and part.active})]
        rep = self.replication
        ref = ("client", rid)
        if op == "outcome":
            txid, outcome = payload.get("txid"), payload.get("o")
            if not isinstance(txid, str) or outcome not in (OUTCOME_COMMIT, OUTCOME_ABORT):
                return [Reply(rid, {"error": "BadRequest"})]
            return self._from_rep(now, rep.outcome(now, ref, partition, txid, outcome))
        request_id = payload.get("rid")
        if not isinstance(key, str) or not isinstance(request_id, str) or key.startswith("r:"):
            return [Reply(rid, {"error": "BadRequest"})]
        if rep.making(partition):
            # Records of P asked for and not made yet (step_writes): its data does not show
            # them, and this write is computed from it -- retry (a real node computes from
            # its store, under the locks).
            return [Reply(rid, {"error": "Locked"})]
        values = rep.data.values(partition)
        prepared = rep.data.prepared_of(partition)
        # A prepared record that lacks its last part (it came in parts and its sender died)
        # was never voted on: it is not "done before" (it is resolved as abort).
        if REQUEST_KEY + request_id in values or rep.data.whole(partition, request_id):
            # Done before (or in flight): answer once every replica holds what this node holds.
            return self._from_rep(now, rep.noop(now, ref, partition))
        if any(key in writes for txid, writes in prepared.items()):
            return [Reply(rid, {"error": "Locked"})]
        writes = {key: [*values.get(key, []), payload.get("v")], REQUEST_KEY + request_id: True}
        if op == "prepare":
            actions = rep.replicate(now, ref, partition, part.epoch, writes, PREPARE, request_id)
        else:
            actions = rep.replicate(now, ref, partition, part.epoch, writes)
        return self._from_rep(now, actions)

    def _answer_client(self, action: Completed | Failed) -> list[Action]:
        ref = action.ref
        if not (isinstance(ref, tuple) and ref[0] == "client"):
            return []
        if isinstance(action, Completed):
            return [Reply(ref[1], {"ok": True, "p": action.partition, "e": action.epoch})]
        return [Reply(ref[1], {"error": action.error, "active": action.active})]

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["replication"] = self.replication.status()
        return status


class LocalPromotionNode(ReplicatedNode):
    """Broken on purpose: a node whose failure detector lost the partition's active node makes
    itself active for the partition on its own suspicion, without a log entry, and acts."""

    def _self_promoted(self) -> list[str]:
        live = {self.name, *self.detector.up_peers()}
        out = []
        for name, part in self.partition_table.partitions.items():
            if part.active is not None and part.active not in live and self.enabled:
                in_sync = [n for n in part.in_sync() if n != part.active and n in live]
                if in_sync and in_sync[0] == self.name:
                    out.append(name)
        return out

    def rep_views(self) -> dict[str, PartitionView]:
        views = super().rep_views()
        for name in self._self_promoted():
            view = views[name]
            current = tuple(n for n in view.current if n != view.active)
            views[name] = replace(view, active=self.name, current=current)
        return views

    def acting_now(self, now: float) -> list[str]:
        return sorted({*super().acting_now(now), *self._self_promoted()})

    def acting(self, now: float, partition: str) -> bool:
        return super().acting(now, partition) or partition in self._self_promoted()


def _is_rep_event(event: Event) -> bool:
    """A message or timer of the replication machine."""
    if isinstance(event, TimerFired):
        return event.name.startswith(PREFIX)
    if not isinstance(event, Received) or not isinstance(event.payload, dict):
        return False
    kind = event.payload.get("t")
    return isinstance(kind, str) and kind.startswith(PREFIX)


def _client_op(payload: Any) -> Any:
    return payload.get("op") if isinstance(payload, dict) else None


__all__ = ["CLIENT_OPS", "LocalPromotionNode", "ReplicatedNode", "partition_of"]
