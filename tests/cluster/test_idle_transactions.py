"""No lock held for ever: an idle transaction is rolled back on every node (issue 14).

A transaction with no client op for ``tx_idle`` seconds is rolled back by its
coordinator: its own branch (the locks on the coordinator's own objects, which
used to be held for as long as the connection lived) and its branches on the
other nodes.  Its client hears ``TransactionClosed`` naming the idle time at
its next call; another client gets the lock soon after the timeout.
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
TX_IDLE = 2.0
LOCK_WAIT = 8.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))
    options = {"app": ["tests.distmodel"], "lock_wait": LOCK_WAIT, "tx_idle": TX_IDLE}
    procs = Procs(tmp_path_factory.mktemp("data"), 2, options)
    try:
        procs.start_all()
        procs.wait_quorum(["A", "B"], "Active", 30)
        procs.wait_served()
        yield procs
    finally:
        procs.cleanup()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def request(c: Client, **payload: Any) -> dict[str, Any]:
    reply = c.request(payload)
    assert isinstance(reply, dict), reply
    return reply


def ok(c: Client, **payload: Any) -> dict[str, Any]:
    reply = request(c, **payload)
    assert "error" not in reply, reply
    return reply


def lookup(c: Client, s: int, number: str) -> dict[str, Any]:
    key = pack({"number": number})
    return request(c, op="tx.get", s=s, type=ACC, tv=1, key=key, lock="write")


def test_an_idle_transaction_releases_the_coordinators_own_locks(cluster: Procs) -> None:
    # Objects are placed by partition (the default routing): ``here``'s partition has
    # A (the coordinator) for its active node, ``there``'s has B.
    here, there = (
        cluster.keys_active_on(
            node, ACC, "number", [f"idle-{node}-{os.getpid()}-{i}" for i in range(64)], 1
        )[0]
        for node in "AB"
    )
    with Client([cluster.address("A")], timeout=20, rounds=1) as c:
        s = int(ok(c, op="tx.begin", iso="serializable")["s"])
        for number in (here, there):
            st = pack({"number": number, "balance": 1})
            ok(c, op="tx.create", s=s, type=ACC, tv=1, st=st)
        ok(c, op="tx.commit", s=s)
    with (
        Client([cluster.address("A")], timeout=20, rounds=1) as idle,
        Client([cluster.address("A")], timeout=20, rounds=1) as other,
    ):
        s_idle = int(ok(idle, op="tx.begin", iso="serializable")["s"])
        assert lookup(idle, s_idle, here)["o"] is not None  # A's object, A coordinates
        assert lookup(idle, s_idle, there)["o"] is not None  # and one on B
        # The idle client now does nothing.  Another client asks for A's object: it
        # waits, then gets it soon after tx_idle (well before lock_wait).
        s_other = int(ok(other, op="tx.begin", iso="serializable")["s"])
        t0 = time.monotonic()
        got = lookup(other, s_other, here)
        took = time.monotonic() - t0
        assert "error" not in got, got
        assert unpack(got["o"][3])["balance"] == 1
        assert took < TX_IDLE + 2.0 < LOCK_WAIT, f"waited {took:.2f}s for an idle lock"
        assert lookup(other, s_other, there)["o"] is not None  # B's branch is gone too
        ok(other, op="tx.rollback", s=s_other)
        # The idle client's next call: a clear error naming the idle time.
        late = request(idle, op="tx.count", s=s_idle, type=ACC)
        assert late.get("error") == "TransactionClosed", late
        assert f"rolled back after {TX_IDLE:g} s idle" in late["message"]
