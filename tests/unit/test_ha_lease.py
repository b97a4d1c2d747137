"""Liveness leases (ha.md section 8): renewals, revocation by failover, the new active's wait."""

from __future__ import annotations

from typing import Any

from nonstop.ha.lease import LeaseConfig, LeaseKeeper
from nonstop.ha.partition_table import (
    PartitionTable,
    define_entry,
    enable_entry,
    failover_entry,
    lease_entry,
    restored_entry,
)
from nonstop.ha.policies import SYNC, PartitionDef
from nonstop.runtime.interface import Notify

AB = PartitionDef("P", (("a", SYNC), ("b", SYNC)), "s")
CFG = LeaseConfig(lease=0.6, drift=0.0)


class Pair:
    """Two nodes' keepers over one table (a log applied at the same instant on both)."""

    def __init__(self) -> None:
        self.live = ["a", "b"]
        self.table = PartitionTable(lambda: ["a", "b"], lambda: self.live)
        self.keepers = {n: LeaseKeeper(n, 1, self.table, CFG) for n in "ab"}
        self.index = 0
        self.released: list[tuple[str, str, dict[str, Any]]] = []
        """``released`` messages the keepers asked to send: (from, to, body)."""

    def apply(self, now: float, entry: dict[str, Any], by: str) -> list[Any]:
        self.index += 1
        actions = self.table.apply(self.index, {**entry, "r": [by, 1]})
        for action in actions:
            if isinstance(action, Notify) and action.kind == "pt.lease":
                for keeper in self.keepers.values():
                    keeper.on_lease(now, action.data)
            if isinstance(action, Notify) and action.kind == "pt.changed":
                for name, keeper in self.keepers.items():
                    release = keeper.on_changed(now, action.data)
                    if release is not None:
                        self.released.append((name, *release))
        return actions

    def renew(self, now: float, node: str, apply_at: float | None = None) -> None:
        entry = self.keepers[node].renewal(now)
        assert entry is not None
        self.apply(now if apply_at is None else apply_at, entry, node)


def test_renewals_are_due_every_third_of_the_lease_and_hold_it_from_the_proposal() -> None:
    w = Pair()
    k = w.keepers["a"]
    assert k.renewal(1.0) is not None
    assert k.renewal(1.1) is None
    assert k.renewal(1.2) is not None
    w2 = Pair()
    w2.renew(1.0, "a", apply_at=1.05)
    assert w2.keepers["a"].held_until == 1.6  # from when it was proposed, not applied


def test_a_failover_revokes_the_lease_and_later_renewals_are_refused() -> None:
    w = Pair()
    w.apply(0.0, define_entry(AB), "a")
    w.apply(0.0, enable_entry("P"), "a")
    w.apply(0.0, enable_entry("P"), "b")
    w.apply(0.0, restored_entry("P", 2, "b"), "a")
    w.renew(1.0, "a")
    assert w.keepers["a"].acting(1.1, "P", enabled=True)
    assert not w.keepers["a"].acting(1.1, "P", enabled=False)  # no quorum, no acting (D16)
    stale = w.keepers["a"].renewal(1.3)  # proposed before the failover, applied after it
    w.live = ["b"]
    w.apply(1.4, failover_entry("P", 3, ["a"]), "b")
    assert w.table.leases == {"a": 1}
    assert stale is not None
    actions = w.apply(1.5, stale, "a")
    assert actions[0].data["ok"] is False
    # b applied a's last accepted renewal at 1.0: it acts from 1.6, never before.
    b = w.keepers["b"]
    w.renew(1.4, "b")
    assert not b.acting(1.55, "P", enabled=True)
    assert b.acting(1.61, "P", enabled=True)
    # a's own lease ran out at 1.6 too: never both at once.
    assert not w.keepers["a"].acting(1.61, "P", enabled=True)
    fresh = w.keepers["a"].renewal(2.0)
    assert fresh is not None and fresh["ln"] == 1  # a learned its new lease number


def test_the_first_active_acts_at_once_and_lease_entries_are_validated() -> None:
    w = Pair()
    w.apply(0.0, define_entry(AB), "a")
    w.renew(0.0, "a")
    w.apply(0.1, enable_entry("P"), "a")
    assert w.keepers["a"].acting(0.1, "P", enabled=True)
    assert w.table.forwarded("a", {"pt": "lease", "ln": "0", "k": 1}) is None
    assert w.table.forwarded("a", lease_entry(0, 1)) is not None
    before = w.table.digest()
    actions = w.table.apply(99, {"pt": "lease", "ln": 0, "k": 1})  # no requester
    assert actions[0].data["ok"] is False and w.table.digest() == before


def test_a_snapshot_makes_a_new_active_wait_a_whole_lease() -> None:
    w = Pair()
    w.apply(0.0, define_entry(AB), "a")
    w.apply(0.0, enable_entry("P"), "a")
    copy = PartitionTable(lambda: ["a", "b"], lambda: ["b"])
    copy.restore(w.table.snapshot())
    assert copy.leases == w.table.leases and copy.digest() == w.table.digest()
    b = LeaseKeeper("b", 1, copy, CFG)
    b.on_snapshot(5.0)  # whatever a renewed is inside the snapshot
    b.on_changed(5.0, {"p": "P", "active": "b", "was": "a"})
    copy.partitions["P"].active = "b"
    b.held_until = 10.0
    assert not b.acting(5.5, "P", enabled=True)
    assert b.acting(5.61, "P", enabled=True)


def test_a_snapshot_that_moved_nothing_does_not_stop_the_active_node() -> None:
    # Issue 14: a follower that installed the leader's snapshot stopped acting for a whole
    # lease (a 0.63 s commit gap under load) although no partition had changed hands.
    w = Pair()
    w.apply(0.0, define_entry(AB), "a")
    w.apply(0.0, enable_entry("P"), "a")
    a = w.keepers["a"]
    w.renew(1.0, "a")
    assert a.acting(1.1, "P", enabled=True)
    w.table.restore(w.table.snapshot())  # the same table, installed from a snapshot
    a.on_snapshot(1.2)
    assert a.acting(1.25, "P", enabled=True)


def test_a_snapshot_hiding_a_change_of_hands_makes_the_node_wait() -> None:
    w = Pair()
    w.apply(0.0, define_entry(AB), "a")
    w.apply(0.0, enable_entry("P"), "a")
    w.apply(0.0, enable_entry("P"), "b")
    w.apply(0.0, restored_entry("P", 2, "b"), "a")
    a = w.keepers["a"]
    w.renew(1.0, "a")
    assert a.acting(1.1, "P", enabled=True)
    # Inside a snapshot a never applied: P failed over to b and came back to a (handover
    # by priority after a restore), so b may have acted in between.
    other = PartitionTable(lambda: ["a", "b"], lambda: w.live)
    other.restore(w.table.snapshot())
    w.live = ["b"]
    other.apply(10, {**failover_entry("P", 3, ["a"]), "r": ["b", 1]})
    w.live = ["a", "b"]
    other.apply(11, {**enable_entry("P"), "r": ["a", 1]})
    other.apply(12, {**restored_entry("P", 5, "a"), "r": ["b", 1]})
    assert other.partitions["P"].active == "a"
    w.table.restore(other.snapshot())
    a.held_until = 10.0
    a.on_snapshot(1.2)
    assert not a.acting(1.5, "P", enabled=True)  # it waits out b's lease as applied now
    assert a.acting(1.81, "P", enabled=True)


def handed_over_to_a(w: Pair, now: float) -> None:
    """b active first (a not enabled yet), then a restored: a outranks b, a handover."""
    w.apply(0.0, define_entry(AB), "b")
    w.apply(0.0, enable_entry("P"), "b")
    assert w.table.partitions["P"].active == "b"
    w.renew(0.1, "b")
    w.apply(0.2, enable_entry("P"), "a")
    w.renew(now - 0.1, "b")  # b's lease as a applied it last, just before the handover
    w.apply(now, restored_entry("P", w.table.partitions["P"].epoch, "a"), "b")
    assert w.table.partitions["P"].active == "a"


def test_a_handover_ends_the_new_active_nodes_wait_when_the_old_one_says_it_stopped() -> None:
    w = Pair()
    handed_over_to_a(w, 2.0)
    a = w.keepers["a"]
    w.renew(2.0, "a")
    assert not a.acting(2.01, "P", enabled=True), "a waits out b's lease without a word from b"
    ((sender, to, body),) = w.released
    assert (sender, to) == ("b", "a") and body["e"] == w.table.partitions["P"].epoch
    assert not a.on_released(2.01, "c", body), "only the old active node may end the wait"
    assert not a.on_released(2.01, "b", {**body, "e": body["e"] - 1}), "an older epoch"
    assert a.on_released(2.01, "b", body)
    assert a.acting(2.01, "P", enabled=True)
    assert not a.on_released(2.02, "b", body), "once"


def test_an_old_active_node_that_was_still_waiting_does_not_end_the_wait() -> None:
    # b became active by a failover and still waits out its predecessor's lease: its
    # own stop proves nothing about that predecessor, so it sends no ``released``.
    w = Pair()
    handed_over_to_a(w, 2.0)
    w.released.clear()
    w.renew(2.5, "a")
    w.live = ["b"]
    w.apply(2.6, failover_entry("P", w.table.partitions["P"].epoch, ["a"]), "b")
    assert w.table.partitions["P"].active == "b" and w.released == []
    assert not w.keepers["b"].acting(2.7, "P", enabled=True), "b waits out a's lease"
    w.live = ["a", "b"]
    w.apply(2.7, enable_entry("P"), "a")
    w.apply(2.7, restored_entry("P", w.table.partitions["P"].epoch, "a"), "b")
    assert w.table.partitions["P"].active == "a"
    assert w.released == [], "b never acted: it may not speak for a's old lease"
    broken = Pair()
    broken.keepers["b"] = LeaseKeeper("b", 1, broken.table, CFG, release_unless_acting=True)
    handed_over_to_a(broken, 2.0)
    broken.released.clear()
    broken.renew(2.5, "a")
    broken.live = ["b"]
    broken.apply(2.6, failover_entry("P", broken.table.partitions["P"].epoch, ["a"]), "b")
    broken.live = ["a", "b"]
    broken.apply(2.7, enable_entry("P"), "a")
    broken.apply(2.7, restored_entry("P", broken.table.partitions["P"].epoch, "a"), "b")
    assert broken.released, "the broken variant speaks while waiting (the check above bites)"


def test_a_released_message_that_comes_before_its_entry_is_kept_for_it() -> None:
    # On real nodes the old active node is often the leader: it applies the handover entry
    # (and says ``released``) before the new active node applies it.
    w = Pair()
    w.apply(0.0, define_entry(AB), "b")
    w.apply(0.0, enable_entry("P"), "b")
    w.renew(0.1, "b")
    w.apply(0.2, enable_entry("P"), "a")
    w.renew(1.9, "b")
    epoch = w.table.partitions["P"].epoch
    a = w.keepers["a"]
    body = {"t": "released", "p": "P", "e": epoch + 1}
    assert not a.on_released(1.95, "b", body), "not applied here yet: nothing to end"
    assert not a.on_released(1.95, "b", {**body, "p": "nope"}), "unknown partitions: dropped"
    w.apply(2.0, restored_entry("P", epoch, "a"), "b")
    w.renew(2.0, "a")
    assert a.acting(2.01, "P", enabled=True), "the early word ended the wait"
    # A word for another epoch than the entry's ends nothing.
    w2 = Pair()
    w2.apply(0.0, define_entry(AB), "b")
    w2.apply(0.0, enable_entry("P"), "b")
    w2.apply(0.2, enable_entry("P"), "a")
    w2.renew(1.9, "b")
    epoch = w2.table.partitions["P"].epoch
    w2.keepers["a"].on_released(1.95, "b", {"t": "released", "p": "P", "e": epoch + 2})
    w2.apply(2.0, restored_entry("P", epoch, "a"), "b")
    w2.renew(2.0, "a")
    assert not w2.keepers["a"].acting(2.01, "P", enabled=True)


def test_an_active_node_after_a_spell_without_one_waits_out_the_last_ones_lease() -> None:
    # Seed 3502577: a failover found no live copy (P Unavailable, active None), then the
    # other copy came back and enabled P: the entry's ``was`` is None, but a, the last
    # active node, may still act until its lease runs out.
    w = Pair()
    w.apply(0.0, define_entry(AB), "a")
    w.apply(0.0, enable_entry("P"), "a")
    w.apply(0.0, enable_entry("P"), "b")
    w.apply(0.0, restored_entry("P", w.table.partitions["P"].epoch, "b"), "a")
    w.renew(1.0, "a")
    w.live = []
    w.apply(1.2, failover_entry("P", w.table.partitions["P"].epoch, ["a", "b"]), "a")
    assert w.table.partitions["P"].active is None
    w.live = ["b"]
    w.apply(1.3, enable_entry("P"), "b")
    assert w.table.partitions["P"].active == "b"
    b = w.keepers["b"]
    w.renew(1.3, "b")
    assert not b.acting(1.4, "P", enabled=True), "b acted while a's lease (to 1.6) ran"
    assert b.acting(1.61, "P", enabled=True)
    # A keeper that never saw who was active (restarted, say) waits a whole lease.
    fresh = LeaseKeeper("b", 2, w.table, CFG)
    fresh.on_changed(2.0, {"p": "P", "kind": "enable", "active": "b", "was": None})
    assert fresh._acting_from["P"] >= 2.0 + CFG.lease, "it would act at once"
