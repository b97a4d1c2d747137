"""The splits of a Spark read (``nonstop.spark.read_plan``) against scripted nodes.

No Spark and no node processes: each node is a stub answering the few ops the
planner sends.  Node routing keeps one split per (node, ``bulk.plan`` range);
partition routing makes one per partition on its active node, plus the
node's own-location ranges only where a probe found objects; a split read
from a node that stopped acting for its partition fails naming it.
"""

from __future__ import annotations

from typing import Any

import pytest

from nonstop.errors import BadArgument, Unavailable
from nonstop.spark import read_plan
from nonstop.spark.read_plan import NodeRange, location_range, plan_reads
from nonstop.spark.schema import Options

LOC = {"A": 11, "B": 22, "C": 33}


def ref(location: int, n: int) -> bytes:
    return location.to_bytes(8, "big") + n.to_bytes(12, "big")


class Stub:
    """One node: its routing, the partition table it reports, what it holds."""

    def __init__(
        self,
        name: str,
        routing: str | None,
        table: list[dict[str, Any]],
        own_rows: int = 0,
        acting: list[str] | None = None,
    ) -> None:
        self.name, self.routing, self.table = name, routing, table
        self.own_rows, self.acting = own_rows, acting or []
        self.calls: list[str] = []
        self.connects = self.closed = 0

    def call(self, op: str, **p: Any) -> Any:
        self.calls.append(op)
        if op == "partition.objects":
            if self.routing is None:  # a standalone bulk endpoint has no such op
                raise BadArgument("this bulk endpoint does not serve op 'partition.objects'")
            return {"routing": self.routing, "counts": {}}
        if op == "status":
            return {"members": list(LOC), "partitions": self.table, "acting": self.acting}
        if op == "bulk.scan":  # the own-location probe
            assert (p["lo"], p["hi"]) == location_range(LOC[self.name]) and p["limit"] == 1
            return {"rows": b"", "n": min(1, self.own_rows), "next": None, "snapshot": 1}
        if op == "bulk.plan":
            mid = ref(LOC[self.name], 5)
            return {"snapshot": 7, "count": 9, "ranges": [[None, mid], [mid, None]]}
        if op == "bulk.schema":
            return {"name": p["type"], "version": 4, "fields": {}}
        raise AssertionError(op)

    def close(self) -> None:
        self.closed += 1

    def __enter__(self) -> Stub:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def table(active: dict[str, str | None]) -> list[dict[str, Any]]:
    return [
        {"name": name, "location": 100 + i, "epoch": 3, "state": "Active", "active": node}
        for i, (name, node) in enumerate(sorted(active.items()))
    ]


def scripted(
    monkeypatch: pytest.MonkeyPatch, stubs: dict[str, Stub], down: tuple[str, ...] = ()
) -> Options:
    nodes = [
        {"name": n, "address": f"h:{i}", "location": LOC[n], "up": n not in down}
        for i, n in enumerate(stubs)
    ]
    by_address = {f"h:{i}": stubs[n] for i, n in enumerate(stubs)}
    monkeypatch.setattr(read_plan, "all_nodes", lambda opts, conns=None: nodes)

    def connect(opts: Options, address: str, timeout: float | None = None) -> Stub:
        by_address[address].connects += 1
        return by_address[address]

    monkeypatch.setattr(read_plan, "client", connect)
    return Options.parse({"cluster": "h:0", "type": "T"})


def test_node_routing_plans_each_nodes_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    for routing in ("nodes", None):  # a cluster node, a standalone bulk endpoint
        stubs = {n: Stub(n, routing, table({"p.0": "A"})) for n in "AB"}
        splits = plan_reads(scripted(monkeypatch, stubs), "T", 1)
        assert [(s.node, s.partition) for s in splits] == [("A", None)] * 2 + [("B", None)] * 2
        assert {s.version for s in splits} == {1}
        assert "status" not in stubs["A"].calls


def test_a_plan_asks_each_node_over_one_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything a plan asks the first node (routing, the type's version, its ranges)
    goes over one connection, each other node's ranges over one more; all are closed."""
    stubs = {n: Stub(n, "nodes", table({"p.0": "A"})) for n in "ABC"}
    splits = plan_reads(scripted(monkeypatch, stubs), "T")
    assert {s.version for s in splits} == {4}  # the version the first node has now
    assert stubs["A"].calls == ["bulk.schema", "partition.objects", "bulk.plan"]
    assert [stubs[n].calls for n in "BC"] == [["bulk.plan"]] * 2
    assert [(s.connects, s.closed) for s in stubs.values()] == [(1, 1)] * 3


def test_partition_routing_plans_one_split_per_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = table({"p.0": "A", "p.1": "B", "p.2": "C", "p.3": "A"})
    stubs = {n: Stub(n, "partitions", parts, own_rows=9 if n == "B" else 0) for n in "ABC"}
    splits = plan_reads(scripted(monkeypatch, stubs), "T", 1)
    assert stubs["A"].calls.count("status") == 1  # (asked once per plan)
    by_part = [s for s in splits if s.partition is not None]
    assert [(s.partition, s.node, s.epoch) for s in by_part] == [
        ("p.0", "A", 3),
        ("p.1", "B", 3),
        ("p.2", "C", 3),
        ("p.3", "A", 3),
    ]
    assert [(s.lo, s.hi) for s in by_part] == [location_range(100 + i) for i in range(4)]
    # Only B holds objects in its own location: its plan's ranges cut to that location.
    own = [s for s in splits if s.partition is None]
    lo, hi = location_range(LOC["B"])
    assert [(s.node, s.lo, s.hi) for s in own] == [("B", lo, ref(22, 5)), ("B", ref(22, 5), hi)]
    assert "bulk.plan" not in stubs["A"].calls + stubs["C"].calls


def test_partition_without_active_node_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = table({"p.0": "A", "p.1": None, "p.2": "C"})
    stubs = {n: Stub(n, "partitions", parts) for n in "ABC"}
    with pytest.raises(Unavailable, match=r"partition\(s\) p\.1 .*have no active node up"):
        plan_reads(scripted(monkeypatch, stubs), "T", 1)
    with pytest.raises(Unavailable, match=r"p\.1 .*p\.2 .*node\(s\) C are down"):
        plan_reads(scripted(monkeypatch, stubs, down=("C",)), "T", 1)


def test_a_split_whose_node_stopped_acting_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = Stub("A", "partitions", table({"p.0": "A"}), acting=["p.0"])
    monkeypatch.setattr(read_plan, "client", lambda opts, address, timeout=None: stub)
    opts = Options.parse({"cluster": "h:0", "type": "T"})
    lo, hi = location_range(100)
    read_plan.check_acting(opts, NodeRange("h:0", "A", lo, hi, 0, "p.0", 3))  # still acting
    with pytest.raises(Unavailable, match=r"partition p\.0 moved off node A"):
        read_plan.check_acting(opts, NodeRange("h:0", "A", lo, hi, 0, "p.0", 2))  # epoch moved
    stub.acting = []
    with pytest.raises(Unavailable, match=r"partition p\.0 moved off node A"):
        read_plan.check_acting(opts, NodeRange("h:0", "A", lo, hi, 0, "p.0", 3))


def test_location_range_covers_exactly_one_location() -> None:
    lo, hi = location_range(22)
    assert lo == ref(22, 0) and hi == ref(23, 0)
    assert location_range((1 << 64) - 1)[1] is None
