"""Which partitions a node holds the last in-sync copy of (the leave check, holdings.py)."""

from __future__ import annotations

from nonstop.dataplane.holdings import last_copies, partitions_leave_refusal
from nonstop.ha.partition_table import Partition


def part(name: str, current: list[str], copying: list[str] | None = None) -> Partition:
    nodes = [[n, "sync"] for n in current]
    return Partition(name, "default", nodes, current, copying or [], current[0], 1)


def test_only_partitions_without_another_live_in_sync_holder_count() -> None:
    parts = [
        part("p.0", ["C", "A"]),  # A live and in sync: C may go
        part("p.1", ["C", "B"]),  # B is not live: C holds the last copy
        part("p.2", ["A", "C"], copying=["C"]),  # C still copying: not a holder
        part("p.3", ["B", "C"], copying=["B"]),  # B copying: C is the one holder
        part("p.4", ["A", "B"]),  # C holds nothing here
    ]
    assert last_copies(parts, "C", ["A", "C"]) == ["p.1", "p.3"]
    assert last_copies(parts, "C", ["A", "B", "C"]) == ["p.3"]
    assert last_copies(parts, "A", ["A", "B", "C"]) == ["p.2"]  # its copy to C not done


def test_the_refusal_is_one_line_naming_the_partitions() -> None:
    assert partitions_leave_refusal("C", []) is None
    names = [f"p.{i}" for i in range(10)]
    why = partitions_leave_refusal("C", names)
    assert why is not None and "\n" not in why
    assert why.startswith("C holds the last in-sync copy of 10 partition(s) (p.0, ")
    assert "and 2 more" in why
