"""Cluster-scope unique lookups lock only what they find (data-path.md §7, the restart stall).

A lookup used to write-lock the key's absent slot on every node it asked, the
coordinator's own first: two coordinators looking up one key each held an
absent slot the other asked for next, while one of them also held the object.
Such a cross-node deadlock ends only at ``lock_wait``, and the same replayed
transactions met again, so the bank test stalled for tens of seconds after a
restart (coordinators without hints ask every node).  Now a node locks the key
there only if it holds the object, and absent slots are locked (one node after
the other, in name order) only when the key is found nowhere.

The subject is routing by node (``ha.data = "nodes"``), where a cluster-scope lookup
asks every node.  Under routing by partition (the default) the mapper sends a unique
key to one partition, so there is no absent slot on another node to wait for, and a
create naming node A lands on the key's partition wherever it is active: the cluster
is pinned to routing by node (the CI failure of session 8 was this test under the
default, with the key's partition active on C).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.distmodel  # noqa: F401  (the types the nodes load with --app)
from nonstop.client import Client
from nonstop.model.codec import pack, unpack
from tests.cluster.conftest import Procs

ROOT = Path(__file__).resolve().parents[2]
ACC = "dist.Account"
LOCK_WAIT = 2.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))
    procs = Procs(
        tmp_path_factory.mktemp("data"),
        3,
        {
            "app": ["tests.distmodel"],
            "lock_wait": LOCK_WAIT,
            "branch_idle": 10.0,
            "ha": {"data": "nodes"},
        },
    )
    try:
        procs.start_all()
        procs.wait_quorum(["A", "B", "C"], "Active", 30)
        yield procs
    finally:
        procs.cleanup()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def client(cluster: Procs, node: str) -> Client:
    return Client([cluster.address(node)], timeout=20, rounds=1)


def request(c: Client, **payload: Any) -> dict[str, Any]:
    reply = c.request(payload)
    assert isinstance(reply, dict), reply
    return reply


def ok(c: Client, **payload: Any) -> dict[str, Any]:
    reply = request(c, **payload)
    assert "error" not in reply, reply
    return reply


def begin(c: Client) -> int:
    return int(ok(c, op="tx.begin", iso="serializable")["s"])


def lookup(c: Client, s: int, number: str, **extra: Any) -> dict[str, Any]:
    key = pack({"number": number})
    return request(c, op="tx.get", s=s, type=ACC, tv=1, key=key, lock="write", **extra)


def create_on(cluster: Procs, node: str, number: str, balance: int) -> None:
    with client(cluster, node) as c:
        s = begin(c)
        st = pack({"number": number, "balance": balance})
        ok(c, op="tx.create", s=s, type=ACC, tv=1, st=st, node=node)
        ok(c, op="tx.commit", s=s)


def test_lookup_does_not_wait_for_an_absent_slot_on_another_node(cluster: Procs) -> None:
    number = f"slot-{os.getpid()}"
    create_on(cluster, "A", number, 7)
    with client(cluster, "C") as c_holder, client(cluster, "B") as c_asker:
        # C's session holds the key's absent slot on C (a local lookup of it).
        s_c = begin(c_holder)
        assert lookup(c_holder, s_c, number, scope="local") == {"o": None}
        # B looks the key up cluster-wide: A holds the object, C only an empty slot
        # someone locked.  It must not wait for that slot (it used to, for lock_wait,
        # and that wait was one half of the cross-node deadlock).
        s_b = begin(c_asker)
        t0 = time.monotonic()
        reply = lookup(c_asker, s_b, number)
        took = time.monotonic() - t0
        assert "error" not in reply, reply
        assert unpack(reply["o"][3])["balance"] == 7
        assert took < LOCK_WAIT / 2, f"the lookup waited {took:.2f}s"
        # The other half: C's session now asks cluster-wide too; it waits for B's
        # lock on the object (no cycle), and gets it once B's session is over.
        ok(c_asker, op="tx.rollback", s=s_b)
        again = lookup(c_holder, s_c, number)
        assert "error" not in again, again
        assert unpack(again["o"][3])["balance"] == 7
        ok(c_holder, op="tx.rollback", s=s_c)


def test_a_key_found_nowhere_stays_absent_until_commit(cluster: Procs) -> None:
    number = f"absent-{os.getpid()}"
    with client(cluster, "B") as c_b, client(cluster, "A") as c_a:
        s_b = begin(c_b)
        assert lookup(c_b, s_b, number) == {"o": None}
        # Not found anywhere: the slot is locked on every node, A's included, so a
        # create of that key on A waits for B's transaction (serializable).
        s_a = begin(c_a)
        st = pack({"number": number, "balance": 1})
        blocked = request(c_a, op="tx.create", s=s_a, type=ACC, tv=1, st=st, node="A")
        assert blocked.get("error") == "LockTimeout", blocked
        ok(c_b, op="tx.rollback", s=s_b)
    create_on(cluster, "A", number, 1)
    with client(cluster, "B") as c:
        s = begin(c)
        assert unpack(lookup(c, s, number)["o"][3])["balance"] == 1
        ok(c, op="tx.rollback", s=s)
