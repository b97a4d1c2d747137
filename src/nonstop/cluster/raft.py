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

Membership (leader only, one change at a time; joint consensus, see below)::

    actions = raft.add_member(now, "n4")     # raises NotLeader, or ValueError when a change is
    actions = raft.remove_member(now, "n2")  # pending / the member set is invalid for the policy
    actions = raft.change_members(now, {"n1", "n3", "n4"})

Consuming the committed log::

    for entry in raft.take_applied():        # committed entries, in log order
        entry.kind == "cmd"       # entry.data is the proposed command
        entry.kind == "config"    # entry.data == {"members": [...], "view_id": int}: a new view
        entry.kind == "snapshot"  # entry.data == {"state": bytes, "members": [...],
                                  #   "view_id": int}: REPLACE the applied state with ``state``
                                  #   (a snapshot installed from the leader, or the local snapshot
                                  #   after a restart); entries after it follow.

Every committed entry is returned exactly once per incarnation, in index order (leader no-ops and
the intermediate joint-consensus entries are applied internally and not returned).  After a
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
``members`` (voters of the latest *appended* config, in effect for this node's quorums),
``view_id`` / ``view_members`` (the latest *committed* view: the counter of committed membership
changes, 1 for the bootstrap view, identical sequence on every node), ``quorum`` (the bound
:class:`~nonstop.cluster.quorum.Quorum` for ``members``).

Notifications emitted as actions: ``Notify("leader", {"term", "leader"})`` when the known leader
changes, ``Notify("view", {"view_id", "members"})`` when a membership change commits,
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
voters (in joint consensus: a quorum of the old *and* of the new voters).  With a non-intersecting
policy (``off``, or ``allow_non_intersecting=True``) two leaders can exist at the same time on two
sides of a partition and the log can diverge; see ``docs/design/cluster-log.md`` for exactly what
that means.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nonstop.cluster.quorum import Quorum, QuorumPolicy
from nonstop.runtime.interface import Action, Event, NodeId

ROLE_FOLLOWER = "follower"
ROLE_PRE_CANDIDATE = "pre_candidate"
ROLE_CANDIDATE = "candidate"
ROLE_LEADER = "leader"

TIMER_ELECTION = "raft.election"
TIMER_HEARTBEAT = "raft.heartbeat"


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Tunables.  Election timeouts are uniform in [election_timeout, 2 * election_timeout)."""

    election_timeout: float = 1.0
    heartbeat_interval: float = 0.1
    max_entries_per_append: int = 4096
    max_inflight_appends: int = 4
    join_retry_interval: float = 0.5


@dataclass(frozen=True, slots=True)
class Entry:
    """A committed entry handed to the state machine above (see module docstring)."""

    index: int
    term: int
    kind: str
    data: Any


class Raft:
    """One node's Raft replica of the cluster log.  See the module docstring for the contract."""

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
        raise NotImplementedError

    def handle(self, event: Event) -> list[Action]:
        raise NotImplementedError

    def propose(self, now: float, command: Any, *, flush: bool = True) -> tuple[int, list[Action]]:
        raise NotImplementedError

    def propose_batch(self, now: float, commands: Iterable[Any]) -> tuple[int, list[Action]]:
        raise NotImplementedError

    def flush(self, now: float) -> list[Action]:
        raise NotImplementedError

    def add_member(self, now: float, node: NodeId) -> list[Action]:
        raise NotImplementedError

    def remove_member(self, now: float, node: NodeId) -> list[Action]:
        raise NotImplementedError

    def change_members(self, now: float, members: Iterable[NodeId]) -> list[Action]:
        raise NotImplementedError

    def take_applied(self) -> list[Entry]:
        raise NotImplementedError

    def snapshot(self, now: float, index: int, state: bytes) -> list[Action]:
        raise NotImplementedError

    role: str
    term: int
    leader: NodeId | None
    commit_index: int
    last_applied: int
    last_index: int
    members: frozenset[NodeId]
    view_id: int
    view_members: frozenset[NodeId]
    quorum: Quorum
