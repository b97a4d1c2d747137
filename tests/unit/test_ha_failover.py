"""The promoter and restorer (ha.md sections 6-7): what they propose, when, and how often."""

from __future__ import annotations

from typing import Any

from nonstop.ha.failover import Promoter, PromoterConfig, Restorer
from nonstop.ha.partition_table import PartitionTable
from nonstop.ha.policies import SYNC, PartitionDef

ABC = PartitionDef("P", (("a", SYNC), ("b", SYNC), ("c", SYNC)), "s")


class World:
    def __init__(self) -> None:
        self.live = ["a", "b", "c"]
        self.table = PartitionTable(lambda: ["a", "b", "c"], lambda: self.live)
        self.index = 0

    def run(self, entries: list[dict[str, Any]], by: str) -> None:
        for entry in entries:
            self.index += 1
            self.table.apply(self.index, {**entry, "r": [by, 1]})


def settle(w: World, now: float) -> None:
    """Every node's restorer proposes until nothing changes (an ideal, instant log)."""
    for step in range(20):
        before = w.table.digest()
        for node in ("a", "b", "c"):
            restorer = restorers[node]
            w.run(restorer.proposals(now + step, w.live), node)
        if w.table.digest() == before:
            return


restorers: dict[str, Restorer] = {}


def test_restorers_define_enable_and_restore_to_priority() -> None:
    w = World()
    cfg = PromoterConfig(retry=0.5)
    restorers.clear()
    restorers.update({n: Restorer(n, w.table, [ABC], cfg) for n in "abc"})
    settle(w, 0.0)
    p = w.table.get("P")
    assert p is not None
    assert (p.active, p.current, p.copying, p.state) == ("a", ["a", "b", "c"], [], "Active")


def test_promoter_fails_over_drops_and_throttles() -> None:
    w = World()
    restorers.clear()
    restorers.update({n: Restorer(n, w.table, [ABC]) for n in "abc"})
    settle(w, 0.0)
    promoter = Promoter(w.table, PromoterConfig(retry=0.5))
    assert promoter.proposals(100.0, w.live) == []
    w.live = ["b", "c"]
    p = w.table.get("P")
    assert p is not None
    first = promoter.proposals(100.0, w.live)
    assert first == [{"pt": "failover", "p": "P", "e": p.epoch, "dead": ["a"]}]
    assert promoter.proposals(100.2, w.live) == []  # not again within retry
    assert promoter.proposals(100.6, w.live) == first  # resent: it may have been dropped
    w.run(first, "b")
    assert (p.active, p.current) == ("b", ["b", "c"])
    w.live = ["b"]
    assert promoter.proposals(101.0, w.live) == [
        {"pt": "drop", "p": "P", "e": p.epoch, "node": "c"}
    ]


def test_a_dropped_node_that_is_back_re_enables_and_is_restored() -> None:
    w = World()
    restorers.clear()
    restorers.update({n: Restorer(n, w.table, [ABC]) for n in "abc"})
    settle(w, 0.0)
    p = w.table.get("P")
    assert p is not None
    w.live = ["b", "c"]
    w.run([{"pt": "failover", "p": "P", "e": p.epoch, "dead": ["a"]}], "b")
    w.live = ["a", "b", "c"]
    settle(w, 10.0)
    assert (p.active, p.current, p.copying) == ("a", ["a", "b", "c"], [])


def test_restorer_waits_for_the_copy() -> None:
    w = World()
    done: set[str] = set()
    restorers.clear()
    restorers.update(
        {n: Restorer(n, w.table, [ABC], copy_done=lambda p, node: node in done) for n in "abc"}
    )
    settle(w, 0.0)
    p = w.table.get("P")
    assert p is not None
    # Whoever enabled first is active; the others wait for their copies.
    assert len(p.copying) == 2 and p.current == ["a", "b", "c"]
    waiting = [n for n in p.copying if n != "a"]
    done.add(waiting[-1])
    settle(w, 5.0)
    assert waiting[-1] not in p.copying and len(p.copying) == 1
    assert p.state in ("Replicating", "Migrating")


def test_a_holder_of_an_unavailable_partition_enables_it_again() -> None:
    w = World()
    restorers.clear()
    restorers.update({n: Restorer(n, w.table, [ABC]) for n in "abc"})
    settle(w, 0.0)
    p = w.table.get("P")
    assert p is not None
    w.live = []
    w.run([{"pt": "failover", "p": "P", "e": p.epoch, "dead": ["a", "b", "c"]}], "a")
    assert p.state == "Unavailable" and p.current == ["a", "b", "c"]
    w.live = ["c"]
    w.run(restorers["c"].proposals(50.0, w.live), "c")
    assert (p.state, p.active) == ("Active", "c")
