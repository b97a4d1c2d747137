"""Exactly once per request id across failover on real node processes (docs/design/requests.md).

Three nodes on loopback, ``ha.data = "partitions"``, one sync replica per partition,
the experimental switch on: a transfer committed with a request id and a home on the
node acting for the home's partition, its reply "lost" (read, then ignored), that node
SIGKILLed; the client's own path for a lost reply (``ClientCore.request_result``) learns
"committed" from the survivors as soon as the takeover is done; then, through another
node: ``request.result`` with the home says committed, and the same request id run
again in a new session is answered with the first outcome (``again``) without running --
the balances moved once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop.client import Client
from nonstop.errors import NotCommitted, Retryable
from nonstop.ha.partition_table import partition_location
from nonstop.model.codec import pack, unpack
from tests.cluster.conftest import REAL_CLUSTER, Procs, wait_until
from tests.cluster.replicated_bank import START, replicated_bank, served, table
from tests.distmodel import Account

pytestmark = [
    pytest.mark.skipif(not REAL_CLUSTER, reason="replication is the real cluster node's"),
]

ACC = "dist.Account"


def ask(c: Client, **payload: Any) -> Any:
    reply = c.request(payload)
    assert isinstance(reply, dict), reply
    return reply


def ok(c: Client, **payload: Any) -> Any:
    reply = ask(c, **payload)
    assert "error" not in reply, reply
    return reply


def get(c: Client, s: int, number: str) -> list[Any]:
    key = pack({"number": number})
    o = ok(c, op="tx.get", s=s, type=ACC, tv=1, key=key, lock="write")["o"]
    assert o is not None, number
    return o  # type: ignore[no-any-return]


def transfer(c: Client, req: list[Any], amount: int) -> tuple[bytes, dict[str, Any]]:
    """A transfer X-1 -> X-2 in a new session, committed with request id ``req`` and the
    smaller reference as its home: (home, the commit's reply)."""
    s = int(ok(c, op="tx.begin")["s"])
    objs = [get(c, s, n) for n in ("X-1", "X-2")]
    balances = [unpack(o[3])["balance"] for o in objs]
    w = [
        [objs[0][0], objs[0][1], objs[0][2], pack({"balance": balances[0] - amount})],
        [objs[1][0], objs[1][1], objs[1][2], pack({"balance": balances[1] + amount})],
    ]
    home = min(bytes(objs[0][0]), bytes(objs[1][0]))
    return home, ask(c, op="tx.commit", s=s, w=w, req=req, home=home)


def acting_for(p: Procs, ref: bytes, names: str) -> str:
    location = int.from_bytes(ref[:8], "big")
    for name, part in table(p, names[0]).items():
        if partition_location(name) == location:
            return str(part["active"])
    raise AssertionError(f"no partition has location {location:016x}")


def home_and_victim(p: Procs) -> tuple[bytes, str]:
    """The home of a transfer X-1 -> X-2 (the smaller reference) and the node acting for
    its partition."""
    with Client([p.address("A")], timeout=20, rounds=1) as c:
        s = int(ok(c, op="tx.begin")["s"])
        home = min(bytes(get(c, s, "X-1")[0]), bytes(get(c, s, "X-2")[0]))
        ok(c, op="tx.rollback", s=s)
    return home, acting_for(p, home, "ABC")


@pytest.mark.timeout(240)
def test_a_retry_on_another_node_after_a_kill_gets_the_first_outcome(tmp_path: Path) -> None:
    with replicated_bank(tmp_path, ["X-1", "X-2"]) as bank:
        p = bank.p
        home, victim = home_and_victim(p)
        req = [f"failover-{os.getpid()}", 1]
        with Client([p.address(victim)], timeout=20, rounds=1) as c:
            _, reply = transfer(c, req, 7)
        assert reply.get("ok"), reply  # committed; the client "lost" this reply
        os.kill(p.pids[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        survivors = "".join(n for n in "ABC" if n != victim)
        # The client's own path for a reply lost with its node (client/core.py): the
        # dead node cannot be asked, the survivors are, with the home, until the
        # promoted node answers.  It learns "committed" (it returns), as soon as the
        # takeover is done: the wait is printed (it was ~10.6 s under load, issue 10).
        addresses = [p.address(n) for n in victim + survivors]
        with Client(addresses, timeout=5, rounds=1, op_timeout=60) as c:
            c.sessions.run(c.core.request_result(addresses[0], req, EOFError("lost"), home))
        print(
            f"the lost commit's outcome learned {time.monotonic() - killed_at:.2f} s after the kill"
        )
        wait_until(lambda: served(p, survivors, replicas=False), 60, "the survivors serve all")
        with Client([p.address(survivors[0])], timeout=20, rounds=1) as c:
            result = ok(c, op="request.result", req=req, home=home)
            assert result["state"] == "committed", result
            # The same request run again, through another node: its first outcome.
            _, again = transfer(c, req, 7)
            assert again == {"ok": True, "again": True}, again
        with Client([p.address(survivors[-1])], timeout=20, rounds=1) as c:
            s = int(ok(c, op="tx.begin")["s"])
            moved = [unpack(get(c, s, n)[3])["balance"] for n in ("X-1", "X-2")]
            ok(c, op="tx.rollback", s=s)
        assert moved == [START - 7, START + 7]  # exactly one effect


@pytest.mark.timeout(240)
def test_a_request_settled_at_its_home_never_commits_and_its_client_may_run_it_again(
    tmp_path: Path,
) -> None:
    """requests.md §3 (issue 10, H4): asked with ``fence``, the home records "not
    committed" for a request it has no record of.  A late attempt of that id (its
    coordinator was slow, not dead) then commits nothing -- its answer is the settled
    outcome -- and after a SIGKILL of the node running a transaction, the client's own
    path for a lost commit reply raises ``NotCommitted`` (retryable: ``@transactional``
    runs the function again under a new id) instead of "outcome unknown"."""
    with replicated_bank(tmp_path, ["X-1", "X-2"]) as bank:
        p = bank.p
        home, victim = home_and_victim(p)
        survivors = "".join(n for n in "ABC" if n != victim)
        late_req = [f"late-{os.getpid()}", 1]
        with Client([p.address(survivors[0])], timeout=20, rounds=1) as other:
            settled = ok(other, op="request.result", req=late_req, home=home, fence=True)
        assert settled["state"] == "aborted" and settled["final"], settled
        assert settled["result"][0] == "NotCommitted", settled
        with Client([p.address(victim)], timeout=20, rounds=1) as c:
            _, late = transfer(c, late_req, 5)
        assert late.get("error") == "NotCommitted" and late.get("again"), late

        # A transaction in progress on the node acting for the home, that node killed
        # before the commit's reply: the client's own path settles it on the survivors.
        lost_req = [f"lost-{os.getpid()}", 1]
        with Client([p.address(victim)], timeout=20, rounds=1) as c:
            s = int(ok(c, op="tx.begin")["s"])
            get(c, s, "X-1")
            os.kill(p.pids[victim], signal.SIGKILL)
        addresses = [p.address(n) for n in victim + survivors]
        started = time.monotonic()
        with (
            Client(addresses, timeout=5, rounds=1, op_timeout=60) as c,
            pytest.raises(NotCommitted) as raised,
        ):
            lost = EOFError("lost")
            c.sessions.run(c.core.request_result(addresses[0], lost_req, lost, home))
        assert isinstance(raised.value, Retryable)
        print(f"settled as not committed {time.monotonic() - started:.2f} s after the kill")
        wait_until(lambda: served(p, survivors, replicas=False), 60, "the survivors serve all")
        with Client([p.address(survivors[-1])], timeout=20, rounds=1) as c:
            again = ok(c, op="request.result", req=lost_req, home=home)
            assert again["state"] == "aborted" and again["final"], again
            _, fresh = transfer(c, [f"fresh-{os.getpid()}", 1], 3)
            assert fresh == {"ok": True}, fresh
            s = int(ok(c, op="tx.begin")["s"])
            moved = [unpack(get(c, s, n)[3])["balance"] for n in ("X-1", "X-2")]
            ok(c, op="tx.rollback", s=s)
        assert moved == [START - 3, START + 3]  # only the fresh request moved money


@pytest.mark.timeout(240)
def test_transactional_rides_out_the_kill_of_the_node_running_it(tmp_path: Path) -> None:
    """issue 10 (H4, "an application sees at most a retryable error during the takeover,
    which ``@nonstop.transactional`` replays"): the node a transaction runs on is SIGKILLed
    between two of its operations.  The lost connection is ``TransactionLost`` (retryable:
    the node rolled it back, nothing committed), the function runs again on the next node
    -- through the takeover's ``NotActive`` refusals -- and returns; the caller sees no
    error and the money moved once."""
    with replicated_bank(tmp_path, ["X-1", "X-2"]) as bank:
        p = bank.p
        victim = "A"
        order = [p.address(n) for n in "ABC"]
        attempts: list[str] = []

        @nonstop.transactional
        def transfer_once(tx: Any, amount: int) -> None:
            src = tx.get(Account, number="X-1", lock="write")
            if not attempts:
                os.kill(p.pids[victim], signal.SIGKILL)  # the node running this attempt
            attempts.append("run")
            dst = tx.get(Account, number="X-2", lock="write")
            src.balance -= amount
            dst.balance += amount

        started = time.monotonic()
        with nonstop.connect(order, balance="first", timeout=2.0) as db:
            transfer_once(db, 9)
        print(f"committed {time.monotonic() - started:.2f} s after the kill, {len(attempts)} runs")
        assert len(attempts) >= 2, attempts  # the first attempt was lost with its node
        with nonstop.connect(order[1:]) as db, db.transaction() as tx:
            moved = [tx.get(Account, number=n).balance for n in ("X-1", "X-2")]
        assert moved == [START - 9, START + 9]
