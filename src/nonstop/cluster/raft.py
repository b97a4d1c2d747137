"""The cluster log: Raft as a sans-I/O state machine (SPEC D1, D16; DESIGN "Cluster state is a
replicated log").

Membership views, and later the partition table and configuration versions, change only through
entries committed in this log.  :class:`Raft` follows Ongaro & Ousterhout's Raft (and the
dissertation's pre-vote, check-quorum and snapshot chapters) and the rules of
:mod:`nonstop.runtime.interface`: events in, actions out, no clock, no disk, no randomness of its
own.  Full design notes: ``docs/design/cluster-log.md``.

API for the node composition (``nonstop.cluster.node``)
=========================================================

Construction (once per incarnation)::

    raft = Raft(
        node_id="n1",
        rng=random.Random(seed),            # only source of randomness (election jitter)
        recovered=durable_mapping,          # every b"raft/..." key that was durable; {} if new
        bootstrap_members=["n1", "n2", "n3"],  # same list on every founding node, or None
        contacts=["n1", "n2", "n3"],        # whom a joining node asks to add it (AddServer)
        policy=QuorumPolicy.majority(),     # commit/election quorum (nonstop.cluster.quorum)
        config=RaftConfig(election_timeout=1.0, heartbeat_interval=0.1),
        next_token=shared_token_counter,    # Persist tokens, unique across the node's machines
    )

Then feed it events and carry out what it returns::

    actions = raft.handle(Started(now))          # first event of every incarnation
    actions = raft.handle(Received(now, sender, payload))   # payload["t"] starts with "raft."
    actions = raft.handle(TimerFired(now, "raft.election" | "raft.heartbeat"))
    actions = raft.handle(Persisted(now, token)) # tokens Raft does not own are ignored

``handle`` never raises for bad input: malformed messages, unknown message types, messages from
unknown senders and stale terms are dropped with a ``Log`` action.  It returns ``[]`` for events
that are not Raft's (other message types, other timers, foreign tokens), so the node composition
may offer every event to Raft.  Raft's messages all have ``payload["t"].startswith("raft.")``;
its timers are ``"raft.election"`` and ``"raft.heartbeat"``.

Proposing (leader only)::

    index, actions = raft.propose(now, command)              # command: any msgpack-able value
    first, actions = raft.propose_batch(now, [c1, c2, ...])  # one Persist, one send per peer
    raft.propose(now, command, flush=False)  # buffer; sent with the next handle()/flush()
    actions = raft.flush(now)

``propose`` raises :class:`nonstop.errors.NotLeader` (``.leader`` = hint or None) when this node
does not lead.  An index returned by ``propose`` is *not* a promise: the entry commits only if it
later comes out of :meth:`Raft.take_applied` with that index and the command; after a leader change
it may be overwritten by another leader's entry (compare the command, e.g. carry a request id).

Membership and quorum policy (leader only, one change at a time; joint consensus, see below)::

    actions = raft.add_member(now, "n4")     # raises NotLeader, or ValueError when a change is
    actions = raft.remove_member(now, "n2")  # pending, the leader's first entry is not committed
    actions = raft.change_members(now, {"n1", "n3", "n4"})  # yet, or the policy cannot serve
    actions = raft.change_policy(now, QuorumPolicy.minimum_votes(2))  # the new member set
    actions = raft.change_members(now, members, policy=policy)       # both at once
    actions = raft.transfer_leadership(now, "n2")  # or None: the most up-to-date voter; until
                                                   # done (or one election timeout) propose()
                                                   # raises NotLeader(leader=target)

Views (leader only) and fail-over::

    actions = raft.propose_view(now, live)   # commit (id+1, members, live & members); [] while
                                             # one is in flight or nothing changed
    actions = raft.leader_unreachable(now)   # follower: the detector saw the leader Down;
                                             # campaign after a short jittered delay

Consuming the committed log::

    for entry in raft.take_applied():        # committed entries, in log order
        entry.kind == "cmd"       # entry.data is the proposed command
        entry.kind == "config"    # entry.data == {"members": [...], "view_id": int, "live": [...],
                                  #   "policy": QuorumPolicy.to_config() dict}: a new view
        entry.kind == "view"      # entry.data == {"members", "view_id", "live"}: a new view, same
                                  #   members, another live set (see propose_view)
        entry.kind == "snapshot"  # entry.data == {"state": bytes | None, "members": [...],
                                  #   "view_id": int, "live": [...]}: REPLACE the applied state
                                  #   (a snapshot installed from the leader, or the local snapshot
                                  #   after a restart); entries after it follow.  ``state`` is None
                                  #   only for a reset to the empty initial state (index 0), which
                                  #   happens after a split brain with a non-intersecting policy.

Every committed entry is returned exactly once per incarnation, in index order (leader no-ops and
the intermediate joint-consensus entries are applied internally and not returned); a ``snapshot``
entry may follow entries already returned and then supersedes them (its index can even be lower
after a split-brain reset).  After a
restart, application starts again from the last local snapshot: the first entry returned is that
snapshot (if one was taken), then every committed entry after it as the commit index becomes known
again (it is not persisted; it is re-learned from the leader).  The state above Raft must therefore
be a deterministic function of (snapshot, entries after it) and must not be persisted on its own.

Compaction: the node composition calls ``raft.snapshot(now, index, state)`` with ``state`` = its
applied state after applying entry ``index`` (``index <= raft.last_applied``).  Raft persists it
and drops the log up to ``index``; followers too far behind receive it by InstallSnapshot (one
message: cluster state is small).

Read-only properties: ``role`` (``"follower" | "pre_candidate" | "candidate" | "leader"``),
``term``, ``leader`` (NodeId | None), ``commit_index``, ``last_applied``, ``last_index``,
``snapshot_index``, ``in_joint_consensus``,
``members`` (voters of the latest *appended* config, in effect for this node's quorums),
``policy`` (the :class:`~nonstop.cluster.quorum.QuorumPolicy` of that config: the constructor's
``policy`` only seeds the bootstrap entry; afterwards the log decides, so the node composition
should evaluate D16 quorum states with ``raft.policy``),
``view`` (the latest *committed* :class:`View`: id, members, live) and its parts ``view_id`` /
``view_members`` / ``view_live`` (the id counts every committed view entry, membership or
liveness, 1 for the bootstrap view, identical sequence on every node), ``view_in_flight``,
``quorum`` (the bound :class:`~nonstop.cluster.quorum.Quorum` for ``members``).

Notifications emitted as actions: ``Notify("leader", {"term", "leader"})`` when the known leader
changes, ``Notify("view", {"view_id", "members", "live"})`` when a view commits,
``Notify("role", {"role", "term"})`` on role changes.

Bootstrap and join
------------------
A founding node is given ``bootstrap_members`` (identical on all founding nodes, like Consul's
bootstrap-expect).  On first start with an empty store it writes the bootstrap config as log entry
1 with term 0 — the same entry on every founder, so the log matching property holds — which is
committed by construction (view 1).  A node started later with an empty store and no bootstrap list
(or one that does not contain it) is a *joiner*: it sends ``{"t": "raft.join"}`` to its
``contacts`` (following leader hints) until a leader appends a config containing it; the leader
treats a join as ``add_member``.

Durability
----------
Keys: ``b"raft/hs"`` (hard state: term and vote), ``b"raft/log/" + index.to_bytes(8, "big")`` (one
entry), ``b"raft/snap"`` (snapshot with its metadata).  No vote is granted, no append acknowledged,
no own vote or own log counted towards a quorum before the ``Persisted`` event of the writes it
depends on.  Each ``handle()``/``flush()``/``propose_batch()`` emits at most one ``Persist`` for all
its writes (group commit); the runtime may merge several into one fsync.

Quorum policies
---------------
Election and commit quorums are the weighted threshold of the ``QuorumPolicy`` bound to the
voters (in joint consensus: a quorum of the old voters under the old policy *and* of the new
voters under the new policy).  The policy is part of each configuration entry, so it is cluster
state like the members: every node uses the same one, and it survives restarts and snapshots.
With a non-intersecting policy (``off``, or ``allow_non_intersecting=True``) two leaders can
exist at the same time on two sides of a partition and the log can diverge; see
``docs/design/cluster-log.md`` for exactly what that means.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, NamedTuple

import msgpack

from nonstop.cluster.quorum import Quorum, QuorumPolicy
from nonstop.errors import NotLeader
from nonstop.net import plain
from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    Event,
    Log,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    Send,
    SetTimer,
    Started,
    TimerFired,
)

ROLE_FOLLOWER = "follower"
ROLE_PRE_CANDIDATE = "pre_candidate"
ROLE_CANDIDATE = "candidate"
ROLE_LEADER = "leader"

TIMER_ELECTION = "raft.election"
TIMER_HEARTBEAT = "raft.heartbeat"

KEY_HARD_STATE = b"raft/hs"
KEY_SNAPSHOT = b"raft/snap"
KEY_LOG_PREFIX = b"raft/log/"

# Entry kinds on the wire and on disk (short: they are repeated once per entry).
K_CMD = "c"
K_NOOP = "n"
K_CONFIG = "m"
K_VIEW = "v"  # a liveness view: {"live": [...]}, proposed by the leader (see propose_view)
_KINDS = frozenset({K_CMD, K_NOOP, K_CONFIG, K_VIEW})

# With a non-intersecting policy every candidate only campaigns in terms it "owns"
# (term % _BALLOT_SPACE == a hash of its name), so two leaders never share a term and the log
# matching property (same index and term => same entry) survives a split brain.  A hash, not a
# rank among the voters, because the two sides of a split brain may have different voter lists.
_BALLOT_SPACE = 1 << 16


def log_key(index: int) -> bytes:
    """The durable key of log entry ``index``."""
    return KEY_LOG_PREFIX + index.to_bytes(8, "big")


_packer = msgpack.Packer(use_bin_type=True)  # reused: cheaper than packb() per entry


def _pack(value: Any) -> bytes:
    return _packer.pack(value)


_unpack = plain.unpack


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Tunables.  Election timeouts are uniform in [election_timeout, 2 * election_timeout)."""

    election_timeout: float = 1.0
    heartbeat_interval: float = 0.1
    max_entries_per_append: int = 4096
    max_inflight_appends: int = 4
    join_retry_interval: float = 0.5


class Entry(NamedTuple):
    """A committed entry handed to the state machine above (see module docstring).

    A named tuple rather than a dataclass: one is built per committed entry, on the hot path.
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index, on purpose: the log index
    term: int
    kind: str
    data: Any


class View(NamedTuple):
    """A committed view: its id, the configured voters, and those the leader saw Up.

    Ids count every committed view entry (membership change or liveness change), so every
    node goes through the same numbered sequence; they survive restarts and snapshots.
    """

    id: int
    members: frozenset[NodeId]
    live: frozenset[NodeId]

    def to_dict(self) -> dict[str, Any]:
        return {"view_id": self.id, "members": sorted(self.members), "live": sorted(self.live)}


_NO_VIEW = View(0, frozenset(), frozenset())


class _Bad(Exception):
    """A malformed message; dropped with a Log action (never escapes ``handle``)."""


@dataclass(slots=True)
class _Config:
    """A configuration: voters and quorum policy; ``old*`` set in joint consensus (C_old,new)."""

    index: int
    voters: frozenset[NodeId]
    old: frozenset[NodeId] | None
    policy: QuorumPolicy
    old_policy: QuorumPolicy | None = None

    def everyone(self) -> frozenset[NodeId]:
        return self.voters | (self.old or frozenset())


@dataclass(slots=True)
class _Peer:
    """Leader-side replication progress of one follower."""

    next: int
    match: int = 0
    inflight: int = 0
    last_ack: float = float("-inf")
    progress: float = float("-inf")  # last answer to an append that carried entries
    snap_sent: float = float("-inf")
    probe: int = 0  # next index of the last back-off probe, and when it was sent
    probe_at: float = float("-inf")
    reset: bool = False
    told: int = 0  # the commit index last sent to it


@dataclass(slots=True)
class _Pending:
    """What becomes true once the Persist with ``token`` (and every earlier one) is durable."""

    token: int
    last_index: int
    hard_state: tuple[int, NodeId | None]
    sends: list[Action] = field(default_factory=list)
    done: bool = False


class Raft:
    """One node's Raft replica of the cluster log.  See the module docstring for the contract."""

    _HANDLERS: ClassVar[dict[str, Callable[..., None]]]

    def __init__(
        self,
        node_id: NodeId,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        *,
        bootstrap_members: Sequence[NodeId] | None = None,
        contacts: Sequence[NodeId] = (),
        policy: QuorumPolicy | None = None,
        config: RaftConfig | None = None,
        next_token: Callable[[], int] | None = None,
    ) -> None:
        self.id = node_id
        self._rng = rng
        self._initial_policy = policy or QuorumPolicy.majority()
        self.cfg = config or RaftConfig()
        self._next_token = next_token or itertools.count(1).__next__
        self._contacts = [c for c in contacts if c != node_id]
        self._join_target = 0
        self._ballot = zlib.crc32(node_id.encode()) % _BALLOT_SPACE
        self._leader_hint: NodeId | None = None

        # Persistent state (mirrored by b"raft/..." keys).
        self.term = 0
        self.voted_for: NodeId | None = None
        self._snap_index = 0
        self._snap_term = 0
        self._snap_state: bytes | None = None
        self._snap_view: View = _NO_VIEW
        self._log: list[tuple[int, str, Any]] = []  # entry i is self._log[i - snap_index - 1]
        self._configs: list[_Config] = [_Config(0, frozenset(), None, self._initial_policy)]

        # Volatile state.
        self.role = ROLE_FOLLOWER
        self.leader: NodeId | None = None
        self.commit_index = 0
        self.last_applied = 0
        self.view: View = _NO_VIEW  # the latest committed view
        self._view_hist: list[tuple[int, View]] = [(0, _NO_VIEW)]  # (log index, view)
        self._view_inflight = 0  # index of this leader's liveness view entry not yet committed
        self._applied: list[Entry] = []
        self._leader_contact = float("-inf")
        self._campaign_term = 0
        self._votes: set[NodeId] = set()
        self._peers: dict[NodeId, _Peer] = {}
        self._term_start = 0  # index of this leader's no-op
        # Where this node's applied state is known to be current (``caught_up``): the log's
        # end as the current leader first told it, or this leader's no-op.  None until a
        # leader is heard from; reset when the leader changes (a deposed leader's end may
        # never commit).
        self.catch_up_target: int | None = None
        self._quorums: tuple[Quorum | None, Quorum | None] = (None, None)

        # Durability bookkeeping.
        self._writes: dict[bytes, bytes | None] = {}
        self._deferred: list[Action] = []
        self._pending: deque[_Pending] = deque()  # in emission order
        self._pending_by_token: dict[int, _Pending] = {}
        self._durable_last = 0
        self._durable_hs: tuple[int, NodeId | None] = (0, None)
        self._was_member = False
        self._reset_wanted = False  # we asked the leader for a reset snapshot
        self._leader_last = 0  # the largest "last" the current leader has told us
        self._transfer: tuple[NodeId, float] | None = None  # (target, give up at)

        self._recover(recovered)
        if self.last_index == 0 and bootstrap_members:
            members = frozenset(bootstrap_members)
            self._initial_policy.bind(members)  # a bad policy for founders: configuration error
            if node_id in members:
                data: dict[str, Any] = {"voters": sorted(members), "old": None}
                data["policy"] = self._initial_policy.to_config()
                self._append_local(0, K_CONFIG, data)
        self._durable_hs = (self.term, self.voted_for)
        self._rebind()
        # Term-0 entries (the bootstrap config) are committed by construction.
        first_real = self._snap_index + 1
        while first_real <= self.last_index and self._term_at(first_real) == 0:
            first_real += 1
        self._advance_commit_to(first_real - 1, [])

    # ------------------------------------------------------------ recovery
    def _recover(self, rec: Mapping[bytes, bytes]) -> None:
        raw = rec.get(KEY_HARD_STATE)
        if raw is not None:
            hs = _unpack(raw)
            self.term, self.voted_for = int(hs["term"]), hs["vote"]
        raw = rec.get(KEY_SNAPSHOT)
        if raw is not None:
            snap = _unpack(raw)
            self._install_snapshot_meta(snap)
            self._applied.append(self._snapshot_entry())
        idx = self._snap_index + 1
        while True:
            raw = rec.get(log_key(idx))
            if raw is None:
                break
            term, kind, data = _unpack(raw)
            self._append_mem(int(term), kind, data)
            idx += 1
        self._durable_last = self.last_index
        self._was_member = any(self.id in c.everyone() for c in self._configs)

    def _install_snapshot_meta(self, snap: Mapping[str, Any]) -> None:
        self._snap_index = int(snap["index"])
        self._snap_term = int(snap["term"])
        self._snap_state = snap["state"]
        old = snap["old"]
        policy = _policy(snap.get("policy"), self._initial_policy)
        self._configs = [
            _Config(
                self._snap_index,
                frozenset(snap["voters"]),
                None if old is None else frozenset(old),
                policy,
                None if old is None else _policy(snap.get("old_policy"), policy),
            )
        ]
        members = frozenset(snap["view_members"])
        live = snap.get("view_live")
        self._snap_view = View(
            int(snap["view_id"]), members, members if live is None else frozenset(live)
        )
        self._view_hist = [(self._snap_index, self._snap_view)]
        self.view = self._snap_view
        self.commit_index = max(self.commit_index, self._snap_index)
        self.last_applied = self._snap_index

    def _snapshot_entry(self) -> Entry:
        return Entry(
            self._snap_index,
            self._snap_term,
            "snapshot",
            {"state": self._snap_state, **self._snap_view.to_dict()},
        )

    # ---------------------------------------------------------- properties
    @property
    def view_id(self) -> int:
        """Id of the latest committed view (0 before any)."""
        return self.view.id

    @property
    def view_members(self) -> frozenset[NodeId]:
        """Voters of the latest committed view."""
        return self.view.members

    @property
    def view_live(self) -> frozenset[NodeId]:
        """Members the leader saw Up when the latest committed view was decided."""
        return self.view.live

    @property
    def view_in_flight(self) -> bool:
        """Whether this leader has a liveness view appended but not committed yet."""
        return self._view_inflight > self.commit_index

    @property
    def last_index(self) -> int:
        return self._snap_index + len(self._log)

    @property
    def last_term(self) -> int:
        return self._log[-1][0] if self._log else self._snap_term

    @property
    def snapshot_index(self) -> int:
        return self._snap_index

    @property
    def members(self) -> frozenset[NodeId]:
        """Voters of the latest appended config (C_new while in joint consensus)."""
        return self._configs[-1].voters

    @property
    def policy(self) -> QuorumPolicy:
        """The quorum policy in effect: the one of the latest appended configuration.

        It starts as the constructor's policy (written into the bootstrap entry) and changes
        only through :meth:`change_policy`, a committed configuration change like membership.
        """
        return self._configs[-1].policy

    @property
    def quorum(self) -> Quorum | None:
        """The policy bound to :attr:`members` (None before a joiner knows any config)."""
        return self._quorums[0]

    @property
    def in_joint_consensus(self) -> bool:
        return self._configs[-1].old is not None

    def _term_at(self, index: int) -> int | None:
        if index == self._snap_index:
            return self._snap_term
        if index < self._snap_index or index > self.last_index:
            return None
        return self._log[index - self._snap_index - 1][0]

    # --------------------------------------------------------------- input
    def handle(self, event: Event) -> list[Action]:
        """Consume one event; see the module docstring."""
        out: list[Action] = []
        now = event.now
        if isinstance(event, Received):
            p = event.payload
            if not (isinstance(p, dict) and isinstance(p.get("t"), str)):
                return []
            t = p["t"]
            if not t.startswith("raft."):
                return []
            handler = self._HANDLERS.get(t)
            if handler is None:
                return [
                    Log("warning", f"raft: dropped unknown message type {t!r} from {event.sender}")
                ]
            try:
                handler(self, now, event.sender, p, out)
            except _Bad as e:
                out.append(Log("warning", f"raft: dropped malformed {t} from {event.sender}: {e}"))
        elif isinstance(event, TimerFired):
            if event.name == TIMER_ELECTION:
                self._on_election_timer(now, out)
            elif event.name == TIMER_HEARTBEAT:
                self._on_heartbeat_timer(now, out)
            else:
                return []
        elif isinstance(event, Persisted):
            if not self._on_persisted(now, event.token, out):
                return []
        elif isinstance(event, Started):
            self._on_started(now, out)
        else:
            return []
        return self._finish(now, out)

    def flush(self, now: float) -> list[Action]:
        """Emit the Persist and appends for entries proposed with ``flush=False``."""
        return self._finish(now, [])

    # ------------------------------------------------------------- proposals
    def _require_leader(self) -> None:
        if self.role != ROLE_LEADER:
            raise NotLeader(f"{self.id} is not the cluster log leader", self.leader)
        if self._transfer is not None:
            # While handing over, new entries would only delay the target's catching up.
            raise NotLeader(f"{self.id} is handing leadership over", self._transfer[0])

    def transfer_leadership(self, now: float, target: NodeId | None = None) -> list[Action]:
        """Hand leadership to ``target`` (default: the most up-to-date other voter).

        Dissertation §3.10: the leader stops taking proposals, brings the target up to date,
        then tells it to campaign at once (``raft.timeout_now``); the target's vote requests
        override leader stickiness.  Given up after one election timeout.  Useful before
        removing or restarting the leader.  Raises NotLeader, or ValueError for a bad target.
        """
        self._require_leader()
        voters = self._configs[-1].voters - {self.id}
        if target is None:
            if not voters:
                raise ValueError("no other voter to hand leadership to")
            target = max(sorted(voters), key=lambda n: self._peers[n].match)
        if target not in voters or target not in self._peers:
            raise ValueError(f"{target} is not another voter of the cluster")
        self._transfer = (target, now + self.cfg.election_timeout)
        out: list[Action] = [Log("info", f"raft: {self.id} hands leadership to {target}")]
        self._maybe_timeout_now(out)
        return self._finish(now, out)

    def _maybe_timeout_now(self, out: list[Action]) -> None:
        if self._transfer is None:
            return
        target = self._transfer[0]
        peer = self._peers.get(target)
        if peer is not None and peer.match == self.last_index:
            out.append(Send(target, {"t": "raft.timeout_now", "term": self.term}))

    def propose(self, now: float, command: Any, *, flush: bool = True) -> tuple[int, list[Action]]:
        """Append ``command``; returns its index and (if ``flush``) the actions to carry out."""
        self._require_leader()
        index = self._append_local(self.term, K_CMD, command)
        return index, (self._finish(now, []) if flush else [])

    def propose_batch(self, now: float, commands: Iterable[Any]) -> tuple[int, list[Action]]:
        """Append many commands with one Persist; returns the first index (or the next index)."""
        self._require_leader()
        first = self.last_index + 1
        for c in commands:
            self._append_local(self.term, K_CMD, c)
        return first, self._finish(now, [])

    def leader_unreachable(self, now: float) -> list[Action]:
        """The failure detector saw the known leader Down: campaign soon, without waiting out
        the election timeout (which a new view after a leader crash would otherwise add).

        Safe: it only forgets the leader and shortens this follower's election timer (jittered
        over two heartbeats so that survivors do not split the vote).  The pre-vote still needs
        a quorum that has lost the leader too, so a detector mistake on one node cannot depose
        a leader the others still hear (leader stickiness).
        """
        if self.role != ROLE_FOLLOWER or self.leader is None or self.leader == self.id:
            return []
        out: list[Action] = []
        self._leader_contact = float("-inf")
        self._set_leader(None, out)
        delay = self._rng.random() * 2 * self.cfg.heartbeat_interval
        out.append(SetTimer(TIMER_ELECTION, delay))
        return self._finish(now, out)

    def propose_view(self, now: float, live: Iterable[NodeId]) -> list[Action]:
        """Commit a liveness view: the current members with ``live`` the ones seen Up.

        Leader only (raises NotLeader); at most one in flight: returns ``[]`` without appending
        while an earlier one is uncommitted, or when ``live`` (restricted to the members of the
        latest committed view) is already the committed view's live set.  Once committed it
        comes out of :meth:`take_applied` as a ``view`` entry with the next view id.
        """
        self._require_leader()
        want = frozenset(live) & self.view.members
        if self.view_in_flight or want == self.view.live:
            return []
        self._view_inflight = self._append_local(self.term, K_VIEW, {"live": sorted(want)})
        return self._finish(now, [])

    def add_member(self, now: float, node: NodeId) -> list[Action]:
        """Add a voter (AddServer).  See :meth:`change_members`."""
        return self.change_members(now, self.members | {node})

    def remove_member(self, now: float, node: NodeId) -> list[Action]:
        """Remove a voter (RemoveServer).  See :meth:`change_members`."""
        return self.change_members(now, self.members - {node})

    def change_policy(self, now: float, policy: QuorumPolicy) -> list[Action]:
        """Change the quorum policy (D16) through the log; same rules as :meth:`change_members`."""
        self._require_leader()
        self._change_members(now, self.members, policy)
        return self._finish(now, [])

    def change_members(
        self, now: float, members: Iterable[NodeId], *, policy: QuorumPolicy | None = None
    ) -> list[Action]:
        """Start a joint-consensus change to ``members``; one change at a time.

        Raises NotLeader; ValueError when a change is in progress, when this new leader has not
        yet committed its first entry (retry shortly), or when the new member set is not valid
        for the quorum policy.  The change is done when a ``config`` entry with the new
        members comes out of :meth:`take_applied`.
        """
        self._require_leader()
        self._change_members(now, frozenset(members), policy)
        return self._finish(now, [])

    def _change_members(
        self, now: float, new: frozenset[NodeId], policy: QuorumPolicy | None = None
    ) -> None:
        cur = self._configs[-1]
        if cur.old is not None or cur.index > self.commit_index:
            raise ValueError("a membership change is already in progress")
        if self.commit_index < self._term_start:
            # A ValueError like the other refusals (the contract callers rely on): retry shortly.
            raise ValueError("the new leader has not committed its first entry yet; retry")
        if not new:
            raise ValueError("the cluster cannot have no members")
        policy = policy or cur.policy
        policy.bind(new)  # raises ValueError for a member set the policy cannot serve
        if new == cur.voters and policy == cur.policy:
            return
        # Joint consensus (C_old,new): effective as soon as appended; C_new follows on commit.
        data: dict[str, Any] = {"voters": sorted(new), "old": sorted(cur.voters)}
        data["policy"], data["old_policy"] = policy.to_config(), cur.policy.to_config()
        self._append_local(self.term, K_CONFIG, data)
        for n in sorted(new - cur.everyone()):
            if n != self.id:
                self._peers[n] = _Peer(next=self.last_index, last_ack=now, progress=now)

    # -------------------------------------------------------------- output
    def take_applied(self) -> list[Entry]:
        """Committed entries not yet taken, in log order (see module docstring)."""
        out, self._applied = self._applied, []
        return out

    def snapshot(self, now: float, index: int, state: bytes) -> list[Action]:
        """Compact the log up to ``index``; ``state`` is the applied state after entry ``index``."""
        if index <= self._snap_index:
            return []
        if index > self.last_applied:
            raise ValueError(f"cannot snapshot at {index}: only {self.last_applied} applied")
        cfg = self._config_at(index)
        view = self._view_at(index)
        term = self._term_at(index)
        assert term is not None
        for i in range(self._snap_index + 1, index + 1):
            self._writes[log_key(i)] = None
        del self._log[: index - self._snap_index]
        self._snap_index, self._snap_term, self._snap_state = index, term, state
        self._snap_view = view
        self._configs = [replace(cfg, index=index)] + [c for c in self._configs if c.index > index]
        self._view_hist = [(index, view)] + [h for h in self._view_hist if h[0] > index]
        self._writes[KEY_SNAPSHOT] = _pack(self._snap_record())
        return self._finish(now, [])

    def _snap_record(self) -> dict[str, Any]:
        cfg = self._configs[0]
        view = self._snap_view
        return {
            "index": self._snap_index,
            "term": self._snap_term,
            "state": self._snap_state,
            "voters": sorted(cfg.voters),
            "old": None if cfg.old is None else sorted(cfg.old),
            "policy": cfg.policy.to_config(),
            "old_policy": None if cfg.old_policy is None else cfg.old_policy.to_config(),
            "view_id": view.id,
            "view_members": sorted(view.members),
            "view_live": sorted(view.live),
        }

    def _config_at(self, index: int) -> _Config:
        found = self._configs[0]
        for c in self._configs:
            if c.index <= index:
                found = c
        return found

    def _view_at(self, index: int) -> View:
        found = self._view_hist[0]
        for h in self._view_hist:
            if h[0] <= index:
                found = h
        return found[1]

    def _finish(self, now: float, out: list[Action]) -> list[Action]:
        """Replicate new entries, then emit one Persist for this call's writes (group commit).

        Sends that may only leave once state is durable (vote grants, append acknowledgements)
        are attached to the newest outstanding Persist.
        """
        if self.role == ROLE_LEADER:
            for peer_id, peer in self._peers.items():
                if peer.next <= self.last_index:
                    self._send_append(now, peer_id, peer, out, heartbeat=False)
        if self._writes:
            token = self._next_token()
            writes = tuple(self._writes.items())
            self._writes = {}
            out.append(Persist(token, writes))
            rec = _Pending(token, self.last_index, (self.term, self.voted_for), self._deferred)
            self._pending.append(rec)
            self._pending_by_token[token] = rec
            self._deferred = []
        elif self._deferred:
            if self._pending:
                self._pending[-1].sends.extend(self._deferred)
            else:
                out.extend(self._deferred)
            self._deferred = []
        return out

    def _on_persisted(self, now: float, token: int, out: list[Action]) -> bool:
        rec = self._pending_by_token.pop(token, None)
        if rec is None:
            return False
        rec.done = True
        while self._pending and self._pending[0].done:
            p = self._pending.popleft()
            self._durable_last = p.last_index
            self._durable_hs = p.hard_state
            out.extend(p.sends)
        if self.role == ROLE_CANDIDATE:
            self._maybe_win(now, out)
        elif self.role == ROLE_LEADER:
            self._leader_advance_commit(now, out)
        return True

    # ---------------------------------------------------------- log writes
    def _append_mem(self, term: int, kind: str, data: Any) -> int:
        self._log.append((term, kind, data))
        index = self.last_index
        if kind == K_CONFIG:
            old = data["old"]
            prev = self._configs[-1].policy
            policy = _policy(data.get("policy"), prev)
            self._configs.append(
                _Config(
                    index,
                    frozenset(data["voters"]),
                    None if old is None else frozenset(old),
                    policy,
                    None if old is None else _policy(data.get("old_policy"), prev),
                )
            )
            if self.id in self._configs[-1].everyone():
                self._was_member = True
        return index

    def _append_local(self, term: int, kind: str, data: Any) -> int:
        index = self._append_mem(term, kind, data)
        self._writes[log_key(index)] = _pack([term, kind, data])
        if kind == K_CONFIG:
            self._rebind()
        return index

    def _truncate_from(self, index: int) -> None:
        """Drop entries ``index..`` (never committed ones, except for a non-intersecting reset)."""
        for i in range(index, self.last_index + 1):
            self._writes[log_key(i)] = None
        del self._log[index - self._snap_index - 1 :]
        had_config = len(self._configs)
        self._configs = [self._configs[0]] + [c for c in self._configs[1:] if c.index < index]
        for p in self._pending:
            p.last_index = min(p.last_index, index - 1)
        self._durable_last = min(self._durable_last, index - 1)
        if len(self._configs) != had_config:
            self._rebind()

    def _bind(self, members: frozenset[NodeId], policy: QuorumPolicy) -> Quorum | None:
        if not members:
            return None
        try:
            return policy.bind(members)
        except ValueError:
            # A config the policy rejects (only possible from a log written with other
            # rules, e.g. recovered state): fall back to a plain majority, never crash.
            try:
                return QuorumPolicy.majority(policy.weights).bind(members)
            except ValueError:
                return QuorumPolicy.majority().bind(members)

    def _rebind(self) -> None:
        cfg = self._configs[-1]
        old = None
        if cfg.old is not None:
            old = self._bind(cfg.old, cfg.old_policy or cfg.policy)
        self._quorums = (self._bind(cfg.voters, cfg.policy), old)

    def _has_quorum(self, nodes: Iterable[NodeId]) -> bool:
        q_new, q_old = self._quorums
        nodes = set(nodes)
        if q_new is None or not q_new.reached(nodes):
            return False
        return q_old is None or q_old.reached(nodes)

    def _is_voter(self) -> bool:
        return self.id in self._configs[-1].everyone()

    def _may_campaign(self) -> bool:
        """Whether this node may start an election: a voter of the latest config, or of the
        config in effect before an uncommitted change that removes it.

        A node removed by C_new (appended, not yet committed) may hold the longest log: the
        remaining voters need its vote or its leadership, and it must still campaign until the
        change is final (dissertation §4.2.2; etcd applies a config before it stops campaigning).
        Elected, it counts votes and commits under the latest config (without itself), commits
        C_new with its no-op and steps down when C_new applies (:meth:`_apply_config`).
        """
        latest = self._configs[-1]
        if self.id in latest.everyone():
            return True
        if latest.index <= self.commit_index:
            return False
        return any(self.id in c.everyone() for c in self._configs if c.index <= self.commit_index)

    def _intersecting(self) -> bool:
        return all(q is None or q.intersecting for q in self._quorums)

    # -------------------------------------------------------------- roles
    def _set_hard_state(self, term: int, vote: NodeId | None) -> None:
        self.term, self.voted_for = term, vote
        self._writes[KEY_HARD_STATE] = _pack({"term": term, "vote": vote})

    def _election_delay(self) -> float:
        t = self.cfg.election_timeout
        return t + self._rng.random() * t

    def _set_leader(self, leader: NodeId | None, out: list[Action]) -> None:
        if leader != self.leader:
            self.leader = leader
            self.catch_up_target = None
            out.append(Notify("leader", {"term": self.term, "leader": leader}))
        if leader is not None:
            self._leader_hint = leader

    def _set_role(self, role: str, out: list[Action]) -> None:
        if role != self.role:
            self.role = role
            out.append(Notify("role", {"role": role, "term": self.term}))

    def _become_follower(
        self, now: float, term: int, leader: NodeId | None, out: list[Action]
    ) -> None:
        was_leader = self.role == ROLE_LEADER
        self._transfer = None
        if term > self.term:
            self._set_hard_state(term, None)
        self._set_role(ROLE_FOLLOWER, out)
        self._set_leader(leader, out)
        if was_leader:
            self._peers = {}
            out.append(CancelTimer(TIMER_HEARTBEAT))
        out.append(SetTimer(TIMER_ELECTION, self._election_delay()))

    def _on_started(self, now: float, out: list[Action]) -> None:
        out.append(Notify("role", {"role": self.role, "term": self.term}))
        if self.view.id:
            out.append(Notify("view", self.view.to_dict()))
        out.append(SetTimer(TIMER_ELECTION, self._election_delay()))
        if self._wants_join():
            self._send_join(out)

    def _wants_join(self) -> bool:
        return not self._was_member and bool(self._contacts)

    def _send_join(self, out: list[Action]) -> None:
        if self._leader_hint is not None and self._leader_hint != self.id:
            target = self._leader_hint
            self._leader_hint = None  # fall back to the contacts if the hint goes nowhere
        else:
            target = self._contacts[self._join_target % len(self._contacts)]
            self._join_target += 1
        out.append(Send(target, {"t": "raft.join"}))

    def _on_election_timer(self, now: float, out: list[Action]) -> None:
        if self.role == ROLE_LEADER:
            # Check-quorum: a leader that has not heard from a quorum for a whole election
            # timeout steps down, so a leader cut off in a minority stops claiming leadership.
            recent = {
                p for p, st in self._peers.items() if now - st.last_ack < self.cfg.election_timeout
            }
            recent.add(self.id)
            if not self._has_quorum(recent):
                out.append(
                    Log(
                        "warning",
                        f"raft: leader {self.id} lost quorum in term {self.term}; stepping down",
                    )
                )
                self._become_follower(now, self.term, None, out)
            else:
                out.append(SetTimer(TIMER_ELECTION, self.cfg.election_timeout))
            return
        out.append(SetTimer(TIMER_ELECTION, self._election_delay()))
        if self._wants_join():
            if now - self._leader_contact >= self.cfg.election_timeout:
                self._send_join(out)
            return
        if not self._may_campaign() or self._quorums[0] is None:
            return
        if self.role == ROLE_FOLLOWER and self.leader is not None:
            self._set_leader(None, out)
        self._start_pre_vote(now, out)

    def _next_campaign_term(self) -> int:
        if self._intersecting():
            return self.term + 1
        t = (self.term // _BALLOT_SPACE) * _BALLOT_SPACE + self._ballot
        while t <= self.term:
            t += _BALLOT_SPACE
        return t

    def _start_pre_vote(self, now: float, out: list[Action]) -> None:
        # Pre-vote (dissertation 9.6): ask whether we *could* win before bumping the term, so a
        # node rejoining from a partition cannot depose a healthy leader.
        self._set_role(ROLE_PRE_CANDIDATE, out)
        self._campaign_term = self._next_campaign_term()
        self._votes = {self.id}
        msg = {
            "t": "raft.prevote",
            "term": self._campaign_term,
            "li": self.last_index,
            "lt": self.last_term,
        }
        for n in sorted(self._configs[-1].everyone()):
            if n != self.id:
                out.append(Send(n, msg))
        if self._has_quorum(self._votes):
            self._start_election(now, out)

    def _start_election(self, now: float, out: list[Action], *, force: bool = False) -> None:
        term = self._campaign_term
        if term <= self.term:  # our term moved on during the pre-vote
            term = self._next_campaign_term()
        self._set_hard_state(term, self.id)
        self._set_role(ROLE_CANDIDATE, out)
        self._set_leader(None, out)
        self._votes = set()  # our own vote counts once it is durable (see _maybe_win)
        out.append(SetTimer(TIMER_ELECTION, self._election_delay()))
        msg = {"t": "raft.vote", "term": self.term, "li": self.last_index, "lt": self.last_term}
        if force:
            msg["force"] = True  # a leadership transfer: the old leader asked for this election
        for n in sorted(self._configs[-1].everyone()):
            if n != self.id:
                out.append(Send(n, msg))

    def _maybe_win(self, now: float, out: list[Action]) -> None:
        votes = set(self._votes)
        if self._durable_hs == (self.term, self.id):
            votes.add(self.id)
        if self._has_quorum(votes):
            self._become_leader(now, out)

    def _become_leader(self, now: float, out: list[Action]) -> None:
        self._set_role(ROLE_LEADER, out)
        self._set_leader(self.id, out)
        self._peers = {
            n: _Peer(next=self.last_index + 1, last_ack=now, progress=now)
            for n in sorted(self._configs[-1].everyone())
            if n != self.id
        }
        # The no-op commits everything before it (entries of past terms are never committed by
        # counting replicas, Raft §5.4.2).
        self._term_start = self._append_local(self.term, K_NOOP, None)
        self.catch_up_target = self._term_start
        self._view_inflight = 0
        latest = self._configs[-1]
        if latest.old is not None and latest.index <= self.commit_index:
            # The previous leader died between committing C_old,new and appending C_new:
            # finish the change (when it commits later instead, _apply_config does this).
            self._append_local(self.term, K_CONFIG, _final_config(latest))
        out.append(Log("info", f"raft: {self.id} is leader of term {self.term}"))
        out.append(SetTimer(TIMER_HEARTBEAT, self.cfg.heartbeat_interval))
        out.append(SetTimer(TIMER_ELECTION, self.cfg.election_timeout))
        self._leader_advance_commit(now, out)

    # ---------------------------------------------------------- replication
    def _on_heartbeat_timer(self, now: float, out: list[Action]) -> None:
        if self.role != ROLE_LEADER:
            return
        if self._transfer is not None and now >= self._transfer[1]:
            out.append(Log("warning", f"raft: handing leadership to {self._transfer[0]} timed out"))
            self._transfer = None
        patience = max(self.cfg.election_timeout / 2, 2 * self.cfg.heartbeat_interval)
        for peer_id, peer in self._peers.items():
            if (peer.inflight or peer.next > peer.match + 1) and now - peer.progress > patience:
                # Appends or their answers were lost: restart from what is known to match.
                peer.next = peer.match + 1
                peer.inflight = 0
                peer.progress = now
            self._send_append(now, peer_id, peer, out, heartbeat=True)
        out.append(SetTimer(TIMER_HEARTBEAT, self.cfg.heartbeat_interval))

    def _send_append(
        self, now: float, peer_id: NodeId, peer: _Peer, out: list[Action], *, heartbeat: bool
    ) -> None:
        if peer.reset or peer.next <= self._snap_index:
            if now - peer.snap_sent >= self.cfg.election_timeout / 2:
                peer.snap_sent = now
                rec = self._snap_record()
                rec["term_at"] = rec.pop("term")
                rec.update(t="raft.snap", term=self.term, reset=peer.reset)
                out.append(Send(peer_id, rec))
            return
        if peer.inflight < self.cfg.max_inflight_appends and peer.next <= self.last_index:
            prev = peer.next - 1
            end = min(self.last_index, prev + self.cfg.max_entries_per_append)
            lo = prev - self._snap_index
            ents = self._log[lo : end - self._snap_index]  # tuples travel as msgpack arrays
            out.append(
                Send(
                    peer_id,
                    {
                        "t": "raft.append",
                        "term": self.term,
                        "prev": prev,
                        "pt": self._term_at(prev),
                        "ents": ents,
                        "commit": self.commit_index,
                        "last": self.last_index,
                    },
                )
            )
            peer.next = end + 1
            peer.inflight += 1
            peer.told = max(peer.told, self.commit_index)
        elif heartbeat:
            prev = max(peer.match, self._snap_index)
            peer.told = max(peer.told, min(self.commit_index, prev))
            out.append(
                Send(
                    peer_id,
                    {
                        "t": "raft.append",
                        "term": self.term,
                        "prev": prev,
                        "pt": self._term_at(prev),
                        "ents": [],
                        "commit": min(self.commit_index, prev),
                        "last": self.last_index,
                    },
                )
            )

    def _leader_advance_commit(self, now: float, out: list[Action]) -> None:
        matches = {p: st.match for p, st in self._peers.items()}
        matches[self.id] = self._durable_last
        for n in sorted(set(matches.values()), reverse=True):
            if n <= self.commit_index:
                break
            if self._term_at(n) != self.term:
                continue  # only entries of the current term are committed by counting
            if self._has_quorum(p for p, m in matches.items() if m >= n):
                self._advance_commit_to(n, out)
                self._tell_commit(now, out)
                break

    def _tell_commit(self, now: float, out: list[Action]) -> None:
        """Send the commit index now to idle followers that have not heard it.

        A follower otherwise learns it with the next append, which on a quiet
        cluster is the next heartbeat: a follower-side client of the log (a
        two-phase-commit coordinator waiting for its decision to be applied
        locally) would wait up to a heartbeat interval per entry.  Busy followers
        (an append in flight, or entries to send) hear it with that append.
        """
        for peer_id, peer in self._peers.items():
            if peer.reset or peer.inflight or peer.next <= self.last_index:
                continue
            if min(self.commit_index, max(peer.match, self._snap_index)) > peer.told:
                self._send_append(now, peer_id, peer, out, heartbeat=True)

    def _advance_commit_to(self, index: int, out: list[Action]) -> None:
        if index <= self.commit_index:
            return
        self.commit_index = index
        log, applied, base = self._log, self._applied, self._snap_index + 1
        i = self.last_applied + 1
        while i <= index:
            term, kind, data = log[i - base]
            self.last_applied = i
            if kind == K_CMD:
                applied.append(Entry(i, term, "cmd", data))
            elif kind == K_CONFIG:
                self._apply_config(i, term, data, out)
            elif kind == K_VIEW:
                cur = self.view
                live = frozenset(data["live"]) & cur.members
                self._new_view(i, term, View(cur.id + 1, cur.members, live), "view", {}, out)
            i += 1

    def _apply_config(self, index: int, term: int, data: Any, out: list[Action]) -> None:
        if data["old"] is not None:
            # C_old,new committed: the leader now appends C_new (dissertation §4.3).
            latest = self._configs[-1]
            if self.role == ROLE_LEADER and latest.index == index:
                self._append_local(self.term, K_CONFIG, _final_config(latest))
            return
        members = frozenset(data["voters"])
        cur = self.view
        # Who is live in a membership view: the members live before, plus the added ones (an
        # operator or the node itself just asked for it).  A deterministic function of the log,
        # so every node computes the same view; the leader corrects it with a liveness view.
        live = (cur.live & members) | (members - cur.members)
        policy = self._config_at(index).policy.to_config()
        view = View(cur.id + 1, members, live)
        self._new_view(index, term, view, "config", {"policy": policy}, out)
        if self.role == ROLE_LEADER:
            latest = self._configs[-1]
            if latest.index == index and self.id not in latest.voters:
                out.append(
                    Log("info", f"raft: leader {self.id} removed from the cluster; stepping down")
                )
                self._become_follower(0.0, self.term, None, out)
            else:
                # Forget peers that left.
                for gone in sorted(set(self._peers) - latest.everyone()):
                    del self._peers[gone]

    def _new_view(
        self, index: int, term: int, view: View, kind: str, extra: dict[str, Any], out: list[Action]
    ) -> None:
        self.view = view
        self._view_hist.append((index, view))
        self._applied.append(Entry(index, term, kind, {**view.to_dict(), **extra}))
        out.append(Notify("view", view.to_dict()))

    # ------------------------------------------------------------ messages
    def _log_ok(self, li: int, lt: int) -> bool:
        """Whether a candidate's log (last index ``li``, last term ``lt``) is at least as new."""
        return lt > self.last_term or (lt == self.last_term and li >= self.last_index)

    def _leader_recent(self, now: float) -> bool:
        if self.role == ROLE_LEADER:
            return True
        return self.leader is not None and now - self._leader_contact < self.cfg.election_timeout

    # Vote and pre-vote requests are answered without consulting the configuration
    # (dissertation §4.1): a joiner whose log does not yet hold the config that added it, or a
    # voter that has not yet seen the config adding the candidate, must still vote, or a cluster
    # that needs that vote never elects a leader.  A removed server cannot disrupt: pre-vote and
    # leader stickiness refuse it while a leader is alive, and its log is older than the quorum's.
    def _on_prevote(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        term, li, lt = _int(p, "term"), _int(p, "li"), _int(p, "lt")
        ok = term > self.term and self._log_ok(li, lt) and not self._leader_recent(now)
        # "cur" tells a pre-candidate behind our term to catch up (see _on_prevote_r).
        out.append(Send(sender, {"t": "raft.prevote_r", "term": term, "ok": ok, "cur": self.term}))

    def _on_prevote_r(
        self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]
    ) -> None:
        term, ok = _int(p, "term"), _bool(p, "ok")
        if sender not in self._configs[-1].everyone():
            out.append(Log("warning", f"raft: dropped pre-vote answer from non-voter {sender}"))
            return
        cur = p.get("cur", 0)
        if not _is_int(cur):
            raise _Bad("cur must be an int")
        if not ok and cur > self.term and not self._leader_recent(now):
            # A node reached a higher term in an election it lost and refuses pre-votes for
            # terms <= its own.  Adopt its term so our next pre-vote can win it over; otherwise
            # a node with the newest log but an older term could never be elected (as in etcd).
            self._become_follower(now, cur, None, out)
            return
        if self.role == ROLE_PRE_CANDIDATE and term == self._campaign_term and ok:
            self._votes.add(sender)
            if self._has_quorum(self._votes):
                self._start_election(now, out)

    def _on_vote(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        term, li, lt = _int(p, "term"), _int(p, "li"), _int(p, "lt")
        if term < self.term:
            out.append(Send(sender, {"t": "raft.vote_r", "term": self.term, "ok": False}))
            return
        if term > self.term:
            if self._leader_recent(now) and p.get("force") is not True:
                # Leader stickiness (dissertation §4.2.3): a current leader exists, so this is a
                # removed or partitioned server; do not let it raise our term.
                out.append(
                    Log("debug", f"raft: ignored vote request of {sender} (leader is alive)")
                )
                return
            self._become_follower(now, term, None, out)
        if self.voted_for in (None, sender) and self._log_ok(li, lt):
            self._set_hard_state(term, sender)
            out.append(SetTimer(TIMER_ELECTION, self._election_delay()))
            # Granted only once the vote is durable: attached to this call's Persist.
            self._deferred.append(Send(sender, {"t": "raft.vote_r", "term": term, "ok": True}))
        else:
            out.append(Send(sender, {"t": "raft.vote_r", "term": self.term, "ok": False}))

    def _on_vote_r(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        term, ok = _int(p, "term"), _bool(p, "ok")
        if sender not in self._configs[-1].everyone():
            out.append(Log("warning", f"raft: dropped vote from non-voter {sender}"))
            return
        if term > self.term:
            self._become_follower(now, term, None, out)
        elif self.role == ROLE_CANDIDATE and term == self.term and ok:
            self._votes.add(sender)
            self._maybe_win(now, out)

    def _accept_leader(self, now: float, sender: NodeId, term: int, out: list[Action]) -> bool:
        """Common part of append/snapshot: reject stale leaders, follow current ones."""
        if term < self.term:
            out.append(Log("debug", f"raft: stale term {term} < {self.term} from {sender}"))
            out.append(Send(sender, {"t": "raft.append_r", "term": self.term, "ok": False}))
            return False
        if term > self.term or self.role != ROLE_FOLLOWER or sender != self.leader:
            self._leader_last = 0
        if term > self.term or self.role != ROLE_FOLLOWER:
            self._become_follower(now, term, sender, out)
        else:
            self._set_leader(sender, out)
            out.append(SetTimer(TIMER_ELECTION, self._election_delay()))
        self._leader_contact = now
        return True

    def _on_append(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        term, prev, pt, commit = _int(p, "term"), _int(p, "prev"), _int(p, "pt"), _int(p, "commit")
        ents = _entries(p.get("ents"))
        if prev < 0:
            raise _Bad("negative prev")
        if not self._accept_leader(now, sender, term, out):
            return
        if _is_int(p.get("last")):
            self._leader_last = max(self._leader_last, p["last"])
            if self.catch_up_target is None:
                self.catch_up_target = p["last"]
        base = {"t": "raft.append_r", "term": self.term, "e": 1 if ents else 0}
        if prev < self._snap_index:
            # The append starts inside our snapshot.  Committed entries are identical to the
            # leader's (with an intersecting policy), but we still compare the entry at our
            # snapshot index: after a split brain it may differ.  If the append does not reach
            # that far, ask for what follows the snapshot instead of acknowledging blindly.
            skip = self._snap_index - prev
            if len(ents) < skip:
                if not self._intersecting() and self._leader_last < self._snap_index:
                    # We committed beyond the leader's whole log: only after a split brain.
                    # (The largest "last" seen from this leader, because a delayed append
                    # carries an old one.)
                    self._request_reset(sender, self._snap_index, base, out)
                    return
                nxt = self._snap_index + 1
                out.append(Send(sender, {**base, "ok": False, "prev": prev, "ci": nxt, "ct": None}))
                return
            if ents[skip - 1][0] != self._snap_term:
                self._request_reset(sender, self._snap_index, base, out)
                return
            ents, prev, pt = ents[skip:], self._snap_index, self._snap_term
        if prev > self.last_index:
            out.append(
                Send(
                    sender,
                    {**base, "ok": False, "prev": prev, "ci": self.last_index + 1, "ct": None},
                )
            )
            return
        have = self._term_at(prev)
        if have != pt:
            if prev <= self.commit_index:
                self._request_reset(sender, prev, base, out)
                return
            assert have is not None
            ci = prev
            while ci - 1 > self._snap_index and self._term_at(ci - 1) == have:
                ci -= 1
            out.append(Send(sender, {**base, "ok": False, "prev": prev, "ci": ci, "ct": have}))
            return
        last = self.last_index
        for i, ent in enumerate(ents):
            idx = prev + 1 + i
            if idx <= last:
                if self._term_at(idx) == ent[0]:
                    continue
                if idx <= self.commit_index:
                    self._request_reset(sender, idx, base, out)
                    return
                self._truncate_from(idx)
            for et2, kind2, data2 in ents[i:]:
                self._append_local(et2, kind2, data2)
            break
        match = prev + len(ents)
        self._advance_commit_to(min(commit, match), out)
        self._deferred.append(Send(sender, {**base, "ok": True, "match": match}))

    def _request_reset(
        self, sender: NodeId, index: int, base: dict[str, Any], out: list[Action]
    ) -> None:
        """The leader's log differs from ours at an index we already committed.

        Impossible with an intersecting policy (it would be a bug: logged as an error); expected
        after a split brain with a non-intersecting one.  Either way the leader's log wins: we ask
        for its snapshot and replace our state with it.
        """
        level = "warning" if not self._intersecting() else "error"
        out.append(
            Log(
                level,
                f"raft: {self.id}'s committed entry {index} differs from leader {sender}'s log; "
                "replacing local cluster state with the leader's snapshot",
            )
        )
        self._reset_wanted = True
        out.append(Send(sender, {**base, "ok": False, "reset": True}))

    def _on_append_r(
        self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]
    ) -> None:
        term, ok = _int(p, "term"), _bool(p, "ok")
        if term > self.term:
            self._become_follower(now, term, None, out)
            return
        if self.role != ROLE_LEADER or term != self.term:
            out.append(Log("debug", f"raft: dropped stale append answer from {sender}"))
            return
        peer = self._peers.get(sender)
        if peer is None:
            out.append(Log("warning", f"raft: dropped append answer from unknown node {sender}"))
            return
        peer.last_ack = now
        if p.get("e"):
            peer.inflight = max(0, peer.inflight - 1)
            peer.progress = now
        if ok:
            match = _int(p, "match")
            if match > self.last_index:
                raise _Bad(f"match {match} beyond the leader's log")
            if match > peer.match:
                peer.match = match
                self._leader_advance_commit(now, out)
                if self._transfer is not None and self._transfer[0] == sender:
                    self._maybe_timeout_now(out)
            peer.next = max(peer.next, peer.match + 1)
            self._tell_commit(now, out)  # a follower whose append was in flight at the commit
            return
        if p.get("reset"):
            peer.reset = True
            peer.snap_sent = float("-inf")
            self._send_append(now, sender, peer, out, heartbeat=False)
            return
        rprev, ci = _int(p, "prev"), _int(p, "ci")
        ct = p.get("ct")
        if ct is not None and not _is_int(ct):
            raise _Bad("ct must be an int or None")
        if rprev < peer.match or rprev >= peer.next:
            return  # answer to an append already superseded by a later back-off
        nxt = ci
        if ct is not None:
            j = min(rprev, self.last_index)
            while j > self._snap_index and (self._term_at(j) or 0) > ct:
                j -= 1
            if j > self._snap_index and self._term_at(j) == ct:
                nxt = j + 1
        if ci <= peer.match:
            # The follower holds less than it once acknowledged: it replaced its log (a split
            # brain reset) or lost its disk.  Forget the stale match; only delays commits.
            peer.match = ci - 1
        nxt = max(peer.match + 1, min(nxt, rprev))
        if nxt == peer.probe and now - peer.probe_at < self.cfg.heartbeat_interval:
            # A duplicate rejection of a probe we just sent: do not answer twice (message storms
            # under duplication); a lost probe is retried by the heartbeat.
            return
        peer.probe, peer.probe_at = nxt, now
        peer.next = nxt
        peer.inflight = 0
        peer.progress = now
        self._send_append(now, sender, peer, out, heartbeat=False)

    def _on_snap(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        term, idx, sterm = _int(p, "term"), _int(p, "index"), _int(p, "term_at")
        state = p.get("state")
        if state is not None and not isinstance(state, bytes):
            raise _Bad("state must be bytes or None")
        voters, old = _names(p.get("voters")), p.get("old")
        old_set = None if old is None else _names(old)
        policy = _wire_policy(p.get("policy"), self._initial_policy)
        old_policy = None if old is None else _wire_policy(p.get("old_policy"), policy)
        view_members = _names(p.get("view_members"))
        live = p.get("view_live")
        view = View(
            _int(p, "view_id"), view_members, view_members if live is None else _names(live)
        )
        reset = bool(p.get("reset"))
        if not self._accept_leader(now, sender, term, out):
            return
        reply = {"t": "raft.snap_r", "term": self.term, "match": idx}
        if reset and not self._reset_wanted:
            # A late or duplicated reset snapshot: we asked once and have been repaired since.
            reset = False
        self._reset_wanted = False
        if idx <= self.commit_index and not reset:
            self._deferred.append(Send(sender, reply))
            return
        # The snapshot we already hold and have applied nothing beyond (a duplicated or
        # re-requested InstallSnapshot): installing it again must not hand the same snapshot
        # entry to the state machine a second time; a snapshot always moves the state forward.
        already = (
            idx == self._snap_index
            and sterm == self._snap_term
            and state == self._snap_state
            and self.last_applied == idx
        )
        keep_suffix = not reset and self._term_at(idx) == sterm and idx <= self.last_index
        if keep_suffix:
            for i in range(self._snap_index + 1, idx + 1):
                self._writes[log_key(i)] = None
            del self._log[: idx - self._snap_index]
            suffix_configs = [c for c in self._configs if c.index > idx]
        else:
            self._truncate_from(self._snap_index + 1)
            suffix_configs = []
        self._snap_index, self._snap_term, self._snap_state = idx, sterm, state
        self._snap_view = view
        self._configs = [_Config(idx, voters, old_set, policy, old_policy), *suffix_configs]
        self._view_hist = [(idx, view)]
        self._rebind()
        if self.id in self._configs[-1].everyone():
            self._was_member = True
        self.commit_index = idx if reset else max(self.commit_index, idx)
        self.last_applied = idx
        self.view = view
        self._durable_last = min(self._durable_last, idx)
        if not already:
            self._applied.append(self._snapshot_entry())
            out.append(Notify("view", view.to_dict()))
        self._writes[KEY_SNAPSHOT] = _pack(self._snap_record())
        self._deferred.append(Send(sender, reply))

    def _on_snap_r(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        term, match = _int(p, "term"), _int(p, "match")
        if term > self.term:
            self._become_follower(now, term, None, out)
            return
        if self.role != ROLE_LEADER or term != self.term:
            return
        peer = self._peers.get(sender)
        if peer is None:
            out.append(Log("warning", f"raft: dropped snapshot answer from unknown node {sender}"))
            return
        if match > self.last_index:
            raise _Bad(f"match {match} beyond the leader's log")
        peer.last_ack = now
        peer.progress = now
        peer.reset = False
        peer.snap_sent = float("-inf")
        peer.inflight = 0
        peer.match = max(peer.match, match)
        peer.next = peer.match + 1
        self._leader_advance_commit(now, out)

    def _on_timeout_now(
        self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]
    ) -> None:
        term = _int(p, "term")
        if term != self.term or sender != self.leader or self.role != ROLE_FOLLOWER:
            out.append(Log("debug", f"raft: ignored stale timeout_now from {sender}"))
            return
        if not self._is_voter():
            return
        out.append(Log("info", f"raft: {self.id} campaigns at {sender}'s request"))
        self._campaign_term = self._next_campaign_term()
        self._start_election(now, out, force=True)

    def _on_join(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        if self.role != ROLE_LEADER:
            out.append(Send(sender, {"t": "raft.join_r", "leader": self.leader}))
            return
        if sender in self._configs[-1].everyone() or self._transfer is not None:
            return  # already added (it will hear from us), or we are handing over
        try:
            self._change_members(now, self.members | {sender})
            out.append(Log("info", f"raft: adding {sender} to the cluster at its request"))
        except ValueError as e:
            out.append(Log("info", f"raft: join of {sender} postponed: {e}"))

    def _on_join_r(self, now: float, sender: NodeId, p: dict[str, Any], out: list[Action]) -> None:
        hint = p.get("leader")
        if hint is not None and not isinstance(hint, str):
            raise _Bad("leader must be a node name")
        if hint:
            self._leader_hint = hint


def _policy(cfg: Any, default: QuorumPolicy) -> QuorumPolicy:
    """A policy from its stored ``to_config()`` form; ``default`` when absent (inherited)."""
    return default if cfg is None else QuorumPolicy.from_config(cfg)


def _wire_policy(cfg: Any, default: QuorumPolicy | None) -> QuorumPolicy:
    """Like :func:`_policy` for a message field: anything malformed is a :class:`_Bad`."""
    if cfg is None and default is not None:
        return default
    if not isinstance(cfg, dict):
        raise _Bad("policy must be a dict")
    try:
        return QuorumPolicy.from_config(cfg)
    except (ValueError, TypeError) as e:
        raise _Bad(f"bad policy: {e}")


def _final_config(joint: _Config) -> dict[str, Any]:
    """The C_new entry that completes the joint configuration ``joint``."""
    return {"voters": sorted(joint.voters), "old": None, "policy": joint.policy.to_config()}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_MAX_INT = (1 << 63) - 1  # what msgpack (and our own Persist) can carry


def _int(p: Mapping[str, Any], key: str) -> int:
    v = p.get(key)
    if not _is_int(v):
        raise _Bad(f"field {key!r} must be an int, got {type(v).__name__}")
    assert isinstance(v, int)
    if not 0 <= v <= _MAX_INT:
        raise _Bad(f"field {key!r} out of range: {v}")
    return v


def _bool(p: Mapping[str, Any], key: str) -> bool:
    v = p.get(key)
    if not isinstance(v, bool):
        raise _Bad(f"field {key!r} must be a bool, got {type(v).__name__}")
    return v


def _names(v: Any) -> frozenset[NodeId]:
    if not isinstance(v, list | tuple) or not all(isinstance(n, str) for n in v):
        raise _Bad("expected a list of node names")
    return frozenset(v)


def _entries(v: Any) -> list[tuple[int, str, Any]]:
    if not isinstance(v, list | tuple):
        raise _Bad("ents must be a list")
    out: list[tuple[int, str, Any]] = []
    kinds = _KINDS
    for e in v:
        # type() instead of isinstance(): this runs once per replicated entry, and it also
        # rejects bools posing as ints.
        if not (
            type(e) in (list, tuple)
            and len(e) == 3
            and type(e[0]) is int
            and 0 <= e[0] <= _MAX_INT
            and type(e[1]) is str
            and e[1] in kinds
        ):
            raise _Bad("malformed entry")
        data = e[2]
        if e[1] == K_CONFIG:
            if not isinstance(data, dict):
                raise _Bad("malformed config entry")
            old, policy, old_policy = data.get("old"), data.get("policy"), data.get("old_policy")
            data = {
                "voters": sorted(_names(data.get("voters"))),
                "old": None if old is None else sorted(_names(old)),
            }
            if policy is not None:
                data["policy"] = _wire_policy(policy, None).to_config()
            if old_policy is not None:
                data["old_policy"] = _wire_policy(old_policy, None).to_config()
        elif e[1] == K_VIEW:
            if not isinstance(data, dict):
                raise _Bad("malformed view entry")
            data = {"live": sorted(_names(data.get("live")))}
        out.append((e[0], e[1], data))
    return out


Raft._HANDLERS = {
    "raft.prevote": Raft._on_prevote,
    "raft.prevote_r": Raft._on_prevote_r,
    "raft.vote": Raft._on_vote,
    "raft.vote_r": Raft._on_vote_r,
    "raft.append": Raft._on_append,
    "raft.append_r": Raft._on_append_r,
    "raft.snap": Raft._on_snap,
    "raft.snap_r": Raft._on_snap_r,
    "raft.join": Raft._on_join,
    "raft.timeout_now": Raft._on_timeout_now,
    "raft.join_r": Raft._on_join_r,
}
