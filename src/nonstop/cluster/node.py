"""One cluster node: failure detector + cluster log (Raft) + quorum, as one machine.

:class:`ClusterNode` is the machine both runtimes drive for the cluster layer
(the real runtime in ``nonstop.runtime``/``nonstop.net``, the simulator in
``nonstop.sim``).  It composes

* the failure detector (:mod:`nonstop.cluster.failure`, C3/C6),
* the replicated cluster log (:mod:`nonstop.cluster.raft`): membership views,
  leader, terms,
* the quorum policy (:mod:`nonstop.cluster.quorum`, D16) evaluated over the
  current membership and the detector's Up set,
* location discovery (C2): static peers from the configuration, dynamic ones
  from discovery announcements; static wins on conflict.

Construction
------------
``ClusterNode(config: ClusterConfig, rng: random.Random, recovered: Mapping[bytes, bytes])``

``recovered`` is everything the node ever persisted (empty on a fresh node).
The node owns the key prefixes ``b"raft/"`` and ``b"node/"`` of that space.

Routing inside the node
-----------------------
* Messages between nodes are envelopes ``{"k": kind, "en": enabled, "b": body}``
  with kind ``"fd"`` (detector), ``"raft"`` (cluster log) or ``"adm"``
  (forwarded admin requests and their answers).  ``en`` is the sender's
  quorum flag: messages from a Disabled node are not liveness (D16).
* Timers are named ``"fd:<name>"``, ``"raft:<name>"``, ``"node:<name>"``.
* ``Persist`` tokens are the node's own; it maps them back to the component
  that asked, so components choose their tokens freely.

Discovery announcements (C2)
----------------------------
A runtime that hears a discovery announcement (UDP multicast, DNS, a file)
delivers it as ``Received(sender=<name>, payload={"k": "disc", "name": <name>,
"address": <address>})``.  Static configuration entries are never overridden
by announcements.

Admin requests (``ClientRequest.payload``) and their ``Reply.payload``
--------------------------------------------------------------------------
``{"op": "status"}`` (always answered, also while Disabled)::

    {"name": str, "view": int, "members": [str], "quorum": "Active"|"Partial"|"Disabled",
     "leader": str | None, "term": int,
     "nodes": [{"name": str, "address": str | None, "state": NodeState, "member": bool}],
     "warnings": [str]}

``{"op": "join", "name": str, "address": str}``: add a node to the membership
(Raft AddServer).  Performed by the leader; a follower forwards it to the
leader and relays the answer.  Reply ``{"ok": True, "view": int}``.

``{"op": "leave", "name": str}``: remove a node (Raft RemoveServer), same
forwarding.  Reply ``{"ok": True, "view": int}``.

``{"op": "propose", "value": <msgpack value>}``: append an application command
to the cluster log; answered once it is committed *and applied here*:
``{"ok": True, "index": int, "term": int}``.  Only the leader accepts it.

Errors are ``{"error": <name>, "message": str, ...}`` where name is one of
``QuorumLost`` (the node is Disabled: every work request -- join, leave,
propose -- is refused, D16), ``NotLeader`` (with ``"leader": str | None``,
for ``propose``), ``Timeout`` (a forwarded request got no answer),
``Failed`` (the log refused the change), ``BadRequest``.

Notifications (``Notify``)
--------------------------
``node_state`` {peer, old, new} (from the detector), ``quorum`` {state, old},
``view`` {view, members}, ``leader`` {term, leader} (emitted by every node when
it learns a new leader or term; ``leader`` may be None), ``applied`` {index,
term, kind, value} for every cluster log entry applied, in order.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.cluster.failure import (
    DetectorConfig,
    FailureDetector,
    NodeIdentity,
    NodeState,
    location_code,
)
from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    ClientRequest,
    Event,
    Log,
    NodeId,
    Notify,
    Persisted,
    Received,
    Reply,
    Send,
    SetTimer,
    Started,
    TimerFired,
)

QUORUM_ACTIVE = "Active"
QUORUM_PARTIAL = "Partial"
QUORUM_DISABLED = "Disabled"

WORK_OPS = frozenset({"join", "leave", "propose"})
"""Admin/client operations refused while Disabled (D16)."""

FORWARD_TIMEOUT = 2.0
"""Seconds a follower waits for the leader's answer to a forwarded join/leave."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Static configuration of one node's cluster layer.

    ``members`` is the bootstrap membership: every node of a new cluster is
    started with the same list (itself included).  A node started with an empty
    list waits to be added by a ``join`` on the cluster.  ``static_peers`` maps
    names to addresses (C2 static discovery).  ``quorum`` is the D16 policy as a
    dict understood by :mod:`nonstop.cluster.quorum` (default: majority).
    """

    name: NodeId
    address: str
    store_timestamp: int
    members: tuple[NodeId, ...] = ()
    static_peers: Mapping[NodeId, str] = field(default_factory=dict)
    location: int | None = None
    protocol: tuple[int, int] = (1, 1)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    quorum: Mapping[str, Any] = field(default_factory=lambda: {"policy": "majority"})
    raft: Mapping[str, Any] = field(default_factory=dict)
    """Options passed through to the Raft machine (election timeouts, ...)."""

    def identity(self) -> NodeIdentity:
        return NodeIdentity(
            name=self.name,
            address=self.address,
            location=self.location if self.location is not None else location_code(self.name),
            timestamp=self.store_timestamp,
            protocol=self.protocol,
        )


class ClusterNode:
    """The cluster layer of one node as one sans-I/O machine (see module docstring)."""

    def __init__(
        self, config: ClusterConfig, rng: random.Random, recovered: Mapping[bytes, bytes]
    ) -> None:
        self.config = config
        self.name = config.name
        self.rng = rng
        self.detector = FailureDetector(identity=config.identity(), config=config.detector, rng=rng)
        for peer, address in sorted(config.static_peers.items()):
            self.detector.add_peer(peer, address, static=True)
        for member in config.members:
            self.detector.add_peer(member, None)
        # Nothing is known Up before the first hello: start Disabled, so that a
        # restarted node never acts before it has seen its quorum again.
        self.quorum_state = QUORUM_DISABLED
        self.detector.enabled = False
        self.members: list[NodeId] = sorted(config.members)
        self.view = 0
        self.term = 0
        self.leader: NodeId | None = None
        self._now = 0.0
        self._recovered = recovered

    # ------------------------------------------------------------------ api
    @property
    def enabled(self) -> bool:
        return self.quorum_state != QUORUM_DISABLED

    def handle(self, event: Event) -> list[Action]:
        """Route one event to the detector / log / admin handling."""
        self._now = event.now
        if isinstance(event, Started):
            actions = self._after(self._wrap("fd", self.detector.handle(event)))
            if not any(isinstance(a, Notify) and a.kind == "quorum" for a in actions):
                actions.append(Notify("quorum", {"state": self.quorum_state, "old": None}))
            return actions
        if isinstance(event, TimerFired):
            kind, _, name = event.name.partition(":")
            if kind == "fd":
                inner = TimerFired(event.now, name)
                return self._after(self._wrap("fd", self.detector.handle(inner)))
            return [Log("warning", f"unknown timer {event.name!r}")]
        if isinstance(event, Received):
            return self._on_received(event)
        if isinstance(event, ClientRequest):
            return self._on_client(event)
        if isinstance(event, Persisted):
            return []
        return []

    # -------------------------------------------------------------- routing
    def _on_received(self, event: Received) -> list[Action]:
        payload = event.payload
        if not isinstance(payload, dict):
            return [Log("warning", f"malformed message from {event.sender}")]
        kind = payload.get("k")
        if kind == "disc":
            name, address = payload.get("name"), payload.get("address")
            if not isinstance(name, str) or not isinstance(address, str):
                return [Log("warning", "malformed discovery announcement")]
            return self._after(self.detector.add_peer(name, address, static=False))
        sender_enabled = bool(payload.get("en", True))
        actions = self.detector.heard(event.now, event.sender, sender_enabled)
        if kind == "fd":
            actions += self._wrap(
                "fd", self.detector.on_message(event.now, event.sender, payload.get("b"))
            )
        else:
            actions.append(Log("warning", f"unknown message kind {kind!r} from {event.sender}"))
        return self._after(actions)

    def _wrap(self, kind: str, actions: list[Action]) -> list[Action]:
        out: list[Action] = []
        for action in actions:
            if isinstance(action, Send):
                out.append(Send(action.to, {"k": kind, "en": self.enabled, "b": action.payload}))
            else:
                out.append(action)
        return self._prefix_timers(f"{kind}:", out)

    @staticmethod
    def _prefix_timers(prefix: str, actions: list[Action]) -> list[Action]:
        out: list[Action] = []
        for action in actions:
            if isinstance(action, SetTimer):
                out.append(SetTimer(prefix + action.name, action.delay))
            elif isinstance(action, CancelTimer):
                out.append(CancelTimer(prefix + action.name))
            else:
                out.append(action)
        return out

    def _after(self, actions: list[Action]) -> list[Action]:
        """Recompute quorum after anything that may have changed the Up set."""
        return actions + self._update_quorum()

    def _update_quorum(self) -> list[Action]:
        voters = [m for m in self.members if m != self.name]
        if not self.members:
            new = QUORUM_ACTIVE
        else:
            up = set(self.detector.up_peers())
            alive = 1 + sum(1 for m in voters if m in up)
            if 2 * alive <= len(self.members):
                new = QUORUM_DISABLED
            elif alive == len(self.members):
                new = QUORUM_ACTIVE
            else:
                new = QUORUM_PARTIAL
        if new == self.quorum_state:
            return []
        old, self.quorum_state = self.quorum_state, new
        actions: list[Action] = [Notify("quorum", {"state": new, "old": old})]
        actions += self.detector.set_enabled(new != QUORUM_DISABLED)
        return actions

    # ---------------------------------------------------------------- admin
    def _on_client(self, event: ClientRequest) -> list[Action]:
        payload = event.payload
        op = payload.get("op") if isinstance(payload, dict) else None
        if op == "status":
            return [Reply(event.request_id, self.status())]
        if op in WORK_OPS and not self.enabled:
            return [Reply(event.request_id, quorum_lost(self.name))]
        return [Reply(event.request_id, {"error": "BadRequest", "message": f"unknown op {op!r}"})]

    def status(self) -> dict[str, Any]:
        """The ``status`` admin reply (see module docstring)."""
        nodes: list[dict[str, Any]] = [
            {
                "name": self.name,
                "address": self.config.address,
                "state": "Self",
                "member": self.name in self.members,
            }
        ]
        for name, peer in sorted(self.detector.peers.items()):
            nodes.append(
                {
                    "name": name,
                    "address": peer.address,
                    "state": str(peer.state),
                    "member": name in self.members,
                }
            )
        return {
            "name": self.name,
            "view": self.view,
            "members": list(self.members),
            "quorum": self.quorum_state,
            "leader": self.leader,
            "term": self.term,
            "nodes": nodes,
            "warnings": self.detector.warnings(),
        }


def quorum_lost(name: NodeId) -> dict[str, Any]:
    """The reply to a work request on a Disabled node (D16)."""
    return {
        "error": "QuorumLost",
        "message": f"node {name} has no quorum (Disabled) and refuses work; ask another node",
    }


__all__ = ["ClusterConfig", "ClusterNode", "NodeState", "quorum_lost"]
