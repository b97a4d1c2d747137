"""Raft (the cluster log) in isolation, driven by the tests' small deterministic driver.

The driver (:class:`nonstop.sim.harness.Harness`) is deliberately small: a heap of timed
events, a network that can delay, drop and partition, per-node disks whose writes become
durable (and ``Persisted`` is delivered) after a delay, crashes that lose what was not yet
durable.  SIM's full simulator tests the composition; this file tests the protocol.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import pytest

from nonstop.cluster.quorum import QuorumPolicy
from nonstop.cluster.raft import (
    ROLE_LEADER,
    TIMER_ELECTION,
    Entry,
    Raft,
    RaftConfig,
    log_key,
)
from nonstop.errors import NotLeader
from nonstop.runtime.interface import (
    Action,
    Log,
    Persist,
    Persisted,
    Received,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.sim.core import Disk
from nonstop.sim.harness import Harness

FAST = RaftConfig(election_timeout=0.15, heartbeat_interval=0.03)


def roundtrip(payload: Any) -> Any:
    """What the wire does to a payload (rule 4 of the runtime contract)."""
    return msgpack.unpackb(msgpack.packb(payload, use_bin_type=True), raw=False)


class StateMachine:
    """The state above Raft in these tests: the list of applied commands, plus the views."""

    def __init__(self) -> None:
        self.cmds: list[Any] = []
        self.views: list[tuple[int, list[str]]] = []
        self.last = 0

    def apply(self, e: Entry, strict: bool = True) -> None:
        if e.kind == "snapshot":
            # Within one incarnation a snapshot only ever moves the state forward, except for
            # a split-brain reset under a non-intersecting policy.
            assert not strict or self.last == 0 or e.index > self.last, (e.index, self.last)
            st = e.data["state"]
            self.cmds = [] if st is None else msgpack.unpackb(st, raw=False)["cmds"]
            self.views = [(e.data["view_id"], e.data["members"])] if e.data["view_id"] else []
        else:
            assert e.index > self.last, f"entry {e.index} applied after {self.last}"
            if e.kind == "cmd":
                self.cmds.append(e.data)
            elif e.kind == "config":
                self.views.append((e.data["view_id"], e.data["members"]))
        self.last = e.index

    def state(self) -> bytes:
        return msgpack.packb({"cmds": self.cmds}, use_bin_type=True)


class Cluster(Harness):
    """A deterministic little world of Raft nodes, on the tests' driver (nonstop.sim.harness).

    Besides driving them, it checks on every step: one leader per term, views identical
    everywhere, and the same entry at each committed index (state-machine safety).
    """

    def __init__(
        self,
        names: Iterable[str],
        seed: int = 0,
        *,
        policy: QuorumPolicy | None = None,
        cfg: RaftConfig = FAST,
        latency: tuple[float, float] = (0.001, 0.004),
        disk: tuple[float, float] = (0.0002, 0.001),
        drop: float = 0.0,
        dup: float = 0.0,
        start: bool = True,
    ) -> None:
        super().__init__(
            rng=random.Random(seed), latency=latency, drop=drop, duplicate=dup, disk=disk
        )
        self.names = list(names)
        self.seed = seed
        self.policy = policy
        self.cfg = cfg
        self.tokens = itertools.count(1)
        self.nodes: dict[str, Raft] = {}  # the latest incarnation of each, crashed or not
        self.sm: dict[str, StateMachine] = {}
        self.leaders: dict[int, str] = {}  # term -> leader (election safety)
        self.committed: dict[int, tuple[int, str, Any]] = {}  # index -> (term, kind, data)
        self.views: dict[int, list[str]] = {}  # view id -> members, identical everywhere
        self.strict = policy is None or policy.bind(self.names).intersecting
        self.observers.append(self._check)
        if start:
            for n in self.names:
                self.start(n, bootstrap=self.names)

    # ------------------------------------------------------------ plumbing
    def start(
        self,
        name: str,
        *,
        bootstrap: list[str] | None = None,
        contacts: list[str] | None = None,
        recovered: dict[bytes, bytes] | None = None,
    ) -> Raft:
        if name not in self.names:
            self.names.append(name)
        if recovered is not None:
            self.disks[name] = Disk(durable=dict(recovered))
        node = Raft(
            name,
            random.Random(self.rng.random()),
            dict(self.durable(name)),
            bootstrap_members=bootstrap,
            contacts=contacts if contacts is not None else [n for n in self.names if n != name],
            policy=self.policy,
            config=self.cfg,
            next_token=self.tokens.__next__,
        )
        self.nodes[name] = node
        self.sm[name] = StateMachine()
        self.boot(name, node)
        return node

    def restart(self, name: str, **kw: Any) -> Raft:
        return self.start(name, **kw)

    def _check(self, name: str, event: Any, actions: list[Action]) -> None:
        node = self.nodes[name]
        if node.role == ROLE_LEADER and self.strict:
            prev = self.leaders.setdefault(node.term, name)
            assert prev == name, f"two leaders in term {node.term}: {prev} and {name}"
        self.drain(name)

    def drain(self, name: str) -> None:
        node, sm = self.nodes[name], self.sm[name]
        for e in node.take_applied():
            sm.apply(e, self.strict)
            if not self.strict:
                continue  # a non-intersecting policy may legitimately commit divergent entries
            if e.kind == "config":
                vid = e.data["view_id"]
                seen = self.views.setdefault(vid, e.data["members"])
                assert seen == e.data["members"], f"{name}: view {vid} = {e.data}, others {seen}"
            if e.kind in ("cmd", "config"):
                key = (e.term, e.kind, e.data)
                prev = self.committed.setdefault(e.index, key)
                assert prev == key, f"{name} applied {key} at {e.index}, others {prev}"

    def run_until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        try:
            super().run_until(done, timeout)
        except AssertionError as e:
            raise AssertionError(f"{e} (seed {self.seed})") from None

    # ------------------------------------------------------------- helpers
    def leader(self) -> str | None:
        best = None
        for n in sorted(self.up):
            node = self.nodes[n]
            if node.role == ROLE_LEADER and (best is None or node.term > self.nodes[best].term):
                best = n
        return best

    def wait_leader(self, timeout: float = 10.0) -> str:
        self.run_until(lambda: self.leader() is not None, timeout)
        name = self.leader()
        assert name is not None
        return name

    def propose(self, cmd: Any, via: str | None = None) -> int:
        name = via or self.wait_leader()
        index, actions = self.nodes[name].propose(self.now, cmd)
        self.execute(name, actions)
        return index

    def propose_batch(self, cmds: list[Any], via: str | None = None) -> int:
        name = via or self.wait_leader()
        first, actions = self.nodes[name].propose_batch(self.now, cmds)
        self.execute(name, actions)
        return first

    def snapshot(self, name: str) -> None:
        node, sm = self.nodes[name], self.sm[name]
        self.execute(name, node.snapshot(self.now, sm.last, sm.state()))

    def cmds(self, name: str) -> list[Any]:
        return self.sm[name].cmds

    def converged(self, names: Iterable[str] | None = None) -> bool:
        """A leader exists and every node has committed and applied its whole log."""
        names = sorted(names or self.up)
        leader = self.leader()
        if leader is None:
            return False
        last = self.nodes[leader].last_index
        return (
            all(
                self.nodes[n].commit_index == last
                and self.nodes[n].last_applied == last
                and self.nodes[n].last_index == last
                for n in names
            )
            and len({tuple(map(repr, self.cmds(n))) for n in names}) == 1
        )

    def errors(self) -> list[str]:
        return [f"{n}: {log.message}" for n, log in self.logs if log.level == "error"]


NAMES3 = ["n1", "n2", "n3"]


# =================================================================== basics
def test_election_one_leader_and_bootstrap_view() -> None:
    c = Cluster(NAMES3, seed=1)
    leader = c.wait_leader()
    c.run(1.0)
    assert c.leader() == leader
    assert [c.nodes[n].leader for n in NAMES3] == [leader] * 3
    for n in NAMES3:
        assert c.nodes[n].view_id == 1
        assert c.nodes[n].view_members == frozenset(NAMES3)
        assert c.sm[n].views == [(1, NAMES3)]
    assert not c.errors()


def test_replication_in_order_on_all_nodes() -> None:
    c = Cluster(NAMES3, seed=2)
    for i in range(50):
        c.propose(f"cmd{i}")
    c.propose_batch([f"b{i}" for i in range(50)])
    c.run_until(lambda: all(len(c.cmds(n)) == 100 for n in NAMES3))
    want = [f"cmd{i}" for i in range(50)] + [f"b{i}" for i in range(50)]
    for n in NAMES3:
        assert c.cmds(n) == want


def test_propose_on_follower_raises_not_leader_with_hint() -> None:
    c = Cluster(NAMES3, seed=3)
    leader = c.wait_leader()
    c.run(0.2)
    follower = next(n for n in NAMES3 if n != leader)
    with pytest.raises(NotLeader) as exc:
        c.nodes[follower].propose(c.now, "x")
    assert exc.value.leader == leader


def test_leader_crash_reelection_keeps_committed() -> None:
    c = Cluster(NAMES3, seed=4)
    old = c.wait_leader()
    for i in range(20):
        c.propose(i)
    c.run_until(lambda: all(len(c.cmds(n)) == 20 for n in NAMES3))
    old_term = c.nodes[old].term
    c.crash(old)
    new = c.wait_leader()
    assert new != old and c.nodes[new].term > old_term
    for i in range(20, 30):
        c.propose(i)
    rest = [n for n in NAMES3 if n != old]
    c.run_until(lambda: all(len(c.cmds(n)) == 30 for n in rest))
    c.restart(old)
    c.run_until(lambda: len(c.cmds(old)) == 30)
    assert c.cmds(old) == list(range(30))


def test_partitioned_old_leader_cannot_commit_and_steps_down() -> None:
    c = Cluster(NAMES3, seed=5)
    old = c.wait_leader()
    c.propose("before")
    c.run_until(lambda: all(c.cmds(n) == ["before"] for n in NAMES3))
    rest = [n for n in NAMES3 if n != old]
    c.partition([old], rest)
    lost_index = c.propose("lost", via=old)
    c.run(3 * FAST.election_timeout)
    assert c.nodes[old].commit_index < lost_index
    assert c.nodes[old].role != ROLE_LEADER  # check-quorum made it step down
    new = c.leader()
    assert new in rest
    c.propose("after", via=new)
    c.run_until(lambda: all(c.cmds(n) == ["before", "after"] for n in rest))
    c.heal()
    c.run_until(lambda: c.converged())
    assert c.cmds(old) == ["before", "after"]


def test_prevote_rejoining_node_does_not_disrupt_leader() -> None:
    c = Cluster(NAMES3, seed=6)
    leader = c.wait_leader()
    c.run(0.3)
    term = c.nodes[leader].term
    loner = next(n for n in NAMES3 if n != leader)
    c.partition([loner], [n for n in NAMES3 if n != loner])
    c.run(10 * FAST.election_timeout)
    assert c.nodes[loner].term == term  # pre-vote never succeeded, so the term did not grow
    c.heal()
    c.run(1.0)
    assert c.leader() == leader and c.nodes[leader].term == term


# ============================================================ durability
def _elect_manually(node: Raft, peers: list[str], now: float = 0.0) -> list[Action]:
    """Drive ``node`` to leadership by hand; returns every action it emitted."""
    acts = node.handle(Started(now))
    acts += node.handle(TimerFired(now + 1, TIMER_ELECTION))
    pre = [a for a in acts if isinstance(a, Send) and a.payload["t"] == "raft.prevote"]
    for p in peers:
        acts += node.handle(
            Received(
                now + 1, p, {"t": "raft.prevote_r", "term": pre[0].payload["term"], "ok": True}
            )
        )
    persists = [a for a in acts if isinstance(a, Persist)]
    for p in persists:
        acts += node.handle(Persisted(now + 1, p.token))
    for p in peers:
        acts += node.handle(
            Received(now + 1, p, {"t": "raft.vote_r", "term": node.term, "ok": True})
        )
    return acts


def test_vote_granted_only_after_persisted() -> None:
    node = Raft("n1", random.Random(0), {}, bootstrap_members=NAMES3, config=FAST)
    boot = [a for a in node.handle(Started(0.0)) if isinstance(a, Persist)]
    assert len(boot) == 1  # the bootstrap config entry
    acts = node.handle(Received(0.1, "n2", {"t": "raft.vote", "term": 5, "li": 9, "lt": 3}))
    persists = [a for a in acts if isinstance(a, Persist)]
    grants = [a for a in acts if isinstance(a, Send) and a.payload.get("ok")]
    assert persists and not grants, "vote sent before it was durable"
    assert node.term == 5 and node.voted_for == "n2"
    # A second request in the meantime must not be granted either (same term, other candidate).
    acts2 = node.handle(Received(0.1, "n3", {"t": "raft.vote", "term": 5, "li": 9, "lt": 3}))
    assert not [a for a in acts2 if isinstance(a, Send) and a.payload.get("ok")]
    # Durability completes out of order: the vote's write first, the earlier bootstrap write
    # later.  The grant waits for every earlier write as well.
    done = node.handle(Persisted(0.2, persists[-1].token))
    assert not [a for a in done if isinstance(a, Send) and a.payload.get("ok")]
    done = node.handle(Persisted(0.3, boot[0].token))
    grants = [a for a in done if isinstance(a, Send) and a.payload.get("ok")]
    assert grants == [Send("n2", {"t": "raft.vote_r", "term": 5, "ok": True})]


def test_append_acknowledged_only_after_persisted() -> None:
    node = Raft("n2", random.Random(0), {}, bootstrap_members=NAMES3, config=FAST)
    boot = [a for a in node.handle(Started(0.0)) if isinstance(a, Persist)]
    msg = {
        "t": "raft.append",
        "term": 1,
        "prev": 1,
        "pt": 0,
        "ents": [[1, "n", None], [1, "c", "x"]],
        "commit": 1,
    }
    acts = node.handle(Received(0.1, "n1", msg))
    assert [a for a in acts if isinstance(a, Persist)]
    assert not [a for a in acts if isinstance(a, Send)]
    tokens = [a.token for a in acts if isinstance(a, Persist)]
    # Persisted events may complete out of order; acks wait for every earlier write too.
    assert not [a for a in node.handle(Persisted(0.2, tokens[-1])) if isinstance(a, Send)]
    oks = [a for a in node.handle(Persisted(0.3, boot[0].token)) if isinstance(a, Send)]
    assert oks and oks[0].payload["ok"] and oks[0].payload["match"] == 3


def test_leader_counts_itself_only_after_persisted_and_figure8_rule() -> None:
    """Raft §5.4.2 / Figure 8: an old-term entry on a majority is not committed by counting."""
    rec = {
        b"raft/hs": msgpack.packb({"term": 3, "vote": None}),
        log_key(1): msgpack.packb([0, "m", {"voters": NAMES3, "old": None}]),
        log_key(2): msgpack.packb([2, "c", "old-term"]),
    }
    node = Raft("n1", random.Random(0), rec, config=FAST)
    acts = _elect_manually(node, ["n2", "n3"])
    assert node.role == ROLE_LEADER and node.term == 4
    noop_persist = [a for a in acts if isinstance(a, Persist)][-1]
    # n2 acknowledges the old-term entry only: a majority (n1, n2) holds index 2, yet no commit.
    node.handle(Received(1.1, "n2", {"t": "raft.append_r", "term": 4, "ok": True, "match": 2}))
    assert node.commit_index == 1
    # n2 acknowledges the no-op, but the leader's own copy is not durable yet: still no commit.
    node.handle(Received(1.2, "n2", {"t": "raft.append_r", "term": 4, "ok": True, "match": 3}))
    assert node.commit_index == 1
    node.handle(Persisted(1.3, noop_persist.token))
    assert node.commit_index == 3
    assert [e.data for e in node.take_applied() if e.kind == "cmd"] == ["old-term"]


def test_restart_from_recovered_keeps_committed_entries() -> None:
    c = Cluster(NAMES3, seed=7)
    c.wait_leader()
    for i in range(30):
        c.propose(i)
    c.run_until(lambda: all(len(c.cmds(n)) == 30 for n in NAMES3))
    c.run(0.2)
    for n in NAMES3:
        c.crash(n)
    c.clock.clear()  # type: ignore[attr-defined]  # nothing in flight survives
    for n in NAMES3:
        c.restart(n, bootstrap=NAMES3)
    c.wait_leader()
    c.propose("new")
    c.run_until(lambda: all(len(c.cmds(n)) == 31 for n in NAMES3))
    for n in NAMES3:
        assert c.cmds(n) == [*range(30), "new"]
        assert c.sm[n].views == [(1, NAMES3)]


def test_malformed_messages_are_dropped_with_a_log() -> None:
    node = Raft("n1", random.Random(0), {}, bootstrap_members=NAMES3, config=FAST)
    node.handle(Started(0.0))
    bad: list[Any] = [
        {"t": "raft.append"},
        {"t": "raft.append", "term": "1", "prev": 0, "pt": 0, "ents": [], "commit": 0},
        {"t": "raft.append", "term": 1, "prev": 0, "pt": 0, "ents": [[1, "zz", 1]], "commit": 0},
        {"t": "raft.append", "term": 1, "prev": 0, "pt": 0, "ents": "no", "commit": 0},
        {"t": "raft.vote", "term": 1},
        {"t": "raft.vote_r", "term": 1, "ok": "yes"},
        {"t": "raft.snap", "term": 1, "index": 3},
        {"t": "raft.append_r", "term": 0, "ok": True, "match": 99},
        {"t": "raft.nonsense"},
        {"t": "raft.join_r", "leader": 7},
    ]
    for p in bad:
        acts = node.handle(Received(0.1, "n2", p))
        assert any(isinstance(a, Log) for a in acts), p
    # Answers from unknown senders are dropped (vote *requests* are answered whatever the
    # configuration says, dissertation §4.1: see test_votes_are_answered_without_...).
    acts = node.handle(Received(0.1, "zz", {"t": "raft.vote_r", "term": 0, "ok": True}))
    assert any(isinstance(a, Log) for a in acts)
    assert node.term == 0
    # Not Raft's business at all: ignored silently.
    assert node.handle(Received(0.1, "n2", {"t": "fd.ping"})) == []
    assert node.handle(Received(0.1, "n2", [1, 2])) == []
    assert node.handle(TimerFired(0.1, "fd.tick")) == []
    assert node.handle(Persisted(0.1, 12345)) == []


# ============================================================ log repair
def _recovered_log(terms: list[int], members: list[str], term: int) -> dict[bytes, bytes]:
    """A durable store holding the bootstrap config at 1 and entries of ``terms`` after it."""
    rec = {
        b"raft/hs": msgpack.packb({"term": term, "vote": None}),
        log_key(1): msgpack.packb([0, "m", {"voters": members, "old": None}]),
    }
    for i, t in enumerate(terms):
        rec[log_key(i + 2)] = msgpack.packb([t, "c", f"t{t}-i{i + 2}"])
    return rec


def test_figure7_followers_with_missing_and_conflicting_entries_are_repaired() -> None:
    """Raft Figure 7: a term-8 leader repairs followers (a)-(f) by fast back-off."""
    logs = {
        "L": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6],
        "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
        "b": [1, 1, 1, 4],
        "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
        "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
        "e": [1, 1, 1, 4, 4, 4, 4],
        "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
    }
    names = list(logs)
    c = Cluster(names, seed=8, start=False)
    for n, terms in logs.items():
        c.start(n, recovered=_recovered_log(terms, names, 7))
    # Let L campaign first: the others' election timers are still far away.
    c.deliver("L", TimerFired(c.now, TIMER_ELECTION))
    c.run_until(lambda: c.leader() is not None, timeout=0.1)
    assert c.leader() == "L" and c.nodes["L"].term == 8
    c.run_until(lambda: c.converged(), timeout=5)
    want = [f"t{t}-i{i + 2}" for i, t in enumerate(logs["L"])]
    for n in names:
        assert c.cmds(n) == want, n
        assert c.nodes[n].last_index == 12  # 1 config + 10 entries + the term-8 no-op
    # The back-off is fast: far fewer appends than one per conflicting entry per follower.
    appends = [s for _, s in c.sends if s.payload["t"] == "raft.append" and s.payload["ents"]]
    assert len(appends) < 40


# ============================================================== snapshots
def test_snapshot_compacts_and_is_installed_on_a_lagging_follower() -> None:
    c = Cluster(NAMES3, seed=9)
    leader = c.wait_leader()
    lagger = next(n for n in NAMES3 if n != leader)
    others = [n for n in NAMES3 if n != lagger]
    c.partition([lagger], others)
    for i in range(100):
        c.propose(i)
    c.run_until(lambda: all(len(c.cmds(n)) == 100 for n in others))
    for n in others:
        c.snapshot(n)
        assert c.nodes[n].snapshot_index == c.nodes[n].last_applied
    c.run(0.05)
    for n in others:
        assert not [
            k
            for k in c.durable(n)
            if k.startswith(b"raft/log/")
            and int.from_bytes(k[9:], "big") <= c.nodes[n].snapshot_index
        ]
    for i in range(100, 110):
        c.propose(i)
    c.heal()
    c.run_until(lambda: c.converged(), timeout=5)
    assert c.cmds(lagger) == list(range(110))
    assert any(s.payload["t"] == "raft.snap" for _, s in c.sends)
    # The installed snapshot survives a restart of the lagger: state rebuilt from it + the log.
    c.crash(lagger)
    c.restart(lagger)
    c.run_until(lambda: c.converged(), timeout=5)
    assert c.cmds(lagger) == list(range(110))
    first = c.nodes[lagger]
    assert first.snapshot_index > 0


def test_restart_reapplies_from_local_snapshot() -> None:
    c = Cluster(NAMES3, seed=10)
    c.wait_leader()
    for i in range(10):
        c.propose(i)
    c.run_until(lambda: all(len(c.cmds(n)) == 10 for n in NAMES3))
    c.snapshot("n2")
    c.run(0.1)
    c.crash("n2")
    node = c.restart("n2")
    assert c.sm["n2"].cmds == list(range(10))  # from the snapshot entry, at once
    assert node.view_id == 1
    c.propose("x")
    c.run_until(lambda: c.cmds("n2") == [*range(10), "x"])


def test_a_restarted_follower_knows_when_it_caught_up_with_the_leader() -> None:
    """``catch_up_target``: the end of the log as the leader first told it (None before).

    A node whose applied state (users, decisions) matters for a decision waits until
    it applied that far (ClusterNode.caught_up): right after a restart it only has
    its snapshot, not what was committed while it was down.
    """
    c = Cluster(NAMES3, seed=12)
    c.wait_leader()
    for i in range(5):
        c.propose(i)
    c.run_until(lambda: all(len(c.cmds(n)) == 5 for n in NAMES3))
    c.snapshot("n2")
    c.run(0.1)
    c.crash("n2")
    for i in range(5, 9):
        c.propose(i)  # committed by n0 and n1 while n2 is down
    c.run_until(lambda: len(c.cmds("n1")) == 9)
    node = c.restart("n2")
    assert node.catch_up_target is None and len(c.cmds("n2")) == 5
    c.run_until(lambda: node.catch_up_target is not None)
    assert node.catch_up_target >= c.nodes[node.leader or ""].commit_index - 1 >= 9
    c.run_until(lambda: node.last_applied >= (node.catch_up_target or 0))
    assert c.cmds("n2") == list(range(9))  # caught up: everything committed before it
    leader = c.nodes[node.leader or ""]
    assert leader.catch_up_target is not None  # a leader's own target: its no-op


# ============================================================= membership
def test_membership_join_and_remove_with_monotonic_identical_views() -> None:
    c = Cluster(NAMES3, seed=11)
    c.wait_leader()
    c.propose("a")
    c.run(0.2)
    # A node started later with an empty store joins by asking (AddServer).
    c.start("n4", bootstrap=None, contacts=NAMES3)
    c.run_until(lambda: all(c.nodes[n].view_id == 2 for n in [*NAMES3, "n4"]), timeout=5)
    assert c.nodes["n4"].view_members == frozenset([*NAMES3, "n4"])
    c.propose("b")
    c.run_until(lambda: c.converged(), timeout=5)
    assert c.cmds("n4") == ["a", "b"]
    # Remove a follower, then the leader itself.
    leader = c.wait_leader()
    victim = next(n for n in NAMES3 if n != leader)
    c.execute(leader, c.nodes[leader].remove_member(c.now, victim))
    with pytest.raises(ValueError):
        c.nodes[leader].remove_member(c.now, "n4")  # one change at a time
    live = [n for n in [*NAMES3, "n4"] if n != victim]
    c.run_until(lambda: all(c.nodes[n].view_id == 3 for n in live), timeout=5)
    c.crash(victim)
    c.run(0.2)
    leader = c.wait_leader()
    c.execute(leader, c.nodes[leader].remove_member(c.now, leader))
    rest = [n for n in live if n != leader]
    c.run_until(lambda: all(c.nodes[n].view_id == 4 for n in rest), timeout=5)
    new = c.wait_leader()
    assert new != leader
    assert c.nodes[new].members == frozenset(rest)
    c.propose("c", via=new)
    c.run_until(lambda: c.converged(rest), timeout=5)
    views = {n: c.sm[n].views for n in rest}
    first = views[rest[0]]
    assert all(v == first for v in views.values())
    assert [v for v, _ in first] == [1, 2, 3, 4]
    assert first[-1][1] == sorted(rest)


def test_membership_change_rejected_when_policy_cannot_serve_it() -> None:
    c = Cluster(NAMES3, seed=12, policy=QuorumPolicy.minimum_votes(3))
    leader = c.wait_leader()
    c.run(0.2)
    with pytest.raises(ValueError, match="never be reached"):
        c.nodes[leader].remove_member(c.now, next(n for n in NAMES3 if n != leader))


def test_weighted_votes_decide_elections_and_commits() -> None:
    # n1 carries 3 of 5 votes: it alone is a majority; n2 + n3 together are not.
    c = Cluster(NAMES3, seed=13, policy=QuorumPolicy.majority({"n1": 3}))
    c.wait_leader()
    c.run(0.3)
    c.crash("n1")
    c.run(2.0)
    assert c.leader() is None
    c.restart("n1")
    c.crash("n2")
    c.crash("n3")
    assert c.wait_leader() == "n1"
    c.propose("alone")
    c.run_until(lambda: c.cmds("n1") == ["alone"])


# ==================================================== quorum off / split brain
def test_quorum_off_both_sides_commit_and_the_higher_term_wins_on_heal() -> None:
    c = Cluster(NAMES3, seed=14, policy=QuorumPolicy.off())
    c.wait_leader()
    c.propose("common")
    c.run_until(lambda: all(c.cmds(n) == ["common"] for n in NAMES3))
    c.partition(["n1"], ["n2", "n3"])
    c.run(1.0)
    lead_a = [n for n in NAMES3 if c.nodes[n].role == ROLE_LEADER and n == "n1"]
    lead_b = [n for n in ["n2", "n3"] if c.nodes[n].role == ROLE_LEADER]
    assert lead_a and lead_b, "with quorum off each side has a leader"
    c.propose("side-a", via="n1")
    c.propose("side-b", via=lead_b[0])
    c.committed.clear()  # the two sides legitimately commit different entries at one index
    c.run(0.5)
    assert c.cmds("n1") == ["common", "side-a"]
    assert c.cmds(lead_b[0]) == ["common", "side-b"]
    c.heal()
    c.committed.clear()
    c.run_until(lambda: c.converged() and c.leader() is not None, timeout=10)
    final = c.cmds("n1")
    assert final in (["common", "side-a"], ["common", "side-b"])
    assert all(c.cmds(n) == final for n in NAMES3)
    assert any("differs from leader" in log.message for _, log in c.logs)
    assert not c.errors()


# ======================================================= randomized safety
def check_log_matching(c: Cluster) -> None:
    """Raft's Log Matching property over every pair of live in-memory logs."""
    logs = {}
    for n in c.up:
        node = c.nodes[n]
        logs[n] = {node.snapshot_index + 1 + i: e for i, e in enumerate(node._log)}
    names = sorted(logs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            common = sorted(set(logs[a]) & set(logs[b]), reverse=True)
            agree = next((k for k in common if logs[a][k][0] == logs[b][k][0]), None)
            if agree is None:
                continue
            for k in common:
                if k <= agree:
                    assert logs[a][k] == logs[b][k], f"{a}/{b} differ at {k} below {agree}"


def run_random_schedule(seed: int, duration: float = 2.0, *, off: bool = False) -> Cluster:
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(rng.choice([3, 3, 5]))]
    policy = (
        QuorumPolicy.off()
        if off
        else rng.choice(
            [
                None,
                None,
                QuorumPolicy.majority({"n0": 2}),
                QuorumPolicy.minimum_votes(len(names) // 2 + 1),
                QuorumPolicy.vote_percentage(60),
            ]
        )
    )
    c = Cluster(
        names,
        seed=seed,
        policy=policy,
        drop=rng.choice([0.0, 0.02, 0.1]),
        dup=rng.choice([0.0, 0.05]),
        latency=(0.0005, rng.choice([0.003, 0.02])),
        disk=(0.0001, rng.choice([0.001, 0.01])),
    )
    down: set[str] = set()
    counter = itertools.count()
    end = c.now + duration
    while c.now < end:
        c.run(rng.uniform(0.005, 0.05))
        r = rng.random()
        if r < 0.03 and len(down) < (len(names) - 1) // 2 + 1:
            victim = rng.choice(names)
            if victim not in down:
                c.crash(victim)
                down.add(victim)
        elif r < 0.08 and down:
            back = rng.choice(sorted(down))
            down.discard(back)
            c.restart(back)
        elif r < 0.11:
            cut = rng.sample(names, rng.randint(1, len(names) - 1))
            c.partition(cut, [n for n in names if n not in cut])
        elif r < 0.16:
            c.heal()
        elif r < 0.18:
            n = rng.choice(sorted(set(names) - down))
            if c.sm[n].last > c.nodes[n].snapshot_index:
                c.snapshot(n)
        elif r < 0.22 and (lead := c.leader()) is not None and rng.random() < 0.3:
            try:  # hand leadership over (to the most up-to-date voter)
                c.execute(lead, c.nodes[lead].transfer_leadership(c.now))
            except (ValueError, NotLeader):
                pass
        elif r < 0.22 and (lead := c.leader()) is not None:
            # Membership changes under faults: remove a member or add a non-member back.
            node = c.nodes[lead]
            outsiders = sorted(set(names) - node.members)
            if outsiders and (len(node.members) < 3 or rng.random() < 0.5):
                new = node.members | {rng.choice(outsiders)}
            else:
                new = node.members - {rng.choice(sorted(node.members - {lead}))}
            new_policy = None
            if not off and rng.random() < 0.25:  # the D16 policy can change too (a config entry)
                new_policy = rng.choice(
                    [QuorumPolicy.majority(), QuorumPolicy.majority({rng.choice(names): 2})]
                )
            try:
                c.execute(lead, node.change_members(c.now, new, policy=new_policy))
            except (ValueError, NotLeader):
                pass  # a change in progress, a first entry not committed yet, or a hand-over
        leader = c.leader()
        if leader is not None and c.nodes[leader]._transfer is None:
            if rng.random() < 0.5:
                c.propose(next(counter), via=leader)
            else:
                c.propose_batch([next(counter) for _ in range(rng.randint(1, 20))], via=leader)
        check_log_matching(c)
    # Heal everything: the cluster must converge (liveness after faults stop).
    c.heal()
    c.drop = 0.0
    for n in sorted(down):
        c.restart(n)

    def settled() -> bool:
        leader = c.leader()
        return leader is not None and c.nodes[leader]._transfer is None

    c.run_until(settled, timeout=20)
    c.propose("final")

    def members_converged() -> bool:
        leader = c.leader()
        return leader is not None and c.converged(c.nodes[leader].members)

    c.run_until(members_converged, timeout=20)
    check_log_matching(c)
    leader = c.leader()
    assert leader is not None
    views = {tuple(c.sm[n].views[-1][1]) for n in c.nodes[leader].members}
    assert views == {tuple(sorted(c.nodes[leader].view_members))}
    assert not c.errors(), c.errors()
    return c


@pytest.mark.parametrize(
    "block", [pytest.param(b, marks=pytest.mark.long) if b >= 5 else b for b in range(10)]
)
def test_randomized_election_safety_and_log_matching(block: int) -> None:
    """Many seeds of crashes, restarts, partitions, drops and duplicates.

    Blocks of 30 seeds: ``make test`` runs blocks 0-4 (150 seeds), ``make test-long``
    the other five (seeds 150-299), so the two together still cover the 300 seeds.

    The harness asserts election safety (one leader per term) and state-machine safety (one
    entry per committed index) on every step; log matching is checked after every step of the
    schedule; at the end every node must converge on the same log.
    """
    for seed in range(block * 30, block * 30 + 30):
        run_random_schedule(seed)


def test_randomized_quorum_off_keeps_one_leader_per_term_and_reconverges() -> None:
    """With quorum off the sides of a partition diverge, but never two leaders share a term
    (ballot terms), and after healing every node converges on one log."""
    for seed in range(40):
        c = run_random_schedule(10_000 + seed, off=True)
        assert not c.strict


# ============================================================ performance
def test_group_commit_throughput_three_nodes() -> None:
    """>= 5,000 entries/s committed on 3 nodes, measured in wall time for all three nodes
    together (one thread runs everything, msgpack round trips included).  Proposals are
    buffered (``flush=False``) and flushed in groups: one Persist and one append per peer per
    group, pipelined."""
    c = Cluster(NAMES3, seed=1, latency=(0.0002, 0.0004), disk=(0.0005, 0.001))
    leader = c.wait_leader()
    c.run(0.1)
    node = c.nodes[leader]
    n_entries, group = 20_000, 200
    c.sends.clear()
    persists_before = node._next_token()
    started = time.perf_counter()
    for start in range(0, n_entries, group):
        for i in range(start, start + group):
            node.propose(c.now, i, flush=False)
        c.execute(leader, node.flush(c.now))
        c.run(0.002)
    c.run_until(lambda: all(len(c.cmds(n)) == n_entries for n in NAMES3), timeout=60)
    elapsed = time.perf_counter() - started
    rate = n_entries / elapsed
    appends = sum(1 for _, s in c.sends if s.payload["t"] == "raft.append")
    persists = node._next_token() - persists_before  # tokens are shared by the whole cluster
    print(
        f"\n3-node commit rate: {rate:,.0f} entries/s wall; {appends} appends, {persists} persists"
    )
    assert rate >= 5_000
    assert appends < n_entries / 20
    assert persists < n_entries / 10


def test_candidate_needs_its_own_durable_vote_to_win() -> None:
    node = Raft("n1", random.Random(0), {}, bootstrap_members=NAMES3, config=FAST)
    boot = [a for a in node.handle(Started(0.0)) if isinstance(a, Persist)]
    node.handle(Persisted(0.0, boot[0].token))
    acts = node.handle(TimerFired(1.0, TIMER_ELECTION))
    term = next(a for a in acts if isinstance(a, Send)).payload["term"]
    acts = node.handle(Received(1.0, "n2", {"t": "raft.prevote_r", "term": term, "ok": True}))
    vote_persist = [a for a in acts if isinstance(a, Persist)]
    assert node.role == "candidate" and vote_persist
    # n2's vote alone is not a majority of 3; with our own (not yet durable) one it would be.
    node.handle(Received(1.0, "n2", {"t": "raft.vote_r", "term": node.term, "ok": True}))
    assert node.role == "candidate"
    node.handle(Persisted(1.1, vote_persist[0].token))
    assert node.role == ROLE_LEADER


def test_joiner_receives_the_leaders_snapshot() -> None:
    c = Cluster(NAMES3, seed=15)
    c.wait_leader()
    for i in range(40):
        c.propose(i)
    c.run_until(lambda: all(len(c.cmds(n)) == 40 for n in NAMES3))
    for n in NAMES3:
        c.snapshot(n)
    c.run(0.1)
    c.start("n4", bootstrap=None, contacts=["n2"])  # a contact that may not be the leader
    c.run_until(lambda: c.nodes["n4"].view_id == 2 and c.cmds("n4") == list(range(40)), 5)
    assert c.sm["n4"].views[0][0] == 1  # the view of the snapshot, then the join
    assert c.sm["n4"].views[-1] == (2, sorted([*NAMES3, "n4"]))


def _mutations(rng: random.Random, payload: dict[str, Any]) -> dict[str, Any]:
    weird: list[Any] = [None, -1, 0, 2**70, "x", b"\x00", [], {}, [[1]], 1.5, True, {"a": 1}]
    p = dict(payload)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(sorted(p))
        r = rng.random()
        if r < 0.3 and key != "t":
            del p[key]
        elif r < 0.7:
            p[key] = rng.choice(weird)
        elif isinstance(p[key], list) and p[key]:
            items = list(p[key])
            i = rng.randrange(len(items))
            items[i] = rng.choice(weird) if rng.random() < 0.5 else [rng.choice(weird)] * 3
            p[key] = items
        else:
            p[key] = rng.choice(weird)
    return p


def test_fuzzed_messages_never_raise() -> None:
    """Mutated copies of real Raft messages, fed to every node: dropped or handled, never raised."""
    c = Cluster(NAMES3, seed=16)
    c.wait_leader()
    for i in range(20):
        c.propose(i)
    c.run(0.3)
    c.snapshot(c.wait_leader())
    c.start("n4", bootstrap=None, contacts=NAMES3)
    c.run(0.5)
    samples = [s.payload for _, s in c.sends if isinstance(s.payload, dict)]
    kinds = {p["t"] for p in samples}
    assert {"raft.append", "raft.append_r", "raft.vote", "raft.snap", "raft.join"} <= kinds
    rng = random.Random(16)
    c.strict = False  # forged messages may break safety (Raft is not Byzantine-tolerant)
    for _ in range(3000):
        p = _mutations(rng, rng.choice(samples))
        target = rng.choice(sorted(c.up))
        c.deliver(target, Received(c.now, rng.choice([*NAMES3, "n4", "zz"]), p))


def test_quorum_policy_changes_through_the_log() -> None:
    """D16 policies are cluster state: a committed (joint) configuration change, like members."""
    c = Cluster(NAMES3, seed=17)
    leader = c.wait_leader()
    c.run(0.2)
    assert all(c.nodes[n].policy == QuorumPolicy.majority() for n in NAMES3)
    # A policy the members cannot serve is refused before anything is appended.
    with pytest.raises(ValueError):
        c.nodes[leader].change_policy(c.now, QuorumPolicy.minimum_votes(4))
    # Give the leader 3 of 5 votes: from then on it commits alone.
    heavy = QuorumPolicy.majority({leader: 3})
    c.execute(leader, c.nodes[leader].change_policy(c.now, heavy))
    c.run_until(lambda: all(c.nodes[n].view_id == 2 for n in NAMES3), timeout=5)
    for n in NAMES3:
        assert c.nodes[n].policy == heavy
        assert c.nodes[n].quorum is not None and c.nodes[n].quorum.threshold == 3
        assert c.sm[n].views[-1] == (2, NAMES3)
    for n in NAMES3:
        if n != leader:
            c.crash(n)
    c.propose("alone", via=leader)
    c.run_until(lambda: c.cmds(leader) == ["alone"], timeout=2)
    # The policy survives restarts (it is in the log / snapshot, not only in memory).
    c.snapshot(leader)
    c.run(0.05)
    c.crash(leader)
    node = c.restart(leader, bootstrap=NAMES3)
    assert node.policy == heavy
    assert c.wait_leader() == leader


def test_policy_change_needs_old_and_new_quorums() -> None:
    """While C_old,new is in effect, commits need a quorum under the old *and* the new policy."""
    c = Cluster(NAMES3, seed=18)
    leader = c.wait_leader()
    c.run(0.2)
    others = [n for n in NAMES3 if n != leader]
    # Partition one follower away, then ask for "all three votes": the joint entry can reach a
    # majority of the old policy, but never 3 votes of the new one.
    c.partition([others[0]], [leader, others[1]])
    c.execute(leader, c.nodes[leader].change_policy(c.now, QuorumPolicy.minimum_votes(3)))
    index = c.nodes[leader].last_index
    c.run(0.5)
    assert c.nodes[leader].commit_index < index
    assert c.nodes[leader].in_joint_consensus
    c.heal()
    c.run_until(lambda: all(c.nodes[n].view_id == 2 for n in NAMES3), timeout=5)
    assert all(c.nodes[n].policy == QuorumPolicy.minimum_votes(3) for n in NAMES3)


def test_leadership_transfer() -> None:
    c = Cluster(NAMES3, seed=19)
    old = c.wait_leader()
    for i in range(10):
        c.propose(i)
    c.run(0.1)
    target = next(n for n in NAMES3 if n != old)
    term = c.nodes[old].term
    c.execute(old, c.nodes[old].transfer_leadership(c.now, target))
    with pytest.raises(NotLeader) as exc:
        c.nodes[old].propose(c.now, "during")
    assert exc.value.leader == target
    # Well before any election timeout could fire (0.15 s), the target leads.
    c.run_until(lambda: c.leader() == target, timeout=0.05)
    assert c.nodes[target].term > term
    c.propose("after", via=target)
    c.run_until(lambda: c.converged(), timeout=2)
    assert c.cmds(old) == [*range(10), "after"]
    # Default target: the most up-to-date other voter; a bad target is refused.
    with pytest.raises(ValueError):
        c.nodes[target].transfer_leadership(c.now, "nobody")
    c.execute(target, c.nodes[target].transfer_leadership(c.now))
    c.run_until(lambda: c.leader() not in (None, target), timeout=0.05)


def test_leadership_transfer_to_unreachable_target_times_out() -> None:
    c = Cluster(NAMES3, seed=20)
    old = c.wait_leader()
    c.run(0.1)
    target = next(n for n in NAMES3 if n != old)
    c.crash(target)
    c.propose("x", via=old)  # the target can no longer be up to date
    c.execute(old, c.nodes[old].transfer_leadership(c.now, target))
    c.run(2 * FAST.election_timeout)
    assert c.leader() == old
    c.propose("y", via=old)  # proposals are taken again after giving up
    c.run_until(lambda: c.cmds(old) == ["x", "y"], timeout=1)


def test_voter_removed_by_an_uncommitted_config_still_campaigns() -> None:
    """Seeds 1651/5420: the node C_new removes holds the longest log; until C_new commits it
    must campaign (dissertation §4.2.2), else the others, needing its vote, never elect."""
    rec = _recovered_log([1], NAMES3, 1)
    rec[log_key(3)] = msgpack.packb([1, "m", {"voters": ["n1", "n2"], "old": NAMES3}])
    rec[log_key(4)] = msgpack.packb([1, "m", {"voters": ["n1", "n2"], "old": None}])
    node = Raft("n3", random.Random(0), rec, config=FAST)
    assert node.members == {"n1", "n2"} and node.commit_index == 1
    acts = node.handle(Started(0.0)) + node.handle(TimerFired(1.0, TIMER_ELECTION))
    pre = {a.to for a in acts if isinstance(a, Send) and a.payload["t"] == "raft.prevote"}
    assert pre == {"n1", "n2"}
    # Once C_new is known committed, a removed node stays quiet.
    node.commit_index = 4
    acts = node.handle(TimerFired(5.0, TIMER_ELECTION))
    assert not [a for a in acts if isinstance(a, Send) and a.payload["t"] == "raft.prevote"]


def test_votes_are_answered_without_consulting_the_configuration() -> None:
    """Seeds 2200, 3541, 4246, 4288, 4577, 6095: a joiner whose log does not hold the config
    adding it yet (empty log) must answer (pre-)votes of a candidate it does not know (§4.1)."""
    joiner = Raft("n4", random.Random(0), {}, contacts=["n1"], config=FAST)
    joiner.handle(Started(0.0))
    acts = joiner.handle(Received(5.0, "n1", {"t": "raft.prevote", "term": 3, "li": 7, "lt": 2}))
    answers = [a for a in acts if isinstance(a, Send) and a.payload["t"] == "raft.prevote_r"]
    assert answers and answers[0].payload["ok"] is True
    acts = joiner.handle(Received(5.0, "n1", {"t": "raft.vote", "term": 3, "li": 7, "lt": 2}))
    for p in [a for a in acts if isinstance(a, Persist)]:
        acts += joiner.handle(Persisted(5.0, p.token))
    grants = [a for a in acts if isinstance(a, Send) and a.payload["t"] == "raft.vote_r"]
    assert grants and grants[0].payload["ok"] is True


def test_duplicated_install_snapshot_is_delivered_once() -> None:
    """A duplicated (or re-requested) InstallSnapshot of the snapshot already installed and
    applied must not hand the same snapshot entry to the state machine again."""
    node = Raft("n2", random.Random(0), {}, bootstrap_members=NAMES3, config=FAST)
    node.handle(Started(0.0))
    node.take_applied()
    snap = {
        "t": "raft.snap",
        "term": 2,
        "index": 9,
        "term_at": 2,
        "state": b"s9",
        "voters": NAMES3,
        "old": None,
        "policy": QuorumPolicy.majority().to_config(),
        "old_policy": None,
        "view_id": 1,
        "view_members": NAMES3,
        "reset": False,
    }
    node.handle(Received(1.0, "n1", snap))
    assert [e.kind for e in node.take_applied()] == ["snapshot"]
    node.handle(Received(1.1, "n1", snap))  # plain duplicate
    node._reset_wanted = True  # a reset asked for again in between, then the same snapshot
    node.handle(Received(1.2, "n1", {**snap, "reset": True}))
    assert node.take_applied() == []
    assert node.last_applied == node.commit_index == node.snapshot_index == 9


def test_liveness_views_are_committed_one_at_a_time_and_survive_restarts() -> None:
    """A view is (id, members, live); the leader commits liveness views through the log,
    at most one in flight; ids count every view, identically everywhere, across restarts."""
    c = Cluster(NAMES3, seed=21)
    leader = c.wait_leader()
    c.run(0.1)
    lr = c.nodes[leader]
    assert lr.view == (1, frozenset(NAMES3), frozenset(NAMES3))  # bootstrap: all live
    down = next(n for n in NAMES3 if n != leader)
    c.execute(leader, lr.propose_view(c.now, set(NAMES3) - {down}))
    assert lr.view_in_flight
    assert lr.propose_view(c.now, {leader}) == []  # one in flight at a time
    c.run_until(lambda: all(c.nodes[n].view_id == 2 for n in NAMES3), timeout=5)
    assert lr.propose_view(c.now, set(NAMES3) - {down}) == []  # nothing changed
    for n in NAMES3:
        assert c.nodes[n].view_live == frozenset(NAMES3) - {down}
        assert c.nodes[n].view_members == frozenset(NAMES3)
    c.execute(leader, lr.propose_view(c.now, NAMES3))
    c.run_until(lambda: all(c.nodes[n].view_id == 3 for n in NAMES3), timeout=5)
    for n in NAMES3:
        c.snapshot(n)
    c.crash(down)
    c.restart(down)
    c.run_until(lambda: c.nodes[down].view_id == 3, timeout=5)
    assert c.nodes[down].view == c.nodes[leader].view


def test_a_follower_told_the_leader_is_down_campaigns_soon() -> None:
    c = Cluster(NAMES3, seed=22)
    leader = c.wait_leader()
    c.run(0.1)
    follower = next(n for n in NAMES3 if n != leader)
    acts = c.nodes[follower].leader_unreachable(c.now)
    timers = [a for a in acts if isinstance(a, SetTimer) and a.name == TIMER_ELECTION]
    assert timers and timers[0].delay < 2 * FAST.heartbeat_interval
    assert c.nodes[follower].leader is None
    # A leader, or a follower without a leader, ignores it.
    assert c.nodes[leader].leader_unreachable(c.now) == []


def test_idle_followers_learn_a_commit_at_once_not_at_the_next_heartbeat() -> None:
    # A follower-side user of the log (a two-phase-commit coordinator waiting for its
    # decision entry to apply locally) must not wait a heartbeat interval per entry on
    # a quiet cluster.  Heartbeats every 1 s here; every entry must apply everywhere
    # within a few message latencies (<= 4 ms each) and disk writes (<= 1 ms).
    slow_heartbeat = RaftConfig(election_timeout=3.0, heartbeat_interval=1.0)
    c = Cluster(NAMES3, seed=11, cfg=slow_heartbeat)
    leader = c.wait_leader(timeout=30)
    c.run_until(c.converged, timeout=10)
    followers = [n for n in NAMES3 if n != leader]
    for i in range(5):
        c.run(0.3)  # quiet: nothing in flight
        start = c.now
        c.propose(f"quiet{i}")
        c.run_until(lambda i=i: all(f"quiet{i}" in c.cmds(n) for n in NAMES3), timeout=0.9)
        assert c.now - start < 0.05, f"entry {i} applied on the followers after {c.now - start}s"
        for n in followers:
            assert c.nodes[n].commit_index == c.nodes[leader].commit_index
    assert c.errors() == []
