"""The partition table (ha.md sections 2-3): every entry, every transition, every bad input."""

from __future__ import annotations

from typing import Any

from nonstop.cluster.node import ClusterConfig, ClusterNode
from nonstop.ha.partition_table import (
    ACTIVE,
    INITIAL,
    MIGRATING,
    REPLICATING,
    UNAVAILABLE,
    PartitionTable,
    define_entry,
    disable_entry,
    drop_entry,
    enable_entry,
    failover_entry,
    restored_entry,
    well_formed,
)
from nonstop.ha.policies import ASYNC, SYNC, PartitionDef
from nonstop.runtime.interface import Log, Notify

ABC = PartitionDef("P", (("a", SYNC), ("b", SYNC), ("c", SYNC)), "static")


class World:
    """A table plus the committed view it reads, and a log index counter."""

    def __init__(self, members: tuple[str, ...] = ("a", "b", "c", "d")) -> None:
        self.members = list(members)
        self.live = list(members)
        self.table = PartitionTable(lambda: self.members, lambda: self.live)
        self.index = 0

    def apply(self, entry: dict[str, Any], by: str = "a") -> list[Any]:
        self.index += 1
        return self.table.apply(self.index, {**entry, "r": [by, 7]})

    def rejected(self, entry: dict[str, Any], by: str = "a") -> str:
        before = self.table.digest()
        actions = self.apply(entry, by)
        notes = [a for a in actions if isinstance(a, Notify) and a.kind == "pt.rejected"]
        assert len(notes) == 1, actions
        assert any(isinstance(a, Log) and a.level == "warning" for a in actions)
        assert self.table.digest() == before  # nothing half applied
        return str(notes[0].data["reason"])

    def part(self) -> Any:
        part = self.table.get("P")
        assert part is not None
        return part


def enabled_abc() -> World:
    w = World()
    for node in "abc":
        w.apply(define_entry(ABC), node)
    w.apply(enable_entry("P"), "a")
    for node in "bc":
        w.apply(enable_entry("P"), node)
        w.apply(restored_entry("P", w.part().epoch, node), "a")
    return w


def test_define_is_initial_and_status_is_local_or_remote() -> None:
    w = World()
    assert w.apply(define_entry(ABC), "b")[-1].kind == "pt.changed"
    p = w.part()
    assert (p.state, p.epoch, p.active, p.current) == (INITIAL, 0, None, [])
    assert p.status_on("b") == "LocalDefined"
    assert p.status_on("a") == "RemoteDefined"
    w.apply(define_entry(ABC), "b")  # defining again: no change
    assert w.part().epoch == 0


def test_first_enable_activates_and_remote_enabled_shows() -> None:
    w = World()
    w.apply(define_entry(ABC), "a")
    actions = w.apply(enable_entry("P"), "a")
    p = w.part()
    assert (p.state, p.epoch, p.active, p.current, p.copying) == (ACTIVE, 1, "a", ["a"], [])
    assert Notify("pt.state", {"p": "P", "old": INITIAL, "new": ACTIVE}) in actions
    assert p.status_on("a") == "LocalEnabled"
    assert p.status_on("b") == "RemoteEnabled"
    w.apply(enable_entry("P"), "a")  # enabling again has no effect
    assert w.part().epoch == 1


def test_enable_of_a_lower_priority_node_replicates_then_restored() -> None:
    w = World()
    w.apply(define_entry(ABC), "a")
    w.apply(enable_entry("P"), "a")
    w.apply(enable_entry("P"), "b")
    p = w.part()
    assert (p.state, p.epoch, p.current, p.copying) == (REPLICATING, 2, ["a", "b"], ["b"])
    assert w.rejected(restored_entry("P", 1, "b")) == "stale epoch 1: partition 'P' is at epoch 2"
    w.apply(restored_entry("P", 2, "b"))
    p = w.part()
    assert (p.state, p.epoch, p.active, p.copying) == (ACTIVE, 3, "a", [])
    assert "is not being restored" in w.rejected(restored_entry("P", 3, "b"))


def test_restore_of_a_higher_priority_node_migrates_and_hands_over() -> None:
    w = World()
    w.apply(define_entry(ABC), "b")
    w.apply(enable_entry("P"), "b")  # b first: active although a outranks it
    w.apply(enable_entry("P"), "a")
    p = w.part()
    assert (p.state, p.active, p.current, p.copying) == (MIGRATING, "b", ["a", "b"], ["a"])
    actions = w.apply(restored_entry("P", p.epoch, "a"), "b")
    p = w.part()
    assert (p.state, p.active, p.epoch) == (ACTIVE, "a", 3)
    kinds = [(a.data["old"], a.data["new"]) for a in actions if a.kind == "pt.state"]
    assert kinds == [(ACTIVE, MIGRATING), (MIGRATING, ACTIVE)]


def test_failover_promotes_next_in_sync_replica_bumps_epoch_drops_dead() -> None:
    w = enabled_abc()
    e = w.part().epoch
    w.live = ["b", "c", "d"]
    actions = w.apply(failover_entry("P", e, ["a"]), "b")
    p = w.part()
    assert (p.active, p.epoch, p.current, p.state) == ("b", e + 1, ["b", "c"], ACTIVE)
    assert [a.data["new"] for a in actions if a.kind == "pt.state"] == [MIGRATING, ACTIVE]
    assert w.rejected(failover_entry("P", e, ["b"])).startswith("stale epoch")


def test_failover_skips_copying_and_async_nodes() -> None:
    w = World()
    part = PartitionDef("P", (("a", SYNC), ("b", SYNC), ("c", ASYNC)), "s")
    w.apply(define_entry(part))
    w.apply(enable_entry("P"), "a")
    w.apply(enable_entry("P"), "c")
    w.apply(restored_entry("P", w.part().epoch, "c"))
    w.apply(enable_entry("P"), "b")  # b copying
    assert w.part().copying == ["b"]
    w.live = ["b", "c"]
    w.apply(failover_entry("P", w.part().epoch, ["a"]), "b")
    p = w.part()
    # b lacks data, c is async: nobody holds every acknowledged commit but a.
    assert (p.state, p.active, p.current, p.copying) == (UNAVAILABLE, None, ["a"], [])
    w.apply(enable_entry("P"), "b")  # not a holder: waits
    assert w.part().state == UNAVAILABLE
    w.live = ["a", "b", "c"]
    w.apply(enable_entry("P"), "a")  # the holder is back
    p = w.part()
    assert (p.state, p.active, p.current) == (ACTIVE, "a", ["a"])


def test_failover_of_all_sync_copies_keeps_the_holders_and_one_returns() -> None:
    w = enabled_abc()
    w.live = ["d"]
    w.apply(failover_entry("P", w.part().epoch, ["a", "b", "c"]), "d")
    p = w.part()
    assert (p.state, p.active, p.current) == (UNAVAILABLE, None, ["a", "b", "c"])
    w.live = ["c", "d"]
    w.apply(enable_entry("P"), "c")
    assert (w.part().state, w.part().active) == (ACTIVE, "c")


def test_failover_bad_input() -> None:
    w = enabled_abc()
    e = w.part().epoch
    assert "does not name its active node a" in w.rejected(failover_entry("P", e, ["b"]))
    assert "named dead are live" in w.rejected(failover_entry("P", e, ["a"]))
    assert "not defined" in w.rejected(failover_entry("Q", 0, ["a"]))


def test_drop_removes_a_silent_replica_keeps_active() -> None:
    w = enabled_abc()
    e = w.part().epoch
    w.apply(drop_entry("P", e, "c"), "a")
    p = w.part()
    assert (p.active, p.epoch, p.current) == ("a", e + 1, ["a", "b"])
    assert "that is a failover" in w.rejected(drop_entry("P", e + 1, "a"))
    assert "not in the current list" in w.rejected(drop_entry("P", e + 1, "c"))
    # c comes back: enabling it makes it a copying replica again (D12 resync).
    w.apply(enable_entry("P"), "c")
    assert w.part().copying == ["c"] and w.part().state == REPLICATING


def test_disable_moves_active_and_refuses_the_last_copy() -> None:
    w = enabled_abc()
    e = w.part().epoch
    w.apply(disable_entry("P"), "a")
    p = w.part()
    assert (p.active, p.epoch, p.current, p.status_on("a")) == (
        "b",
        e + 1,
        ["b", "c"],
        "LocalDisabled",
    )
    w.apply(disable_entry("P"), "c")
    assert w.part().current == ["b"]
    assert "last in-sync copy" in w.rejected(disable_entry("P"), "b")
    w.apply(disable_entry("P"), "d")  # a foreign node: only its status
    assert w.part().current == ["b"] and w.part().status_on("d") == "LocalDisabled"


def test_define_bad_input_names_the_culprit() -> None:
    w = World()
    bad = PartitionDef("P", (("a", SYNC), ("zz", SYNC)), "s")
    assert "node 'zz' in the list of 'P' is not a member" in w.rejected(define_entry(bad))
    empty = {"pt": "define", "p": "P", "policy": "s", "nodes": []}
    assert "empty" in w.rejected(empty)
    twice = {"pt": "define", "p": "P", "policy": "s", "nodes": [["a", "sync"], ["a", "sync"]]}
    assert "listed twice" in w.rejected(twice)
    w.apply(define_entry(ABC), "a")
    other = PartitionDef("P", (("b", SYNC), ("a", SYNC)), "static")
    w.apply(define_entry(other), "b")  # before any enable: a redefinition
    assert w.part().names() == ["b", "a"]
    w.apply(enable_entry("P"), "b")
    reason = w.rejected(define_entry(ABC), "c")
    assert "node lists disagree" in reason and "c asks" in reason
    assert "not defined" in w.rejected(enable_entry("Q"))


def test_malformed_entries_are_rejected_never_raise() -> None:
    w = enabled_abc()
    for junk in (
        {"pt": "nope", "p": "P"},
        {"pt": "failover", "p": "P", "e": "1", "dead": ["a"]},
        {"pt": "failover", "p": "P", "e": 1, "dead": []},
        {"pt": "drop", "p": "P", "e": True, "node": "b"},
        {"pt": "define", "p": "", "policy": "s", "nodes": []},
        {"pt": "restored", "p": "P", "e": 1},
    ):
        assert "malformed" in w.rejected(junk)
        assert not well_formed(junk)
        assert w.table.forwarded("a", junk) is None
    before = w.table.digest()
    actions = w.table.apply(99, {"pt": "enable", "p": "P"})  # no requester
    assert any(isinstance(a, Notify) and a.kind == "pt.rejected" for a in actions)
    assert w.table.digest() == before


def test_snapshot_restore_and_request_key() -> None:
    w = enabled_abc()
    copy = PartitionTable(lambda: [], lambda: [])
    copy.restore(w.table.snapshot())
    assert copy.digest() == w.table.digest()
    copy.restore(None)
    assert copy.partitions == {}
    a = {**enable_entry("P"), "r": ["a", 1]}
    b = {**enable_entry("P"), "r": ["a", 2]}
    assert w.table.request_key(a) == w.table.request_key(b)
    assert w.table.request_key(a) != w.table.request_key(disable_entry("P"))
    described = w.table.describe(["d"])
    assert described[0]["active"] == "a" and described[0]["status"]["d"] == "RemoteEnabled"
    assert [r["node"] for r in described[0]["replicas"]] == ["b", "c"]


def test_local_state_is_unavailable_without_quorum() -> None:
    w = enabled_abc()
    assert w.table.local_state("P", enabled=True) == ACTIVE
    assert w.table.local_state("P", enabled=False) == UNAVAILABLE


def test_registers_on_a_cluster_node_and_rides_its_snapshots() -> None:
    import random

    node = ClusterNode(ClusterConfig("a", "sim://a", 1, members=("a",)), random.Random(1), {})
    table = PartitionTable(lambda: node.view_members, lambda: node.view_live)
    node.register_table(table)
    assert node.tables.get("pt") is table
    table.restore({"v": 1, "p": {}})
    assert node.tables.snapshot() == {"pt": {"v": 1, "p": {}, "l": {}}}
