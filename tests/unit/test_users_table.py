"""The users table of the cluster log: requests, applying, answers, snapshots (G5)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from nonstop import errors
from nonstop.model.wire import raise_error
from nonstop.net.auth import make_verifier
from nonstop.runtime.interface import Notify, Reply, SetTimer
from nonstop.security.users_table import GIVE_UP, RESEND, TABLE, UsersLogTable, entry_for

VERIFIER = make_verifier("pw", n=2**10).to_wire()


class FakeCluster:
    """What the table needs of the cluster node: its name, incarnation, ``caught_up``,
    ``enabled``, the leader its Raft knows, and ``submit``."""

    name = "A"
    incarnation = 7
    caught_up = True
    enabled = True

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []
        self.raft = SimpleNamespace(leader="A", role="leader")

    def submit(self, now: float, table: str, entry: dict[str, Any]) -> list[Any]:
        assert table == TABLE
        entry["r"] = [self.name, self.incarnation]  # as ClusterNode.submit stamps it
        self.submitted.append(entry)
        return []


def test_a_change_is_answered_when_applied_here() -> None:
    cluster = FakeCluster()
    table = UsersLogTable(cluster)  # type: ignore[arg-type]
    add = {"op": "user.add", "user": "alice", "roles": ["app"], "verifier": VERIFIER}
    assert table.on_client(0.0, 41, add) == [SetTimer("node:tbl:users:1", RESEND)]
    entry = cluster.submitted[0]
    actions = table.apply(5, entry)
    assert Reply(41, {"ok": True, "user": "alice", "index": 5}) in actions
    assert any(isinstance(a, Notify) and a.kind == "user" for a in actions)
    found = table.lookup("alice")
    assert found is not None and found[1] == ["app"]
    # Another node applies the same entry: same state, nobody to answer there.
    other = UsersLogTable(type("B", (FakeCluster,), {"name": "B"})())  # type: ignore[arg-type]
    assert not any(isinstance(a, Reply) for a in other.apply(5, dict(entry)))
    assert other.snapshot() == table.snapshot()


def test_refusals_and_snapshots() -> None:
    cluster = FakeCluster()
    table = UsersLogTable(cluster, reserved=lambda: frozenset({"root"}))  # type: ignore[arg-type]
    table.apply(1, {TABLE: "add", "u": "bob", "v": VERIFIER, "roles": ["monitor"]})
    add_again = {"op": "user.add", "user": "bob", "roles": ["app"], "verifier": VERIFIER}
    reply = table.on_client(0.0, 1, add_again)
    assert reply is not None and reply[0].payload["error"] == "BadArgument"  # type: ignore[attr-defined]
    for bad in (
        {"op": "user.remove", "user": "nobody"},
        {"op": "user.add", "user": "root", "roles": ["admin"], "verifier": VERIFIER},
        {"op": "user.add", "user": "x", "roles": [], "verifier": VERIFIER},
        {"op": "user.add", "user": "x y", "roles": ["app"], "verifier": VERIFIER},
        {"op": "user.passwd", "user": "bob", "verifier": {"salt": b"x"}},
    ):
        reply = table.on_client(0.0, 2, bad)
        assert reply is not None and reply[0].payload["error"] == "BadArgument", bad  # type: ignore[attr-defined]
    assert cluster.submitted == []  # nothing malformed reaches the log
    assert table.on_client(0.0, 3, {"op": "status"}) is None  # not ours
    listing = table.on_client(0.0, 4, {"op": "user.list"})
    assert listing == [Reply(4, {"users": [{"user": "bob", "roles": ["monitor"]}]})]
    cluster.caught_up = False  # a restarted node, before a leader told it what followed
    stale = table.on_client(0.0, 5, {"op": "user.list"})
    assert stale is not None and stale[0].payload["error"] == "Unavailable"  # type: ignore[attr-defined]
    cluster.caught_up = True
    table.apply(2, {TABLE: "roles", "u": "bob", "roles": ["operator"]})
    restored = UsersLogTable(cluster)  # type: ignore[arg-type]
    restored.restore(table.snapshot())
    assert restored.lookup("bob") is not None and restored.lookup("bob")[1] == ["operator"]  # type: ignore[index]
    restored.apply(3, {TABLE: "remove", "u": "bob"})
    assert restored.lookup("bob") is None
    restored.restore(None)
    assert restored.users == {}


def test_forwarded_entries_are_validated() -> None:
    table = UsersLogTable(FakeCluster())  # type: ignore[arg-type]
    good = entry_for({"op": "user.add", "user": "c", "roles": ["app"], "verifier": VERIFIER})
    assert table.forwarded("B", {**good, "q": 3}) == {**good, "q": 3}
    assert table.forwarded("B", {TABLE: "add", "u": "c", "roles": ["app"]}) is None
    assert table.forwarded("B", {TABLE: "drop", "u": "c"}) is None


def test_a_change_without_a_leader_fails_at_once_with_a_retryable_error() -> None:
    """issue 11 (G2): a node that knows no cluster-log leader (an election) cannot put a
    change into the log; it says so at once (``NoLeader``, an ``Unavailable``: nothing
    was changed, retry) instead of dropping it and leaving the admin to wait for the
    client's whole timeout."""
    cluster = FakeCluster()
    table = UsersLogTable(cluster)  # type: ignore[arg-type]
    add = {"op": "user.add", "user": "alice", "roles": ["app"], "verifier": VERIFIER}
    for leader, role in ((None, "follower"), ("A", "candidate")):
        cluster.raft = SimpleNamespace(leader=leader, role=role)
        (reply,) = table.on_client(0.0, 1, add) or []
        assert isinstance(reply, Reply) and reply.payload["error"] == "NoLeader"
        assert "no cluster-log leader" in reply.payload["message"]
        with pytest.raises(errors.NoLeader, match="retry"):
            raise_error(reply.payload)
        assert issubclass(errors.NoLeader, errors.Unavailable)
    cluster.raft = SimpleNamespace(leader="B", role="follower")
    cluster.enabled = False  # Disabled (D16): another node may have quorum
    (reply,) = table.on_client(0.0, 2, add) or []
    assert isinstance(reply, Reply) and reply.payload["error"] == "QuorumLost"
    assert cluster.submitted == []  # nothing sent: a retry is safe


def test_a_change_lost_with_its_leader_is_sent_again_and_applied_once() -> None:
    """A change forwarded to a leader that died is sent again every ``RESEND`` s under the
    same tag; if both copies reach the log, every node applies it once."""
    cluster = FakeCluster()
    cluster.raft = SimpleNamespace(leader="C", role="follower")
    table = UsersLogTable(cluster)  # type: ignore[arg-type]
    table.apply(1, {TABLE: "add", "u": "bob", "v": VERIFIER, "roles": ["monitor"]})
    timer = SetTimer("node:tbl:users:1", RESEND)
    assert table.on_client(0.0, 9, {"op": "user.remove", "user": "bob"}) == [timer]
    cluster.raft = SimpleNamespace(leader="B", role="follower")  # C died; B was elected
    assert table.on_timer(RESEND, "1") == [timer]
    first, again = cluster.submitted
    assert first == again and first["q"] == 1
    other = UsersLogTable(type("B", (FakeCluster,), {"name": "B"})())  # type: ignore[arg-type]
    other.restore(table.snapshot())
    assert Reply(9, {"ok": True, "user": "bob", "index": 2}) in table.apply(2, dict(first))
    table.apply(3, {TABLE: "add", "u": "bob", "v": VERIFIER, "roles": ["app"]})  # re-added
    assert table.apply(4, dict(again)) == []  # the same change: not applied twice
    for index, entry in (
        (2, first),
        (3, {TABLE: "add", "u": "bob", "v": VERIFIER, "roles": ["app"]}),
        (4, again),
    ):
        other.apply(index, dict(entry))
    assert table.lookup("bob") is not None and other.snapshot() == table.snapshot()
    assert table.on_timer(2 * RESEND, "1") == []  # applied: nothing more to send

    # Never applied (no leader for GIVE_UP seconds): a Timeout that says it may still be.
    table.on_client(10.0, 11, {"op": "user.remove", "user": "bob"})
    (reply,) = table.on_timer(10.0 + GIVE_UP, "2")
    assert isinstance(reply, Reply) and reply.payload["error"] == "Timeout"
    assert "may still be" in reply.payload["message"]


def test_on_a_cluster_node_timers_come_back_and_a_lone_node_refuses_at_once() -> None:
    """The table on a real ``ClusterNode``: its timers (``node:tbl:users:<tag>``) come
    back to ``on_timer``, and a node of three that is alone (Disabled) answers a change at once."""
    import random

    from nonstop.cluster.node import ClusterConfig, ClusterNode
    from nonstop.runtime.interface import ClientRequest, Started, TimerFired

    config = ClusterConfig("a", "sim://a", 1, members=("a", "b", "c"))
    node = ClusterNode(config, random.Random(1), {})
    table = UsersLogTable(node)
    node.register_table(table)
    fired: list[str] = []
    table.on_timer = lambda now, rest: fired.append(rest) or []  # type: ignore[method-assign]
    node.handle(Started(0.0))
    add = {"op": "user.add", "user": "alice", "roles": ["app"], "verifier": VERIFIER}
    replies = [a for a in node.handle(ClientRequest(0.1, 5, add)) if isinstance(a, Reply)]
    assert [r.payload["error"] for r in replies] == ["QuorumLost"]  # Disabled: D16
    node.handle(TimerFired(0.2, "node:tbl:users:17"))
    assert fired == ["17"]
