"""The users table of the cluster log: requests, applying, answers, snapshots (G5)."""

from __future__ import annotations

from typing import Any

from nonstop.net.auth import make_verifier
from nonstop.runtime.interface import Notify, Reply
from nonstop.security.users_table import TABLE, UsersLogTable, entry_for

VERIFIER = make_verifier("pw", n=2**10).to_wire()


class FakeCluster:
    """What the table needs of the cluster node: its name, incarnation, ``caught_up``
    and ``submit``."""

    name = "A"
    incarnation = 7
    caught_up = True

    def __init__(self) -> None:
        self.submitted: list[dict[str, Any]] = []

    def submit(self, now: float, table: str, entry: dict[str, Any]) -> list[Any]:
        assert table == TABLE
        entry["r"] = [self.name, self.incarnation]  # as ClusterNode.submit stamps it
        self.submitted.append(entry)
        return []


def test_a_change_is_answered_when_applied_here() -> None:
    cluster = FakeCluster()
    table = UsersLogTable(cluster)  # type: ignore[arg-type]
    add = {"op": "user.add", "user": "alice", "roles": ["app"], "verifier": VERIFIER}
    assert table.on_client(0.0, 41, add) == []
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
