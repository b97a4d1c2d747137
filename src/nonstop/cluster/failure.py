"""Failure detection and remote node states (C1, C3, C6), as a sans-I/O machine.

The seed (000 ch. 6, "Detecting failed nodes") sends keep-alive requests every
``keepAliveSendIntervalSeconds``; a peer that does not answer within
``nonResponseTimeoutSeconds`` gets one connection re-attempt "to transparently
handle transient network connectivity failures without reporting a false node
down event", and only then is marked Down.  We keep exactly that shape, with
defaults tuned for a LAN cluster: a keep-alive every 0.1 s, a peer silent for
0.4 s gets one :class:`Reconnect` and one more interval of grace, so a dead node
is declared Down after about 0.5-0.6 s.

Any message from a peer counts as a sign of life (a busy peer whose keep-alive
replies queue behind bulk traffic is not dead) -- *unless the peer says it is
Disabled* and we are not.  Messages without an envelope (replication records,
data-plane ops: :meth:`FailureDetector.heard_bare`) carry no flag; the flag of
the peer's last envelope stands in for theirs.  A node that lost quorum (D16)
"stops answering keep-alives so that remote nodes detect this node as
unavailable"; since it still has to listen
(that is how it finds its peers again and regains quorum), every message a
node sends carries its enabled flag and messages from a Disabled sender are
not liveness.  The composition (:mod:`nonstop.cluster.node`) puts that flag on
its envelope and tells the detector about every message it receives.

Remote node states are the seed's Table 6.1 (:class:`NodeState`).  Identity
checks happen on the *hello* every node sends when it (re)connects: name,
address, location code, store timestamp and the protocol version range it
speaks.  A peer announcing our (or another live peer's) location code is
``DuplicateLocation``; the same for the store timestamp is
``DuplicateTimestamp``; a protocol range that does not overlap ours is
``UnsupportedProtocol``.  In those states no communication happens with the
peer "until the error is corrected": a later hello with a sound identity
(the operator fixed the configuration and restarted it) is accepted again.

A hello also lists the addresses its sender knows (``peers``): a node learns
the address of a member it has never been configured with from any peer that
has (dynamic discovery by gossip, C2); a gossiped address never replaces one
the node already has, so static configuration wins.

Node up/down *notifiers* are run by the runtimes, not by this machine (a
notifier is application code: it may block, it runs in a transaction).  The
machine walks through ``InUpNotifier``/``InDownNotifier`` and emits a
``Notify("node_state", {"peer", "old", "new"})`` for every change;
:class:`NotifierRegistry` turns that stream into serialized per-peer notifier
calls, and calls a newly installed notifier for every peer already Up.

Wire messages (all dicts, field ``t``)::

    {"t": "hello", "id": {identity}, "en": bool, "ack": bool, "peers": {name: address}}
    {"t": "ka", "n": seq, "en": bool}       keep-alive request
    {"t": "kar", "n": seq, "en": True}      keep-alive reply (never sent while Disabled)
"""

from __future__ import annotations

import enum
import random
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.runtime.interface import (
    Action,
    Event,
    Log,
    NodeId,
    Notify,
    Received,
    Reconnect,
    Send,
    SetTimer,
    Started,
    TimerFired,
)

PROTOCOL_VERSION = 1
"""The cluster protocol version this build speaks natively (E4, C7)."""

TICK_TIMER = "tick"


class NodeState(enum.StrEnum):
    """Remote node states, seed 000 Table 6.1 (C3)."""

    UNDISCOVERED = "Undiscovered"
    DISCOVERED = "Discovered"
    IN_UP_NOTIFIER = "InUpNotifier"
    UP = "Up"
    IN_DOWN_NOTIFIER = "InDownNotifier"
    DOWN = "Down"
    DUPLICATE_LOCATION = "DuplicateLocation"
    DUPLICATE_TIMESTAMP = "DuplicateTimestamp"
    UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"


ERROR_STATES = frozenset(
    {NodeState.DUPLICATE_LOCATION, NodeState.DUPLICATE_TIMESTAMP, NodeState.UNSUPPORTED_PROTOCOL}
)


def location_code(name: str) -> int:
    """The location code derived from a node name by hashing (C1; seed 000 ch. 6).

    CRC-32 of the UTF-8 name: stable across processes and platforms (``hash()`` is
    not), and the same derivation the connection handshake of the real runtime uses.
    """
    return zlib.crc32(name.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What a node announces about itself in its hello (C1)."""

    name: NodeId
    address: str
    location: int
    timestamp: int
    """Store timestamp: assigned when the node's store is first created."""
    protocol: tuple[int, int] = (PROTOCOL_VERSION, PROTOCOL_VERSION)

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "location": self.location,
            "timestamp": self.timestamp,
            "proto": [self.protocol[0], self.protocol[1]],
        }

    @staticmethod
    def from_wire(data: Any) -> NodeIdentity | None:
        """Parse a wire identity; None if it is malformed (bad input is not a bug)."""
        try:
            proto = data["proto"]
            return NodeIdentity(
                name=str(data["name"]),
                address=str(data["address"]),
                location=int(data["location"]),
                timestamp=int(data["timestamp"]),
                protocol=(int(proto[0]), int(proto[1])),
            )
        except (KeyError, TypeError, ValueError, IndexError):
            return None


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """Keep-alive timing (C6).  Defaults detect a dead peer in about 0.5-0.6 s."""

    keepalive_interval: float = 0.1
    non_response_timeout: float = 0.4


@dataclass(slots=True)
class PeerInfo:
    """What the detector knows about one remote node."""

    name: NodeId
    address: str | None = None
    static: bool = False
    state: NodeState = NodeState.UNDISCOVERED
    identity: NodeIdentity | None = None
    last_heard: float = 0.0
    reconnect_at: float | None = None
    protocol: int | None = None
    """Negotiated protocol version, once a hello was accepted."""
    problem: str | None = None
    enabled: bool = True
    """The quorum flag of the peer's last envelope: whether its bare messages (which carry
    none, :meth:`FailureDetector.heard_bare`) count as liveness."""


@dataclass(slots=True)
class FailureDetector:
    """Keep-alives, remote node states and identity checks for one node.

    Driven either directly as a :class:`~nonstop.runtime.interface.Machine`
    (``handle``) or, inside :class:`~nonstop.cluster.node.ClusterNode`, through
    ``handle`` for its own messages plus :meth:`heard` for every other message
    from a peer.
    """

    identity: NodeIdentity
    config: DetectorConfig = field(default_factory=DetectorConfig)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    """The only randomness allowed (machine contract rule 2).  Not drawn from today:
    keep-alives are sent on one fixed tick for all peers, which keeps simulated
    runs cheap; jitter, if ever needed, must come from here."""
    peers: dict[NodeId, PeerInfo] = field(default_factory=dict)
    enabled: bool = True
    _seq: int = 0
    _now: float = 0.0
    up_version: int = 0
    """Bumped whenever the Up set may have changed: the cluster node recomputes its
    quorum once per event, and under load that must not cost a scan of the peers."""
    _up: list[NodeId] | None = None
    _last_tick: float | None = None
    """When the previous tick ran: a tick much later than ``keepalive_interval`` after it
    means this node itself was not running (a blocked event loop, a paused process)."""
    own_stalls: float = 0.0
    """Seconds of this node's own stalls credited to its peers' silence (``_credit_own_stall``)."""

    # ------------------------------------------------------------ peer table
    def add_peer(self, name: NodeId, address: str | None, *, static: bool = False) -> list[Action]:
        """Learn a peer by name and maybe address (C2).  Static addresses win.

        A dynamically discovered address never replaces a static one; a static
        one replaces anything.
        """
        if name == self.identity.name:
            return []
        peer = self.peers.get(name)
        if peer is None:
            peer = self.peers[name] = PeerInfo(name=name)
        if address is not None and (static or not peer.static):
            peer.address = address
            peer.static = peer.static or static
        if peer.state is NodeState.UNDISCOVERED and peer.address is not None:
            return self._set_state(peer, NodeState.DISCOVERED)
        return []

    def remove_peer(self, name: NodeId) -> list[Action]:
        """Forget a peer (it left the cluster); no more keep-alives to it."""
        if self.peers.pop(name, None) is not None:
            self._up_changed()
        return []

    def up_peers(self) -> list[NodeId]:
        """Names of peers currently Up (sorted: callers iterate it deterministically)."""
        if self._up is None:
            self._up = sorted(n for n, p in self.peers.items() if p.state is NodeState.UP)
        return list(self._up)

    def _up_changed(self) -> None:
        self._up = None
        self.up_version += 1

    def state_of(self, name: NodeId) -> NodeState:
        peer = self.peers.get(name)
        return peer.state if peer is not None else NodeState.UNDISCOVERED

    def set_enabled(self, enabled: bool) -> list[Action]:
        """Quorum gained or lost (D16): a Disabled node stops answering keep-alives."""
        if enabled == self.enabled:
            return []
        self.enabled = enabled
        level = "info" if enabled else "warning"
        text = "answering keep-alives again" if enabled else "quorum lost: keep-alives not answered"
        return [Log(level, text)]

    # ------------------------------------------------------------ the machine
    def handle(self, event: Event) -> list[Action]:
        """Consume an event (Started, the tick timer, or a detector message)."""
        self._now = event.now
        if isinstance(event, Started):
            return self._on_start(event.now)
        if isinstance(event, TimerFired):
            if event.name == TICK_TIMER:
                return self._on_tick(event.now)
            return [Log("warning", f"failure detector: unknown timer {event.name!r}")]
        if isinstance(event, Received):
            return self.on_message(event.now, event.sender, event.payload)
        return []

    def _on_start(self, now: float) -> list[Action]:
        actions: list[Action] = [SetTimer(TICK_TIMER, self.config.keepalive_interval)]
        self._last_tick = now
        for name in sorted(self.peers):
            peer = self.peers[name]
            peer.last_heard = now
            if peer.address is not None and peer.state not in ERROR_STATES:
                actions.append(Send(name, self._hello(ack=False)))
        return actions

    def _hello(self, *, ack: bool) -> dict[str, Any]:
        known = {
            name: peer.address
            for name, peer in sorted(self.peers.items())
            if peer.address is not None and peer.state not in ERROR_STATES
        }
        return {
            "t": "hello",
            "id": self.identity.to_wire(),
            "en": self.enabled,
            "ack": ack,
            "peers": known,
        }

    def _credit_own_stall(self, now: float) -> None:
        """Do not count this node's own stall as its peers' silence.

        A tick that comes ``late`` seconds after it was due means this node ran
        nothing meanwhile: its peers' keep-alive answers may be waiting unread in
        its sockets (an event loop may well run its due timers before it reads
        them, as uvloop does).  Judged now, every peer would look silent for the
        stall's length, be sent a :class:`Reconnect` -- which throws away what
        it had sent and this node had not read yet -- and then be declared Down:
        the busy node would take its healthy peers for dead, lose quorum, and
        make its peers see it Down in turn.  So the stall is credited to each
        peer's ``last_heard`` (and to a pending reconnect's start): silence is
        counted only while this node was listening.  A dead peer is still
        declared Down, later by at most the length of this node's stalls; no
        safety rule rests on how soon (leases and epochs fence, ha.md §8).
        """
        previous, self._last_tick = self._last_tick, now
        if previous is None:
            return
        late = now - previous - self.config.keepalive_interval
        if late <= self.config.keepalive_interval / 2:
            return  # an ordinary tick: timer jitter is not a stall
        self.own_stalls += late
        for peer in self.peers.values():
            peer.last_heard = min(now, peer.last_heard + late)
            if peer.reconnect_at is not None:
                peer.reconnect_at = min(now, peer.reconnect_at + late)

    def _on_tick(self, now: float) -> list[Action]:
        actions: list[Action] = [SetTimer(TICK_TIMER, self.config.keepalive_interval)]
        self._credit_own_stall(now)
        self._seq += 1
        timeout = self.config.non_response_timeout
        for name in sorted(self.peers):
            peer = self.peers[name]
            if peer.address is None or peer.state in ERROR_STATES:
                continue
            if peer.state is NodeState.UP:
                silent = now - peer.last_heard
                if silent > timeout and peer.reconnect_at is None:
                    # C6: one reconnect before declaring Down.
                    peer.reconnect_at = now
                    actions.append(Reconnect(name))
                    actions.append(Send(name, self._hello(ack=False)))
                    continue
                if (
                    peer.reconnect_at is not None
                    and silent > timeout
                    and now - peer.reconnect_at >= self.config.keepalive_interval - 1e-9
                ):
                    actions.extend(self._go_down(peer, f"silent for {silent:.3f}s"))
                    actions.append(Send(name, self._hello(ack=False)))
                    continue
                actions.append(Send(name, {"t": "ka", "n": self._seq, "en": self.enabled}))
            else:
                # Not connected (Discovered, Down): keep knocking with a hello.
                actions.append(Send(name, self._hello(ack=False)))
        return actions

    def heard(self, now: float, peer_name: NodeId, sender_enabled: bool) -> list[Action]:
        """Any message from ``peer_name`` arrived: it is alive, unless it is Disabled.

        A Disabled sender still counts for a receiver that is Disabled itself:
        otherwise nodes that start together (all Disabled until they have seen
        a quorum) would ignore each other for ever.  Enabled nodes ignore it,
        which is what makes a node that lost quorum look Down to the rest.
        """
        self._now = now
        peer = self.peers.get(peer_name)
        if peer is None:
            return []
        peer.enabled = sender_enabled
        if not sender_enabled and self.enabled:
            return []
        peer.last_heard = now
        peer.reconnect_at = None
        return []

    def heard_bare(self, now: float, peer_name: NodeId) -> list[Action]:
        """A message without an envelope (replication, data plane) arrived from ``peer_name``.

        It carries no quorum flag, so the flag of the peer's last envelope stands in for
        it: a peer that said it is Disabled stays silent until an envelope says otherwise
        (at most one keep-alive interval after it regains quorum).  Why these count at all:
        on a real connection a peer's keep-alives queue behind its bulk frames (a large
        swap's replication), and a receiver reading those frames is hearing a live peer.
        """
        peer = self.peers.get(peer_name)
        if peer is None:
            return []
        return self.heard(now, peer_name, peer.enabled)

    def on_message(self, now: float, sender: NodeId, payload: Any) -> list[Action]:
        """A detector message (hello / ka / kar) from ``sender``."""
        if not isinstance(payload, dict):
            return [Log("warning", f"failure detector: malformed message from {sender}")]
        kind = payload.get("t")
        sender_enabled = bool(payload.get("en", True))
        if kind == "hello":
            return self._on_hello(now, sender, payload, sender_enabled)
        peer = self.peers.get(sender)
        if peer is None or peer.state in ERROR_STATES:
            # Not (yet) introduced, or refused: ask for a hello by sending ours.
            if peer is None:
                return []
            return []
        actions = self.heard(now, sender, sender_enabled)
        if kind == "ka":
            if peer.state is not NodeState.UP:
                actions.append(Send(sender, self._hello(ack=False)))
            elif self.enabled:
                actions.append(Send(sender, {"t": "kar", "n": payload.get("n"), "en": True}))
        elif kind == "kar":
            pass
        else:
            actions.append(Log("warning", f"failure detector: unknown message {kind!r}"))
        return actions

    def _on_hello(
        self, now: float, sender: NodeId, payload: dict[str, Any], sender_enabled: bool
    ) -> list[Action]:
        ident = NodeIdentity.from_wire(payload.get("id"))
        if ident is None or ident.name != sender:
            return [Log("warning", f"failure detector: bad hello from {sender}")]
        actions: list[Action] = []
        if sender not in self.peers:
            # A node we did not know introduced itself: that is discovery too (C2).
            actions.extend(self.add_peer(sender, ident.address))
        peer = self.peers[sender]
        if peer.address is None:
            actions.extend(self.add_peer(sender, ident.address))
        actions.extend(self._learn_addresses(payload.get("peers")))
        peer.identity = ident
        problem_state, problem = self._check_identity(ident)
        if problem_state is not None:
            peer.problem = problem
            if peer.state is not problem_state:
                was_up = peer.state in (NodeState.UP, NodeState.IN_UP_NOTIFIER)
                if was_up:
                    actions.extend(self._go_down(peer, problem or ""))
                actions.extend(self._set_state(peer, problem_state))
                actions.append(Log("error", f"node {sender}: {problem}"))
            if not payload.get("ack"):
                # Answer so that the other side can report the problem too.
                actions.append(Send(sender, self._hello(ack=True)))
            return actions
        peer.problem = None
        peer.protocol = min(self.identity.protocol[1], ident.protocol[1])
        if not payload.get("ack"):
            actions.append(Send(sender, self._hello(ack=True)))
        if not sender_enabled and self.enabled:
            return actions
        actions.extend(self.heard(now, sender, sender_enabled))
        if peer.state is not NodeState.UP:
            if peer.state in ERROR_STATES:
                actions.extend(self._set_state(peer, NodeState.DISCOVERED))
            actions.extend(self._set_state(peer, NodeState.IN_UP_NOTIFIER))
            actions.extend(self._set_state(peer, NodeState.UP))
        return actions

    def _learn_addresses(self, gossip: Any) -> list[Action]:
        """Addresses a peer knows and we do not: dynamic discovery by gossip (C2).

        Only fills gaps: a name we have no address for, or do not know at all.
        Never replaces an address we have (static configuration always wins).
        """
        if not isinstance(gossip, dict):
            return []
        actions: list[Action] = []
        for name in sorted(k for k in gossip if isinstance(k, str)):
            address = gossip[name]
            if name == self.identity.name or not isinstance(address, str):
                continue
            peer = self.peers.get(name)
            if peer is None or peer.address is None:
                actions.extend(self.add_peer(name, address))
        return actions

    def _check_identity(self, ident: NodeIdentity) -> tuple[NodeState | None, str | None]:
        lo, hi = ident.protocol
        mine_lo, mine_hi = self.identity.protocol
        if hi < mine_lo or lo > mine_hi:
            return (
                NodeState.UNSUPPORTED_PROTOCOL,
                f"speaks protocol {lo}..{hi}, this node {mine_lo}..{mine_hi}",
            )
        others = [self.identity] + [
            p.identity
            for n, p in sorted(self.peers.items())
            if n != ident.name and p.identity is not None and p.state is NodeState.UP
        ]
        for other in others:
            if other.location == ident.location:
                return (
                    NodeState.DUPLICATE_LOCATION,
                    f"location code {ident.location} already used by {other.name}",
                )
        for other in others:
            if other.timestamp == ident.timestamp:
                return (
                    NodeState.DUPLICATE_TIMESTAMP,
                    f"store timestamp {ident.timestamp} already used by {other.name}",
                )
        return None, None

    def _go_down(self, peer: PeerInfo, why: str) -> list[Action]:
        peer.reconnect_at = None
        actions = self._set_state(peer, NodeState.IN_DOWN_NOTIFIER)
        actions.extend(self._set_state(peer, NodeState.DOWN))
        actions.append(Log("warning", f"node {peer.name} is Down: {why}"))
        return actions

    def _set_state(self, peer: PeerInfo, new: NodeState) -> list[Action]:
        old = peer.state
        if old is new:
            return []
        peer.state = new
        if NodeState.UP in (old, new):
            self._up_changed()
        return [Notify("node_state", {"peer": peer.name, "old": str(old), "new": str(new)})]

    # ------------------------------------------------------------ reporting
    def warnings(self) -> list[str]:
        """Identity problems to show an operator (duplicate location/timestamp, protocol)."""
        return [
            f"{name}: {p.state}: {p.problem}"
            for name, p in sorted(self.peers.items())
            if p.state in ERROR_STATES and p.problem
        ]


NotifierCallback = Callable[[NodeId, bool], None]
"""``callback(peer, up)``: ``up`` True when the peer became available, False when it left."""


class NotifierRegistry:
    """Runs node up/down notifiers with the seed's guarantees (C3).

    * Calls are serialized per remote node: an "up" call completes before the
      following "down" call for the same node starts.  Calls are queued and run
      by :meth:`run_pending`, which a runtime calls from its event loop (the real
      runtime in an executor or task, the simulator inline).
    * A notifier installed while nodes are Up is called for each of them.

    Feed it every ``Notify("node_state")`` with :meth:`on_notify`.
    """

    def __init__(self) -> None:
        self._callbacks: list[NotifierCallback] = []
        self._queue: deque[tuple[NotifierCallback, NodeId, bool]] = deque()
        self._up: set[NodeId] = set()
        self._running = False

    def install(self, callback: NotifierCallback) -> None:
        self._callbacks.append(callback)
        for peer in sorted(self._up):
            self._queue.append((callback, peer, True))

    def remove(self, callback: NotifierCallback) -> None:
        self._callbacks = [c for c in self._callbacks if c is not callback]

    def on_notify(self, data: Mapping[str, Any]) -> None:
        peer, new = data["peer"], data["new"]
        if new == NodeState.IN_UP_NOTIFIER and peer not in self._up:
            self._up.add(peer)
            self._queue.extend((cb, peer, True) for cb in self._callbacks)
        elif new == NodeState.IN_DOWN_NOTIFIER and peer in self._up:
            self._up.discard(peer)
            self._queue.extend((cb, peer, False) for cb in self._callbacks)

    def run_pending(self) -> int:
        """Run queued calls in order; returns how many ran.  Re-entrant calls are queued."""
        if self._running:
            return 0
        self._running = True
        ran = 0
        try:
            while self._queue:
                callback, peer, up = self._queue.popleft()
                callback(peer, up)
                ran += 1
        finally:
            self._running = False
        return ran
