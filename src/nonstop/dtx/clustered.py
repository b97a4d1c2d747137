"""One node running both the cluster layer and distributed commit: :class:`DtxClusterNode`.

The decision log of the two-phase-commit machine (:mod:`nonstop.dtx.protocol`,
the pseudo node ``@decisions``) is the cluster's Raft log (dtx.md section 8,
cluster-log.md "Tables of the log"): this machine composes a
:class:`~nonstop.cluster.node.ClusterNode` and a :class:`~nonstop.dtx.protocol.DtxNode`,
registers the commit-decision table (:class:`~nonstop.dtx.log_table.DecisionLogTable`)
with the cluster node, and wires them together inside one node, so neither
needs to know the other.

Routing (one ``Machine`` for the runtime, two inside):

* ``Send(to="@decisions", dl.*)`` from the DtxNode never leaves the node: it is
  handed to :meth:`DecisionLogTable.request` (a log entry proposed at the
  leader, forwarded there by a follower).  The log's answers, produced when
  the entry is applied here, are fed back as ``Received(sender="@decisions")``.
  ``Notify("dl.request", {"payload"})`` and ``Notify("dl.answer", {"payload"})``
  record each request and answer for observers (the simulation's checker and
  crash injector look for proposals and decisions there).
* Messages from peers: a payload whose ``t`` starts with ``dtx.`` goes to the
  DtxNode (its messages are ``dtx.prepare`` ... ``dtx.ack``); everything else
  (the cluster's ``{"k": ...}`` envelopes) to the ClusterNode.
* Timers: ``dtx.*`` to the DtxNode, everything else (``fd:``, ``raft.``,
  ``node:``) to the ClusterNode -- the two name spaces do not overlap.
* ``Persist`` tokens: both components count from 1, so the composition renames
  them: the cluster's ``t`` is ``2t``, the DtxNode's is ``2t + 1``; a
  ``Persisted`` goes back by parity.  Durable keys do not collide either: Raft
  writes ``raft/``, the DtxNode ``dtx/`` and its resource manager its own prefix.
* Client requests: ``{"op": "run"}`` to the DtxNode; ``{"op": "status"}`` is the
  cluster's status with the DtxNode's under ``"dtx"``; anything else to the cluster.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from nonstop.cluster.node import ClusterConfig, ClusterNode
from nonstop.dtx.decisions import LOG
from nonstop.dtx.log_table import DecisionLogTable
from nonstop.dtx.protocol import DtxConfig, DtxNode, ResourceManager
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Notify,
    Persist,
    Persisted,
    Received,
    Reply,
    Send,
    Started,
    TimerFired,
)

ClusterFactory = Callable[[ClusterConfig, random.Random, Mapping[bytes, bytes]], ClusterNode]
"""``(config, rng, recovered)`` → the cluster node (a ``ClusterNode`` or a subclass)."""

DTX_PREFIX = "dtx."
"""Message types and timer names of the DtxNode all start with this."""


class DtxClusterNode:
    """ClusterNode + DtxNode as one sans-I/O machine (module doc)."""

    def __init__(
        self,
        cluster_config: ClusterConfig,
        rm: ResourceManager,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        dtx_config: DtxConfig | None = None,
        node_class: type[DtxNode] = DtxNode,
        cluster_factory: ClusterFactory = ClusterNode,
    ) -> None:
        self.name = cluster_config.name
        # The real node passes the HA cluster node (nonstop.ha.cluster_node) here.
        self.cluster = cluster_factory(cluster_config, rng, recovered)
        self.decisions = DecisionLogTable(self.cluster)
        """The commit-decision table, replicated by the cluster log (``.table`` is its state)."""
        self.cluster.register_table(self.decisions)
        # Its own stream, so that the cluster's draws do not shift the DtxNode's.
        dtx_rng = random.Random(rng.getrandbits(64))
        self.dtx = node_class(self.name, rm, dtx_rng, recovered, dtx_config)
        self._up_version = -1
        self._seen_up: set[str] = set()
        """Peers this node's detector saw Up in this life (only those can be seen dying)."""

    @property
    def rm(self) -> ResourceManager:
        return self.dtx.rm

    @property
    def hears_bare_messages(self) -> bool:
        """As the cluster node it composes: the runtime's ``{"k": "alive"}`` notes (a peer's
        replication, data-plane and ``dtx.*`` messages carry no envelope) go to its detector
        (``cluster/node.py``, Routing)."""
        return bool(getattr(self.cluster, "hears_bare_messages", False))

    def handle(self, event: Event) -> list[Action]:
        """Route one event to the component that owns it (module doc); then tell the
        DtxNode which peers died (:meth:`DtxNode.peers_down`)."""
        out = self._route(event)
        self._watch_peers(event.now)
        return out

    def _watch_peers(self, now: float) -> None:
        """A peer seen Up and now not Up is down for the DtxNode: its branches here stop
        waiting for it.  A peer never seen Up in this life is not (a restarted node's
        recovered branches wait for their coordinator's hello as before)."""
        detector = getattr(self.cluster, "detector", None)
        version = getattr(detector, "up_version", None)
        if detector is None or version is None or version == self._up_version:
            return
        self._up_version = version
        up = set(detector.up_peers())
        self._seen_up |= up
        self.dtx.peers_down(now, frozenset(self._seen_up - up))

    def _route(self, event: Event) -> list[Action]:
        now = event.now
        if isinstance(event, Started):
            return self._from_cluster(now, self.cluster.handle(event)) + self._from_dtx(
                now, self.dtx.handle(event)
            )
        if isinstance(event, TimerFired):
            if event.name.startswith(DTX_PREFIX):
                return self._from_dtx(now, self.dtx.handle(event))
            return self._from_cluster(now, self.cluster.handle(event))
        if isinstance(event, Received):
            payload = event.payload
            kind = payload.get("t") if isinstance(payload, dict) else None
            if isinstance(kind, str) and kind.startswith(DTX_PREFIX):
                return self._from_dtx(now, self.dtx.handle(event))
            return self._from_cluster(now, self.cluster.handle(event))
        if isinstance(event, Persisted):
            inner, owner = divmod(event.token, 2)
            if owner:
                return self._from_dtx(now, self.dtx.handle(Persisted(now, inner)))
            return self._from_cluster(now, self.cluster.handle(Persisted(now, inner)))
        if isinstance(event, ClientRequest):
            payload = event.payload
            op = payload.get("op") if isinstance(payload, dict) else None
            if op == "run":
                return self._from_dtx(now, self.dtx.handle(event))
            if op == "status":
                # Through the cluster node's handle(): a status may depend on the time.
                replies = self.cluster.handle(event)
                out: list[Action] = []
                for action in replies:
                    if isinstance(action, Reply) and action.request_id == event.request_id:
                        action = Reply(
                            action.request_id, {**action.payload, "dtx": self.dtx.status()}
                        )
                    out.append(action)
                return self._from_cluster(now, out)
            return self._from_cluster(now, self.cluster.handle(event))
        return self._from_cluster(now, self.cluster.handle(event))

    def released(self, now: float, gtid: str) -> list[Action]:
        """The composition's hold on ``gtid``'s acknowledgement ended (``DtxNode.released``)."""
        return self._from_dtx(now, self.dtx.released(now, gtid))

    # ------------------------------------------------------------ plumbing
    def _from_cluster(self, now: float, actions: list[Action]) -> list[Action]:
        """Rename the cluster's tokens; feed the decision log's answers to the DtxNode."""
        out: list[Action] = [
            Persist(2 * a.token, a.writes) if isinstance(a, Persist) else a for a in actions
        ]
        for answer in self.decisions.take_answers():
            out.append(Notify("dl.answer", {"payload": answer}))
            out += self._from_dtx(now, self.dtx.handle(Received(now, LOG, answer)))
        return out

    def _from_dtx(self, now: float, actions: list[Action]) -> list[Action]:
        """Rename the DtxNode's tokens; turn its requests to ``@decisions`` into log entries."""
        out: list[Action] = []
        for action in actions:
            if isinstance(action, Persist):
                out.append(Persist(2 * action.token + 1, action.writes))
            elif isinstance(action, Send) and action.to == LOG:
                out.append(Notify("dl.request", {"payload": action.payload}))
                out += self._from_cluster(now, self.decisions.request(now, action.payload))
            else:
                out.append(action)
        return out


def make_factory(
    cluster_config: ClusterConfig,
    make_rm: Callable[[Mapping[bytes, bytes]], ResourceManager],
    dtx_config: DtxConfig | None = None,
    node_class: type[DtxNode] = DtxNode,
) -> Callable[[random.Random, Mapping[bytes, bytes]], Any]:
    """A simulator/runtime factory ``(rng, recovered) -> DtxClusterNode``."""

    def factory(rng: random.Random, recovered: Mapping[bytes, bytes]) -> DtxClusterNode:
        return DtxClusterNode(
            cluster_config, make_rm(recovered), rng, recovered, dtx_config, node_class
        )

    return factory


__all__ = ["DTX_PREFIX", "DtxClusterNode", "make_factory"]
