"""One cluster node: failure detector + cluster log (Raft) + quorum, as one machine.

:class:`ClusterNode` is the machine both runtimes drive for the cluster layer
(the real runtime in ``nonstop.runtime``/``nonstop.net``, the simulator in
``nonstop.sim``).  It composes

* the failure detector (:mod:`nonstop.cluster.failure`, C3/C6),
* the replicated cluster log (:mod:`nonstop.cluster.raft`): membership views,
  leader, terms (D1),
* the quorum policy (:mod:`nonstop.cluster.quorum`, D16) evaluated over the
  log's current voters and the detector's Up set,
* location discovery (C2): static peers from the configuration, dynamic ones
  from discovery announcements and hellos; static wins on conflict.

Construction
------------
``ClusterNode(config: ClusterConfig, rng: random.Random, recovered: Mapping[bytes, bytes])``

``recovered`` is everything the node ever persisted (empty on a fresh node).
Only Raft persists (keys ``b"raft/..."``); the state the node builds on top of
the log is recomputed from it after a restart, never persisted on its own.

Routing inside the node
-----------------------
* Messages between nodes are envelopes ``{"k": kind, "en": enabled, "b": body}``
  with kind ``"fd"`` (detector), ``"raft"`` (cluster log), ``"adm"``
  (forwarded admin requests and their answers) or the name of a registered
  table (a table's request forwarded to the leader, see below).  ``en`` is the sender's
  quorum flag: messages from a Disabled node are not liveness (D16), so the
  rest of the cluster sees a node without quorum as Down.  Only detector
  messages are exchanged with a peer in DuplicateLocation, DuplicateTimestamp
  or UnsupportedProtocol state (C3: no communication until corrected).
* Timers: ``"fd:<name>"`` (detector), ``"raft.*"`` (Raft's own names),
  ``"node:<name>"`` (this class: forwarded request time-outs).
* ``Persist`` tokens come from one counter shared by the components; a
  ``Persisted`` is offered to Raft (which ignores tokens it does not own).

* ``Received(sender, {"k": "alive"})`` (:data:`ALIVE`): the runtime saw a message
  of ``sender`` without an envelope (replication records, data-plane ops, which
  other machines take): liveness only, with the flag of the sender's last
  envelope (``FailureDetector.heard_bare``).

Discovery announcements (C2)
----------------------------
A runtime that hears a discovery announcement (UDP multicast, DNS, a file)
delivers it as ``Received(sender=<name>, payload={"k": "disc", "name": <name>,
"address": <address>})``.  Addresses from the static configuration are never
overridden by announcements.

Admin requests (``ClientRequest.payload``) and their ``Reply.payload``
--------------------------------------------------------------------------
``{"op": "status"}`` is always answered, also while Disabled::

    {"name": str, "view": int, "members": [str], "live": [str],
     "views": [{"id": int, "members": [str], "live": [str]}],
     "quorum": "Active"|"Partial"|"Disabled",
     "leader": str | None, "term": int, "role": str, "commit_index": int,
     "nodes": [{"name": str, "address": str | None, "state": str, "member": bool}],
     "warnings": [str]}

``view``/``members``/``live`` are the latest committed view: its id, the configured
voters, and the members its leader saw Up.  ``views`` lists the last 16 committed
views, oldest first; it is part of the applied state (kept in snapshots), so every
node that applied the same log reports the same list.

``nodes`` lists this node first (state ``"Self"``) then every known peer with its
remote node state (C3: Undiscovered, Discovered, InUpNotifier, Up,
InDownNotifier, Down, DuplicateLocation, DuplicateTimestamp, UnsupportedProtocol).

``{"op": "join", "name": str, "address": str}``: add a node to the membership
(Raft AddServer).  Performed by the leader; any other node forwards it to the
leader it knows and relays the answer.  Answered once the view containing the
node is committed: ``{"ok": True, "view": int, "members": [str]}``.

``{"op": "leave", "name": str}``: remove a node (RemoveServer), same forwarding;
``{"ok": True, "view": int, "members": [str]}`` once committed.

``{"op": "propose", "value": <msgpack value>}``: append an application command
to the cluster log (the work request the simulator drives).  Leader only;
answered once the entry is committed *and applied here*:
``{"ok": True, "index": int, "term": int}``.

Errors are ``{"error": <name>, "message": str, ...}`` where name is one of
``QuorumLost`` (the node is Disabled: every work request -- join, leave,
propose -- is refused, D16), ``NotLeader`` (with ``"leader": str | None``),
``Timeout`` (a forwarded request got no answer in time), ``Failed`` (the log
refused or lost the change), ``Unknown`` (the outcome cannot be known here),
``BadRequest``.

Notifications (``Notify``)
--------------------------
``node_state`` {peer, old, new} (detector), ``quorum`` {state, old},
``leader`` {term, leader}, ``view`` {view_id, members, live}, ``role`` {role, term}
(from Raft), ``proposed`` {index, term} (a work request entered the log), and
``applied`` {index, term, kind, value, digest} for every committed entry this
node applies, in order (``digest`` chains every entry before it, so two nodes
with equal digests at an index applied identical histories up to it).

Tables of the log (:mod:`nonstop.cluster.tables`)
-------------------------------------------------
Applied state above membership and views -- the commit-decision table of
distributed commit (:mod:`nonstop.dtx.log_table`), next the partition table --
plugs in as a :class:`~nonstop.cluster.tables.LogTable` registered with
:meth:`ClusterNode.register_table` before the first event.  The node applies
each ``cmd`` entry tagged with a table's name to that table in log order, puts
every table's state in its snapshots (under the table's name) and restores it
from them, and routes a table's requests: :meth:`ClusterNode.submit` proposes
at the leader or forwards to it.  A table may also serve client ops of its own
(``on_client(now, request_id, payload)``) and set timers of its own: a
``SetTimer("node:tbl:<table>:<rest>", ...)`` comes back as ``on_timer(now, rest)``
(the users table resends a change the leader it went to never applied).  This
package imports no table.

A node that is not (yet) in the cluster log's membership -- a joiner waiting
to be added -- is Disabled: it has no quorum to be part of.

Views on failure
----------------
The leader, while it has quorum, commits a new view (Raft ``propose_view``)
whenever the set of members its detector sees Up differs from the committed
view's ``live`` set: checked once per event, at most one in flight (the next
follows its commit).  A follower whose detector marks the leader Down tells Raft
(``leader_unreachable``) so that the survivors elect a new leader, and get a
new view, without waiting out the election timeout.

Acting while Disabled
---------------------
A Disabled node does not *act*: it accepts no work (no ``proposed``, no ``ok``
to a work request received while Disabled) and answers no keep-alives.  It
keeps following the cluster log (applying what a quorum elsewhere committed is
learning, not acting) so that it is current the moment its quorum returns.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from nonstop.cluster.failure import (
    ERROR_STATES,
    DetectorConfig,
    FailureDetector,
    NodeIdentity,
    NodeState,
    location_code,
)
from nonstop.cluster.quorum import Quorum, QuorumPolicy, QuorumState
from nonstop.cluster.raft import ROLE_LEADER, Entry, Raft, RaftConfig
from nonstop.cluster.tables import REQUESTER, LogTable, TableRegistry
from nonstop.errors import NotLeader
from nonstop.runtime.interface import (
    ALIVE,
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

QUORUM_ACTIVE = str(QuorumState.ACTIVE)
QUORUM_PARTIAL = str(QuorumState.PARTIAL)
QUORUM_DISABLED = str(QuorumState.DISABLED)

WORK_OPS = frozenset({"join", "leave", "propose"})
"""Operations refused while Disabled (D16)."""

VIEW_HISTORY = 16
"""How many of the latest committed views the status reply lists (``views``)."""

FORWARD_TIMEOUT = 3.0
"""Seconds to wait for a forwarded join/leave, or for a membership change to commit."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Static configuration of one node's cluster layer.

    ``members`` is the bootstrap membership: every founding node of a new
    cluster is started with the same list (itself included).  A node started
    with an empty list, or one that does not contain it, is a joiner: it asks
    its ``static_peers`` to add it.  ``static_peers`` maps names to addresses
    (C2 static discovery).  ``quorum`` is a D16 policy in
    :meth:`QuorumPolicy.from_config` form (default: majority).  ``snapshot_every``
    is how many applied entries between two log compactions.
    """

    name: NodeId
    address: str
    store_timestamp: int
    members: tuple[NodeId, ...] = ()
    static_peers: Mapping[NodeId, str] = field(default_factory=dict)
    location: int | None = None
    protocol: tuple[int, int] = (1, 1)
    detector: DetectorConfig = field(default_factory=DetectorConfig)
    quorum: Mapping[str, Any] = field(default_factory=lambda: {"mode": "majority"})
    raft: RaftConfig | Mapping[str, Any] = field(default_factory=RaftConfig)
    """Raft tunables, as a :class:`RaftConfig` or a dict of its fields (configuration files)."""
    snapshot_every: int = 256
    max_log_entry_bytes: int = 1024 * 1024
    """Largest value a ``propose`` (or a table's request) may put in the log, packed:
    every node stores and applies every entry, so one large entry costs the cluster."""

    def identity(self) -> NodeIdentity:
        return NodeIdentity(
            name=self.name,
            address=self.address,
            location=self.location if self.location is not None else location_code(self.name),
            timestamp=self.store_timestamp,
            protocol=self.protocol,
        )


@dataclass(slots=True)
class _Pending:
    """A request waiting for the log: where its answer goes, and what it waits for."""

    kind: str  # "propose" | "join" | "leave"
    reply_to: tuple[Any, ...]  # ("client", request_id) or ("peer", node, forward_id)
    command: Any = None
    name: NodeId | None = None
    timer: str | None = None


def _sorted_sends(actions: list[Action]) -> list[Action]:
    """Order each run of consecutive Sends by destination (stable per destination).

    Sends to different nodes are independent (different connections), so their
    relative order means nothing -- but a component that iterates a ``set`` of
    names emits them in an order that depends on the interpreter's hash seed,
    and then a simulation seed would not replay in another process.
    """
    out: list[Action] = []
    run: list[Send] = []

    def by_destination(send: Send) -> NodeId:
        return send.to

    for action in actions:
        if isinstance(action, Send):
            run.append(action)
            continue
        if run:
            ordered: list[Send] = sorted(run, key=by_destination)
            out.extend(ordered)
            run = []
        out.append(action)
    ordered = sorted(run, key=by_destination)
    out.extend(ordered)
    return out


def _chain(digest: bytes, index: int, term: int, kind: str, data: Any) -> bytes:
    """Next link of the applied-history hash chain (see ``applied`` notifications)."""
    h = hashlib.blake2b(digest, digest_size=16)
    h.update(msgpack.packb([index, term, kind, data], use_bin_type=True))
    return h.digest()


class ClusterNode:
    """The cluster layer of one node as one sans-I/O machine (see module docstring)."""

    hears_bare_messages = True
    """Give this machine ``{"k": "alive"}`` for the peers' messages without an envelope
    (the real runtime does: ``runtime/real.py``, ``on_message``)."""

    def __init__(
        self, config: ClusterConfig, rng: random.Random, recovered: Mapping[bytes, bytes]
    ) -> None:
        self.config = config
        self.name = config.name
        self.rng = rng
        # Only seeds the bootstrap configuration entry; the policy in effect is raft.policy.
        self.policy = QuorumPolicy.from_config(config.quorum)
        self.detector = FailureDetector(identity=config.identity(), config=config.detector, rng=rng)
        for peer, address in sorted(config.static_peers.items()):
            self.detector.add_peer(peer, address, static=True)
        for member in config.members:
            self.detector.add_peer(member, None)
        self._token = 0
        bootstrap = list(config.members) if self.name in config.members else None
        contacts = sorted(set(config.static_peers) | set(config.members) - {self.name})
        self.raft = Raft(
            self.name,
            rng,
            {k: v for k, v in recovered.items() if k.startswith(b"raft/")},
            bootstrap_members=bootstrap,
            contacts=contacts,
            policy=self.policy,
            config=config.raft
            if isinstance(config.raft, RaftConfig)
            else RaftConfig(**dict(config.raft)),
            next_token=self._next_token,
        )
        # Nothing is known Up before the first hello: start Disabled, so that a
        # restarted node never acts before it has seen its quorum again.
        self.quorum_state = QUORUM_DISABLED
        self.detector.enabled = False
        self.leader: NodeId | None = None
        self.term = 0
        self.view = 0
        self.view_members: list[NodeId] = []
        self.view_live: list[NodeId] = []
        # The latest committed views, oldest first: part of the applied state (in snapshots),
        # so every node, restarted or not, reports the same sequence.
        self.views: list[dict[str, Any]] = []
        self.applied_index = 0
        self.applied_digest = b""
        self._since_snapshot = 0
        self.snapshots = 0  # snapshots taken or installed here (the node's metrics read it)
        self._nonce = rng.getrandbits(48)
        self._pending_log: dict[int, _Pending] = {}  # log index -> proposal
        self._pending_members: list[_Pending] = []
        self._forwarded: dict[int, tuple[int, str]] = {}  # forward id -> (request id, timer)
        self._next_forward = 0
        self._now = 0.0
        self._bound: tuple[frozenset[NodeId], QuorumPolicy, Quorum | None] | None = None
        self._quorum_key: tuple[Any, ...] | None = None
        """(members, policy, detector Up version) of the last quorum computed: it is
        recomputed after every event, which under load is thousands of times a second."""
        # Tables of the log (cluster/tables.py): applied state like the views, rebuilt from
        # the log and snapshots on restart, never persisted on their own.
        self.tables = TableRegistry()
        self._table_inflight: dict[tuple[Any, ...], tuple[int, int]] = {}  # -> (index, term)
        self._handled_any = False
        self._caught_up = False

    def _next_token(self) -> int:
        self._token += 1
        return self._token

    # ------------------------------------------------------------------ api
    @property
    def enabled(self) -> bool:
        """False while Disabled (no quorum): the node refuses work (D16)."""
        return self.quorum_state != QUORUM_DISABLED

    @property
    def caught_up(self) -> bool:
        """True once this node, since it started, applied the log as far as a leader had it.

        The applied state (users, decisions, partitions) of a node that just
        restarted is its snapshot's until a leader tells it what followed:
        what reads that state for a decision that matters -- the users table
        for authentication -- waits for this.  Sticky: it stays True when the
        node later lags (the state is then at most the replication lag old).
        """
        if not self._caught_up:
            target = self.raft.catch_up_target
            self._caught_up = target is not None and self.applied_index >= target
        return self._caught_up

    @property
    def incarnation(self) -> int:
        """A random id of this incarnation of the node (drawn anew at every start).

        Submitted entries carry it (``r``), so that a table answers the life that
        asked, not a restarted node re-applying its log.
        """
        return self._nonce

    def register_table(self, table: LogTable) -> None:
        """Attach a table of the log (module doc); before the first event only.

        Entries are applied from the first event on (the snapshot first): a table
        registered later would have missed some.
        """
        if self._handled_any:
            raise RuntimeError(f"table {table.name!r} registered after the node started")
        self.tables.register(table)

    def handle(self, event: Event) -> list[Action]:
        """Route one event to the detector, the log or the admin handling."""
        self._now = event.now
        self._handled_any = True
        if isinstance(event, Started):
            actions = self._wrap("fd", self.detector.handle(event))
            actions += self._from_raft(self.raft.handle(event))
            actions = self._after(actions)
            if not any(isinstance(a, Notify) and a.kind == "quorum" for a in actions):
                actions.append(Notify("quorum", {"state": self.quorum_state, "old": None}))
            return actions
        if isinstance(event, TimerFired):
            name = event.name
            if name.startswith("fd:"):
                inner = TimerFired(event.now, name[3:])
                return self._after(self._wrap("fd", self.detector.handle(inner)))
            if name.startswith("raft."):
                return self._after(self._from_raft(self.raft.handle(event)))
            if name.startswith("node:"):
                return self._after(self._on_own_timer(name[5:]))
            return [Log("warning", f"unknown timer {name!r}")]
        if isinstance(event, Received):
            return self._after(self._on_received(event))
        if isinstance(event, Persisted):
            return self._after(self._from_raft(self.raft.handle(event)))
        if isinstance(event, ClientRequest):
            return self._after(self._on_client(event))
        return [Log("warning", f"unknown event {type(event).__name__}")]

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
            return self.detector.add_peer(name, address, static=False)
        if kind == ALIVE:
            return self.detector.heard_bare(event.now, event.sender)
        actions = self.detector.heard(event.now, event.sender, bool(payload.get("en", True)))
        body = payload.get("b")
        if kind != "fd" and self.detector.state_of(event.sender) in ERROR_STATES:
            # Duplicate location/timestamp or unsupported protocol: "no communication
            # can occur with this node until the error is corrected" (C3).
            return actions
        if kind == "fd":
            actions += self._wrap("fd", self.detector.on_message(event.now, event.sender, body))
        elif kind == "raft":
            inner = Received(event.now, event.sender, body)
            actions += self._from_raft(self.raft.handle(inner))
        elif kind == "adm":
            actions += self._on_admin_message(event.sender, body)
        elif isinstance(kind, str) and kind in self.tables:
            actions += self._on_table_forward(kind, event.sender, body)
        else:
            actions += self._on_other_kind(event.now, event.sender, kind, body)
        return actions

    def _on_other_kind(self, now: float, sender: NodeId, kind: Any, body: Any) -> list[Action]:
        """A message of a kind this class does not know (a subclass's own), after the
        liveness and error-state handling every message gets."""
        return [Log("warning", f"unknown message kind {kind!r} from {sender}")]

    def _wrap(self, kind: str, actions: list[Action]) -> list[Action]:
        """Put a component's Sends into envelopes and prefix its timers."""
        out: list[Action] = []
        for action in actions:
            if isinstance(action, Send):
                if kind != "fd" and self.detector.state_of(action.to) in ERROR_STATES:
                    continue  # no communication with a node in an error state (C3)
                out.append(Send(action.to, self._envelope(kind, action.payload)))
            elif kind == "fd" and isinstance(action, SetTimer):
                out.append(SetTimer("fd:" + action.name, action.delay))
            elif kind == "fd" and isinstance(action, CancelTimer):
                out.append(CancelTimer("fd:" + action.name))
            else:
                out.append(action)
        return out

    def _envelope(self, kind: str, body: Any) -> dict[str, Any]:
        return {"k": kind, "en": self.enabled, "b": body}

    def _from_raft(self, actions: list[Action]) -> list[Action]:
        """Carry out Raft's output: envelopes, leader/view tracking, applying entries."""
        out = self._wrap("raft", _sorted_sends(actions))
        for action in actions:
            if isinstance(action, Notify) and action.kind == "leader":
                self.leader = action.data.get("leader")
                self.term = int(action.data.get("term", self.term))
        self.term = max(self.term, self.raft.term)
        out += self._apply(self.raft.take_applied())
        if self._pending_log and max(self._pending_log) > self.raft.last_index:
            # A newer leader's log replaced ours below a pending proposal: nothing will ever be
            # applied at its index here until that leader's log grows that far, which a quiet
            # cluster may never do.  Whether another copy commits cannot be known here.
            for index in sorted(i for i in self._pending_log if i > self.raft.last_index):
                out += self._answer(
                    self._pending_log.pop(index),
                    {"error": "Unknown", "message": "the entry was dropped by a newer leader"},
                )
        return out

    def _after(self, actions: list[Action]) -> list[Action]:
        """Recompute quorum after anything that may have changed the Up set or the voters;
        as leader, commit a new view when the members seen Up changed."""
        leader = self.raft.leader
        if leader is not None and any(
            isinstance(a, Notify)
            and a.kind == "node_state"
            and a.data.get("peer") == leader
            and str(a.data.get("new")) == str(NodeState.DOWN)
            for a in actions
        ):
            actions += self._from_raft(self.raft.leader_unreachable(self._now))
        actions += self._update_quorum()
        return actions + self._maybe_propose_view()

    def _maybe_propose_view(self) -> list[Action]:
        """Leader with quorum: put the members it sees Up into the log as a new view.

        Called once per event, so every detector change of one event lands in one view;
        Raft keeps at most one such entry in flight, and the next one (if the Up set moved
        on meanwhile) follows its commit.  Without quorum nothing is proposed: a minority
        leader's view could not commit anyway, and D16 says a Disabled node does not act.
        """
        raft = self.raft
        if raft.role != ROLE_LEADER or not self.enabled or raft.view_in_flight:
            return []
        members = raft.view_members
        live = {self.name, *self.detector.up_peers()} & members
        if live == raft.view_live:
            return []
        try:
            return self._from_raft(raft.propose_view(self._now, live))
        except NotLeader:
            return []

    # ---------------------------------------------------------------- quorum
    def _compute_quorum(self) -> str:
        # The policy is cluster state (a committed configuration entry, D16): evaluate the one
        # in effect in the log, not this node's configuration file, which only seeds the
        # bootstrap entry -- otherwise a policy change would leave nodes disagreeing.
        members, policy = self.raft.members, self.raft.policy
        if not members:
            return QUORUM_DISABLED
        if self._bound is None or self._bound[0] != members or self._bound[1] != policy:
            try:
                self._bound = (members, policy, policy.bind(members))
            except ValueError:
                self._bound = (members, policy, None)
        bound = self._bound[2]
        if bound is None:
            return QUORUM_DISABLED
        return str(bound.state([self.name, *self.detector.up_peers()]))

    def _update_quorum(self) -> list[Action]:
        key = (self.raft.members, self.raft.policy, self.detector.up_version)
        if key == self._quorum_key:
            return []
        self._quorum_key = key
        new = self._compute_quorum()
        if new == self.quorum_state:
            return []
        old, self.quorum_state = self.quorum_state, new
        actions: list[Action] = [Notify("quorum", {"state": new, "old": old})]
        actions += self.detector.set_enabled(new != QUORUM_DISABLED)
        return actions

    # --------------------------------------------------------------- the log
    def _apply(self, entries: list[Entry]) -> list[Action]:
        actions: list[Action] = []
        for entry in entries:
            if entry.kind == "snapshot":
                raw = entry.data.get("state")
                # None: reset to the empty initial state (Raft does that only after a
                # split brain under a non-intersecting quorum policy).
                state: dict[str, Any] = (
                    msgpack.unpackb(raw, raw=False) if raw is not None else {"digest": b""}
                )
                self.applied_digest = state["digest"]
                self.applied_index = entry.index
                self._since_snapshot = 0
                self.snapshots += 1
                self.views = list(state.get("views", []))
                missing = self.tables.restore(state)
                if raw is not None and missing:
                    actions.append(
                        Log(
                            "warning",
                            f"the snapshot at {entry.index} carries no state for tables "
                            f"{missing} (taken by a node without them?): they start empty",
                        )
                    )
                actions += self._view_from(entry.data, record=False)
                for index in sorted(i for i in self._pending_log if i <= entry.index):
                    pending = self._pending_log.pop(index)
                    actions += self._answer(
                        pending,
                        {"error": "Unknown", "message": "log compacted past the entry"},
                    )
                actions.append(
                    Notify(
                        "applied",
                        {
                            "index": entry.index,
                            "term": entry.term,
                            "kind": "snapshot",
                            "value": None,
                            "view": self.view,
                            "digest": self.applied_digest.hex(),
                        },
                    )
                )
                continue
            self.applied_digest = _chain(
                self.applied_digest, entry.index, entry.term, entry.kind, entry.data
            )
            self.applied_index = entry.index
            self._since_snapshot += 1
            if entry.kind in ("config", "view"):
                actions += self._view_from(entry.data)
            elif entry.kind == "cmd" and (table := self.tables.owner(entry.data)) is not None:
                actions += self._apply_table_entry(table, entry.index, entry.data)
            actions.append(
                Notify(
                    "applied",
                    {
                        "index": entry.index,
                        "term": entry.term,
                        "kind": entry.kind,
                        "value": entry.data,
                        "digest": self.applied_digest.hex(),
                    },
                )
            )
            done = self._pending_log.pop(entry.index, None)
            if done is not None:
                answer: dict[str, Any]
                if entry.kind == "cmd" and entry.data == done.command:
                    answer = {"ok": True, "index": entry.index, "term": entry.term}
                else:
                    answer = {
                        "error": "Failed",
                        "message": "another leader's entry took its place; not committed",
                    }
                actions += self._answer(done, answer)
        if entries and self._since_snapshot >= self.config.snapshot_every:
            packed = msgpack.packb(
                {"digest": self.applied_digest, "views": self.views, **self.tables.snapshot()},
                use_bin_type=True,
            )
            actions += self._wrap("raft", self.raft.snapshot(self._now, self.applied_index, packed))
            self._since_snapshot = 0
            self.snapshots += 1
        return actions

    def _view_from(self, data: Mapping[str, Any], *, record: bool = True) -> list[Action]:
        """A view entry (config, liveness or snapshot) applied: it is the current view.

        A snapshot may carry view 0 (reset to the initial state); ids otherwise only grow
        within the applied sequence, which Raft guarantees.
        """
        members = sorted(data.get("members", []))
        live = sorted(data.get("live", members))
        self.view = int(data.get("view_id", self.view))
        if record:
            self.views.append({"id": self.view, "members": members, "live": live})
            del self.views[:-VIEW_HISTORY]
        self.view_live = live
        return self._on_view(members)

    def _on_view(self, members: list[NodeId]) -> list[Action]:
        """A view committed: learn its members, answer waiting joins/leaves."""
        self.view_members = members
        actions: list[Action] = []
        for member in self.view_members:
            if member not in self.detector.peers and member != self.name:
                actions += self.detector.add_peer(member, None)
        still: list[_Pending] = []
        for pending in self._pending_members:
            done = (pending.kind == "join" and pending.name in self.view_members) or (
                pending.kind == "leave" and pending.name not in self.view_members
            )
            if done:
                if pending.timer:
                    actions.append(CancelTimer(pending.timer))
                actions += self._answer(
                    pending, {"ok": True, "view": self.view, "members": self.view_members}
                )
            else:
                still.append(pending)
        self._pending_members = still
        return actions

    # ---------------------------------------------------------------- admin
    def _on_client(self, event: ClientRequest) -> list[Action]:
        payload = event.payload
        op = payload.get("op") if isinstance(payload, dict) else None
        if op == "status":
            return [Reply(event.request_id, self.status())]
        for table in self.tables:
            # A table may serve client ops of its own (the users table: ``user.*``).
            on_client = getattr(table, "on_client", None)
            if on_client is not None:
                taken = on_client(self._now, event.request_id, payload)
                if taken is not None:
                    return list(taken)
        if op not in WORK_OPS:
            return [Reply(event.request_id, bad_request(f"unknown op {op!r}"))]
        return self._work(op, payload, ("client", event.request_id))

    def _work(self, op: str, payload: Mapping[str, Any], reply_to: tuple[Any, ...]) -> list[Action]:
        """A work request from a client or forwarded by a peer."""
        if not self.enabled:
            return self._answer(_Pending(op, reply_to), quorum_lost(self.name))
        if op == "propose":
            return self._propose(payload, reply_to)
        name = payload.get("name")
        if not isinstance(name, str) or not name:
            return self._answer(_Pending(op, reply_to), bad_request(f"{op} needs a node name"))
        if op == "join":
            address = payload.get("address")
            if isinstance(address, str):
                self.detector.add_peer(name, address)
        if self.raft.role != ROLE_LEADER:
            return self._forward(op, payload, reply_to)
        pending = _Pending(op, reply_to, name=name)
        # Done already only if both the committed view and the latest appended
        # configuration agree: a pending opposite change must not be reported as done.
        in_view, in_config = name in self.view_members, name in self.raft.members
        already = (in_view and in_config) if op == "join" else not (in_view or in_config)
        if already:
            return self._answer(
                pending, {"ok": True, "view": self.view, "members": self.view_members}
            )
        try:
            if op == "join":
                actions = self.raft.add_member(self._now, name)
            else:
                actions = self.raft.remove_member(self._now, name)
        except NotLeader as e:
            return self._answer(pending, not_leader(e.leader))
        except ValueError as e:
            return self._answer(pending, {"error": "Failed", "message": str(e)})
        self._next_forward += 1
        pending.timer = f"node:op:{self._next_forward}"
        self._pending_members.append(pending)
        out = self._from_raft(actions)
        out.append(SetTimer(pending.timer, FORWARD_TIMEOUT))
        return out

    def _propose(self, payload: Mapping[str, Any], reply_to: tuple[Any, ...]) -> list[Action]:
        self._next_forward += 1
        command = {"id": [self.name, self._nonce, self._next_forward], "v": payload.get("value")}
        pending = _Pending("propose", reply_to, command=command)
        size = len(msgpack.packb(command["v"], use_bin_type=True))
        if size > self.config.max_log_entry_bytes:
            return self._answer(pending, too_large(size, self.config.max_log_entry_bytes))
        if self.raft.role != ROLE_LEADER:
            return self._answer(pending, not_leader(self.raft.leader))
        try:
            index, actions = self.raft.propose(self._now, command)
        except NotLeader as e:
            return self._answer(pending, not_leader(e.leader))
        self._pending_log[index] = pending
        out: list[Action] = [Notify("proposed", {"index": index, "term": self.raft.term})]
        return out + self._from_raft(actions)

    def _forward(
        self, op: str, payload: Mapping[str, Any], reply_to: tuple[Any, ...]
    ) -> list[Action]:
        leader = self.raft.leader
        if leader is None or leader == self.name or reply_to[0] != "client":
            return self._answer(_Pending(op, reply_to), not_leader(leader))
        self._next_forward += 1
        fid = self._next_forward
        timer = f"node:fwd:{fid}"
        self._forwarded[fid] = (reply_to[1], timer)
        body = {**dict(payload), "op": op, "fwd": fid}
        return [Send(leader, self._envelope("adm", body)), SetTimer(timer, FORWARD_TIMEOUT)]

    def _on_admin_message(self, sender: NodeId, body: Any) -> list[Action]:
        if not isinstance(body, dict):
            return [Log("warning", f"malformed admin message from {sender}")]
        if "re" in body:  # the leader's answer to a request we forwarded
            fid = body["re"]
            forwarded = self._forwarded.pop(fid, None) if isinstance(fid, int) else None
            if forwarded is None:
                return []
            request_id, timer = forwarded
            return [CancelTimer(timer), Reply(request_id, body.get("reply"))]
        op = body.get("op")
        if op not in ("join", "leave"):
            return [Log("warning", f"unknown admin op {op!r} from {sender}")]
        return self._work(op, body, ("peer", sender, body.get("fwd")))

    def _on_own_timer(self, name: str) -> list[Action]:
        kind = name.partition(":")[0]
        if kind == "fwd":
            for fid, (request_id, timer) in list(self._forwarded.items()):
                if timer == "node:" + name:
                    del self._forwarded[fid]
                    return [Reply(request_id, timeout(f"no answer from leader {self.leader}"))]
        elif kind == "op":
            for pending in self._pending_members:
                if pending.timer == "node:" + name:
                    self._pending_members.remove(pending)
                    return self._answer(pending, timeout("the membership change did not commit"))
        elif kind == TABLE_TIMER:
            # A table's own timer (module doc): "tbl:<table>:<rest>".
            table_name, _, rest = name[len(TABLE_TIMER) + 1 :].partition(":")
            on_timer = getattr(self.tables.get(table_name), "on_timer", None)
            if on_timer is not None:
                return list(on_timer(self._now, rest))
        return []

    def _answer(self, pending: _Pending, answer: dict[str, Any]) -> list[Action]:
        if pending.reply_to[0] == "client":
            return [Reply(pending.reply_to[1], answer)]
        _, node, fid = pending.reply_to
        return [Send(node, self._envelope("adm", {"re": fid, "reply": answer}))]

    # ------------------------------------------------------- tables of the log
    def submit(self, now: float, table: str, entry: dict[str, Any]) -> list[Action]:
        """Put a registered table's entry, built from a local request, into the log.

        The node stamps ``r`` (this node and incarnation); the leader proposes the
        entry, a follower forwards it to the leader it knows.  Nothing is answered
        now: the table answers when the entry is applied here.  Without quorum or a
        leader the request is dropped: the requester retries.
        """
        self._now = now
        if table not in self.tables:
            raise ValueError(f"no log table named {table!r}")
        size = len(msgpack.packb(entry, use_bin_type=True))
        if size > self.config.max_log_entry_bytes:
            refusal = too_large(size, self.config.max_log_entry_bytes)["message"]
            return [Log("warning", f"log table {table}: {refusal}")]
        entry[REQUESTER] = [self.name, self._nonce]
        return self._after(self._route_table_entry(table, entry))

    def _route_table_entry(self, name: str, entry: dict[str, Any]) -> list[Action]:
        if not self.enabled:
            return []  # D16: a Disabled node does not act; the requester retries
        if self.raft.role != ROLE_LEADER:
            leader = self.raft.leader
            if leader is None or leader == self.name:
                return []
            return [Send(leader, self._envelope(name, entry))]
        table = self.tables.get(name)
        assert table is not None
        # Retries of a request still in flight in this term add nothing: one entry each.
        key = (name, table.request_key(entry), *entry[REQUESTER])
        inflight = self._table_inflight.get(key)
        if (
            inflight is not None
            and inflight[0] > self.applied_index
            and inflight[1] == self.raft.term
        ):
            return []
        try:
            index, actions = self.raft.propose(self._now, entry)
        except NotLeader:
            return []
        self._table_inflight[key] = (index, self.raft.term)
        return self._from_raft(actions)

    def _on_table_forward(self, name: str, sender: NodeId, body: Any) -> list[Action]:
        """A peer forwarded a table's request: propose it if we lead, else drop it."""
        requester = body.get(REQUESTER) if isinstance(body, dict) else None
        if (
            not isinstance(requester, list)
            or len(requester) != 2
            or requester[0] != sender
            or not isinstance(requester[1], int)
        ):
            return [Log("warning", f"log table {name}: malformed forward from {sender}")]
        table = self.tables.get(name)
        assert table is not None
        entry = table.forwarded(sender, dict(body))
        if entry is None:
            return [Log("warning", f"log table {name}: malformed forward from {sender}")]
        entry[REQUESTER] = [sender, requester[1]]
        if self.raft.role != ROLE_LEADER:
            return []  # no second hop: the requester retries and finds the new leader
        return self._route_table_entry(name, entry)

    def _apply_table_entry(self, table: LogTable, index: int, data: Any) -> list[Action]:
        for key in [k for k, (i, _) in self._table_inflight.items() if i <= index]:
            del self._table_inflight[key]
        return table.apply(index, data)

    def status(self) -> dict[str, Any]:
        """The ``status`` admin reply (see module docstring)."""
        nodes: list[dict[str, Any]] = [
            {
                "name": self.name,
                "address": self.config.address,
                "state": "Self",
                "member": self.name in self.view_members,
            }
        ]
        for name, peer in sorted(self.detector.peers.items()):
            nodes.append(
                {
                    "name": name,
                    "address": peer.address,
                    "state": str(peer.state),
                    "member": name in self.view_members,
                }
            )
        warnings = self.detector.warnings()
        policy = self.raft.policy
        if policy.mode == "off" or policy.allow_non_intersecting:
            warnings.append(
                f"quorum policy {policy.mode!r} does not make quorums intersect: "
                "both sides of a partition may stay active (split brain)"
            )
        return {
            "name": self.name,
            "view": self.view,
            "members": list(self.view_members),
            "live": list(self.view_live),
            "views": [dict(v) for v in self.views],
            "quorum": self.quorum_state,
            "leader": self.raft.leader,
            "term": self.raft.term,
            "role": self.raft.role,
            "commit_index": self.raft.commit_index,
            "nodes": nodes,
            "warnings": warnings,
        }


TABLE_TIMER = "tbl"
"""Timers of the tables: ``node:tbl:<table>:<rest>`` fires the table's ``on_timer(now, rest)``."""


def table_timer(table: str, rest: str) -> str:
    """The name of a timer of table ``table`` that comes back as ``on_timer(now, rest)``."""
    return f"node:{TABLE_TIMER}:{table}:{rest}"


def quorum_lost(name: NodeId) -> dict[str, Any]:
    """The reply to a work request on a Disabled node (D16)."""
    return {
        "error": "QuorumLost",
        "message": f"node {name} has no quorum (Disabled) and refuses work; ask another node",
    }


def not_leader(leader: NodeId | None) -> dict[str, Any]:
    return {"error": "NotLeader", "leader": leader, "message": f"the leader is {leader}"}


def timeout(message: str) -> dict[str, Any]:
    return {"error": "Timeout", "message": message}


def too_large(size: int, limit: int) -> dict[str, Any]:
    """The reply to a proposal over the entry size limit (``max_log_entry_bytes``)."""
    return {
        "error": "TooLarge",
        "message": f"a cluster-log entry of {size:,} bytes exceeds the limit of {limit:,} "
        "bytes (max_log_entry_bytes); nothing was proposed",
    }


def bad_request(message: str) -> dict[str, Any]:
    return {"error": "BadRequest", "message": message}


__all__ = ["TABLE_TIMER", "ClusterConfig", "ClusterNode", "NodeState", "quorum_lost", "table_timer"]
