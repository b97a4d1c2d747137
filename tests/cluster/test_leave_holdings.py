"""Membership never loses objects, with real processes (issue 10).

Before: one ``leave`` request for a node that still held data made its objects
``NotFound`` (a cluster lookup asks the members only), so ``get_or_create``
created a duplicate key.  Until partitions can move data, the node that takes
a ``leave`` asks the leaving node what it holds and refuses with one line
naming how many objects of which types; a node that holds nothing leaves as
before.  Nodes load ``tests.distmodel`` (``--app``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import nonstop
from tests.cluster.conftest import wait_until
from tests.cluster.test_remote_client import start
from tests.distmodel import Account, Inbox


def test_a_node_that_holds_objects_cannot_leave_an_empty_one_can(tmp_path: Path) -> None:
    procs = start(tmp_path, nonresponse_timeout=2.0)
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
