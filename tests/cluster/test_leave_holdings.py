"""Membership never loses objects, with real processes (issue 10).

Routing by partition (the default): a node leaving is, to the partition table,
a node gone -- its partitions fail over to their live in-sync replicas.  So a
``leave`` is refused only while the node holds the *last* in-sync copy of a
partition, naming how many and which (dataplane/holdings.py); a node whose
partitions all have a live in-sync copy elsewhere leaves, and every object it
held is still found afterwards.

Routing by node: one ``leave`` request for a node that still held data made its
objects ``NotFound`` (a cluster lookup asks the members only), so
``get_or_create`` created a duplicate key.  The node that takes a ``leave``
asks the leaving node what it holds and refuses with one line naming how many
objects of which types; a node that holds nothing leaves as before.  Nodes load
``tests.distmodel`` (``--app``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nonstop
from tests.cluster.conftest import Procs, wait_until
from tests.cluster.test_remote_client import start
from tests.distmodel import Account, Inbox


def _all_found(address: str, numbers: list[str]) -> bool:
    """Every account is found through ``address`` and ``get_or_create`` finds, not creates
    (a retryable error during the takeover counts as "not yet": ``wait_until`` retries)."""
    with nonstop.connect(address) as c, c.transaction() as tx:
        if any(tx.get(Account, number=n).owner != "o" for n in numbers):
            return False
        _, created = tx.get_or_create(Account, number=numbers[0])
        return not created


def _only_holder(procs: Procs, asked: str, node: str) -> list[str]:
    """The partitions whose one in-sync holder is ``node``, in ``asked``'s table."""
    out = []
    for part in procs.status(asked).get("partitions") or []:
        in_sync = [n for n, *_ in part["current"] if n not in part["copying"]]
        if in_sync == [node]:
            out.append(str(part["name"]))
    return sorted(out)


def test_a_node_leaves_unless_it_holds_the_last_copy_of_a_partition(tmp_path: Path) -> None:
    procs = start(tmp_path, nonresponse_timeout=2.0)
    try:
        procs.wait_served()
        addresses = {n: procs.address(n) for n in "ABC"}
        # Objects in partitions of every node, C's active ones included.
        numbers = [
            number
            for node in "ABC"
            for number in procs.keys_active_on(
                node, "dist.Account", "number", [f"{node}-{i}" for i in range(64)], 2
            )
        ]
        with nonstop.connect(",".join(addresses.values())) as c, c.transaction() as tx:
            for number in numbers:
                tx.create(Account, number=number, owner="o")
        # Every partition C holds has a live in-sync copy on A or B: C may leave, holding
        # objects, and none is lost (its partitions fail over to their replicas).
        with nonstop.Client([addresses["A"]], timeout=10, rounds=1) as admin:
            assert admin.leave("C")["members"] == ["A", "B"]
            assert wait_until(lambda: admin.status()["members"] == ["A", "B"], 10, "C gone")
        assert wait_until(lambda: _all_found(addresses["A"], numbers), 30, "C's objects")
        # Now the partitions C shared with B have their last copy on B: B may not leave,
        # asked through another node or through itself.
        last = _only_holder(procs, "A", "B")
        assert last, "no partition was held by B and C only"
        for asked in ("A", "B"):
            with nonstop.Client([addresses[asked]], timeout=10, rounds=1) as admin:
                with pytest.raises(nonstop.Error) as refused:
                    admin.leave("B")
                message = str(refused.value)
                assert f"B holds the last in-sync copy of {len(last)} partition(s)" in message
                assert all(name in message for name in last[:8]), (last, message)
                assert "\n" not in message
                assert admin.status()["members"] == ["A", "B"]
        assert _all_found(addresses["B"], numbers)
        # Leaving again is a no-op answer of the cluster, not a holdings check.
        with nonstop.Client([addresses["A"]], timeout=10, rounds=1) as admin:
            assert admin.leave("C")["members"] == ["A", "B"]
    finally:
        procs.cleanup()


def test_under_node_routing_a_node_that_holds_objects_cannot_leave_an_empty_one_can(
    tmp_path: Path,
) -> None:
    # Pinned to routing by node: the subject is that routing's own rule (an object lives
    # on the one node that created it, so any object held blocks the leave).
    procs = start(tmp_path, nonresponse_timeout=2.0, ha={"data": "nodes"})
    try:
        addresses = {n: procs.address(n) for n in "ABC"}
        with nonstop.connect(",".join(addresses.values())) as c, c.transaction() as tx:
            for i in range(2):
                tx.create(Account, number=f"C-{i}", owner="c", node="C")
            tx.create(Inbox, name="C-inbox", node="C")
        for asked in ("A", "C"):  # through another node, and through the node itself
            with nonstop.Client([addresses[asked]], timeout=10, rounds=1) as admin:
                with pytest.raises(nonstop.Error) as refused:
                    admin.leave("C")
                message = str(refused.value)
                assert "C holds 3 objects (2 dist.Account, 1 dist.Inbox)" in message, message
                assert "\n" not in message
                assert admin.status()["members"] == ["A", "B", "C"]
        # Nothing was lost: C's objects are still found, and get_or_create finds, not creates.
        with nonstop.connect(addresses["A"]) as c, c.transaction() as tx:
            assert tx.get(Account, number="C-1").owner == "c"
            _, created = tx.get_or_create(Account, number="C-0")
            assert not created
        # B holds nothing: it leaves as before.
        with nonstop.Client([addresses["A"]], timeout=10, rounds=1) as admin:
            reply = admin.leave("B")
            assert reply["members"] == ["A", "C"]
            assert wait_until(lambda: admin.status()["members"] == ["A", "C"], 10, "B gone")
            # Leaving again is a no-op answer of the cluster, not a holdings check.
            assert admin.leave("B")["members"] == ["A", "C"]
    finally:
        procs.cleanup()
