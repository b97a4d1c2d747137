"""The node's data service under routing by node (``ha.data = "nodes"``), on a real
3-node cluster (data-path.md sections 3-5).

Routing by node is still a supported mode, and these tests are about it: an object
lives on the node that created it (``node=``) and its reference names that node, a
lookup that missed asks the node that answered last, and a killed node's objects are
``Unavailable`` until it is back (no replica takes over).  The data service's other
tests run under the default, routing by partition, in test_data_service.py; a killed
participant or coordinator under the default: test_replication_handover.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from nonstop.model.codec import pack
from tests.cluster.conftest import Procs, wait_until
from tests.cluster.test_data_service import (
    ACC,
    balances,
    begin,
    client,
    create,
    data_cluster,
    fails,
    get,
    make_accounts,
    master_of,
    nodes_seen_by,
    ok,
    state,
    stats_of,
    uniq,
    write,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    # Pinned to routing by node: the subject of this module (module doc).
    with data_cluster(tmp_path_factory.mktemp("bynode"), ha={"data": "nodes"}) as procs:
        yield procs


def test_create_on_named_nodes_and_read_anywhere(cluster: Procs) -> None:
    a, b, c_ = uniq("a"), uniq("b"), uniq("c")
    objs = make_accounts(cluster, {a: ("A", 1), b: ("B", 2), c_: ("C", 3)})
    assert master_of(cluster, objs[a]) == "A"
    assert master_of(cluster, objs[b]) == "B"
    assert master_of(cluster, objs[c_]) == "C"
    assert objs[b][2] == 0  # created in this transaction: version 0
    # From any node, a unique lookup finds the object wherever it lives.
    for node in "ABC":
        assert balances(cluster, [a, b, c_], node) == {a: 1, b: 2, c_: 3}
    with client(cluster, "C") as c:
        s = begin(c)
        o = ok(c, op="tx.ref", s=s, ref=objs[b][0])["o"]
        assert state(o)["number"] == b and o[2] == 1  # committed once: version 1
        assert get(c, s, uniq("missing")) is None
        ok(c, op="tx.rollback", s=s)


def test_repeated_remote_lookup_asks_one_node(cluster: Procs) -> None:
    c_ = uniq("hint")
    make_accounts(cluster, {c_: ("C", 4)})
    # Until phase two reached C, B's lock-free probe of C misses the new account and
    # the lookup ends in the locked pass (more RPCs, data-path.md §7): wait for it.
    assert balances(cluster, [c_], node="C") == {c_: 4}

    def rpcs() -> int:
        with client(cluster, "B") as c:
            return int(c.request({"op": "runtime_stats"})["data"].get("rpc", 0))

    with client(cluster, "B") as c:
        s = begin(c)
        first = rpcs()
        assert get(c, s, c_) is not None  # not on B: asks A and C
        second = rpcs()
        ok(c, op="tx.rollback", s=s)
        s = begin(c)
        third = rpcs()
        assert get(c, s, c_) is not None  # C answered last time: asks only C
        fourth = rpcs()
        ok(c, op="tx.rollback", s=s)
    assert second - first == 2
    assert fourth - third == 1


def test_participant_killed_mid_transaction(cluster: Procs) -> None:
    b, c_, d = uniq("kb"), uniq("kc"), uniq("kd")
    make_accounts(cluster, {b: ("B", 1), c_: ("C", 1), d: ("C", 1)})
    with client(cluster, "A") as c, client(cluster, "A") as idle:
        s = begin(c)
        ob = get(c, s, b, lock="write")
        oc = get(c, s, c_, lock="write")
        assert ob is not None and oc is not None
        # Another session, idle (its client thinking), holds a lock on C and a
        # branch on B.
        si = begin(idle)
        assert get(idle, si, b, lock="none") is not None
        assert get(idle, si, d, lock="write") is not None
        cluster.kill("B")
        started = time.monotonic()
        # Rolled back when B went Down, nothing committed: TransactionLost (an Unavailable
        # that @transactional replays, issue 10 H4).
        reply = fails(
            c,
            "TransactionLost",
            op="tx.commit",
            s=s,
            w=[write(ob, balance=0), write(oc, balance=2)],
        )
        assert time.monotonic() - started < 10, reply
        fails(c, "TransactionClosed", op="tx.count", s=s, type=ACC, tv=1)
        # The other branch was released: C's lock is free at once.
        s2 = begin(c)
        fails(c, "Unavailable", op="tx.query", s=s2, type=ACC, tv=1, audit="fail_if_down")
        # The idle session was rolled back when B went Down, without its client
        # doing anything: its lock on C is free, and its next op says why.
        with client(cluster, "C") as other:
            s4 = begin(other)
            assert get(other, s4, d, lock="write") is not None
            ok(other, op="tx.rollback", s=s4)
        reply = fails(idle, "TransactionLost", op="tx.count", s=si, type=ACC, tv=1)
        assert "B" in reply["message"]
        # A found b on B before: with B down, a lookup of b is Unavailable, never a
        # false "not found"; fail_if_down refuses any lookup while B is down.
        s5 = begin(c)
        fails(c, "Unavailable", op="tx.get", s=s5, type=ACC, tv=1, key=pack({"number": b}))
        s5 = begin(c)
        reply = c.request(
            {
                "op": "tx.get",
                "s": s5,
                "type": ACC,
                "tv": 1,
                "key": pack({"number": c_}),
                "audit": "fail_if_down",
            }
        )
        assert reply.get("error") == "Unavailable", reply
        # A key that exists nowhere: with B down nobody can say so, and a
        # get_or_create must not create a second object that B may hold.
        s6 = begin(c)
        reply = fails(
            c, "Unavailable", op="tx.get", s=s6, type=ACC, tv=1, key=pack({"number": uniq("no")})
        )
        assert "B" in reply["message"]
        # A key found on a node that is up is an answer as usual.
        s7 = begin(c)
        assert get(c, s7, c_) is not None
        ok(c, op="tx.rollback", s=s7)
    # skip_down leaves out the nodes C sees Down: wait until C's detector has seen B go
    # (each node's own; on a slow machine C may still count B as up here, ask it, and the
    # session then rolls back when B is seen Down: a clean-clone failure).
    wait_until(
        lambda: not {n["name"]: n["up"] for n in nodes_seen_by(cluster, "C")}["B"],
        15,
        "C sees B down",
    )
    with client(cluster, "C") as c3:
        s3 = begin(c3)
        held = get(c3, s3, c_, lock="write")
        assert held is not None and state(held)["balance"] == 1  # nothing committed
        # skip_down leaves the dead node out; at_least_one too.
        got = ok(c3, op="tx.count", s=s3, type=ACC, tv=1, audit="skip_down")["n"]
        assert got >= 1
        ok(c3, op="tx.rollback", s=s3)
    # B comes back on its data: its object is as committed, and it takes part again.
    cluster.start("B")
    wait_until(
        lambda: all(n["up"] for x in "ABC" for n in nodes_seen_by(cluster, x)), 20, "B up again"
    )
    with client(cluster, "A") as c:
        s = begin(c)
        ob = get(c, s, b, lock="write")
        oc = get(c, s, c_, lock="write")
        assert ob is not None and oc is not None and state(ob)["balance"] == 1
        ok(c, op="tx.commit", s=s, w=[write(ob, balance=0), write(oc, balance=2)])
    assert balances(cluster, [b, c_]) == {b: 0, c_: 2}


def test_coordinator_killed_participants_roll_back_on_their_own(cluster: Procs) -> None:
    c_ = uniq("orphan")
    make_accounts(cluster, {c_: ("C", 1)})
    cid = uniq("restart")
    with client(cluster, "A") as c:
        s = begin(c)
        create(c, s, cid, 3, node="B")
        assert ok(c, op="tx.commit", s=s, req=[cid, 1]) == {"ok": True}
    a = client(cluster, "A")
    s = begin(a)
    assert get(a, s, c_, lock="write") is not None  # C holds the lock for A's session
    cluster.kill("A")
    a.close()
    started = time.monotonic()
    orphans = int(stats_of(cluster, "C").get("orphan_rollbacks", 0))
    with client(cluster, "C") as c3:

        def granted() -> bool:
            s3 = begin(c3)
            reply = c3.request(
                {
                    "op": "tx.get",
                    "s": s3,
                    "type": ACC,
                    "tv": 1,
                    "key": pack({"number": c_}),
                    "lock": "write",
                }
            )
            if "error" in reply:
                assert reply["error"] == "LockTimeout", reply
                return False
            c3.request({"op": "tx.rollback", "s": s3})
            return True

        # C sees A Down and rolls A's open branch back: the lock is granted long
        # before branch_idle (10 s here) would have ended it (B8).
        wait_until(granted, 15, "the orphaned branch to roll back")
    assert time.monotonic() - started < 6
    assert int(stats_of(cluster, "C").get("orphan_rollbacks", 0)) == orphans + 1
    # The restarted coordinator still knows the outcome of its request (H1): durable.
    cluster.start("A")
    # (Until A sees its peers, a lookup of an absent key is Unavailable, not "none".)
    wait_until(lambda: all(n["up"] for n in nodes_seen_by(cluster, "A")), 20, "A sees its peers")
    with client(cluster, "A") as c:
        # "running" while A's own branch may still be in doubt (killed between the
        # decision and its phase two): then "committed", never "unknown".
        states: list[str] = []

        def committed() -> bool:
            states.append(ok(c, op="request.result", req=[cid, 1])["state"])
            return states[-1] == "committed"

        wait_until(committed, 20, "the recovered outcome")
        assert set(states) <= {"running", "committed"}, states
        assert ok(c, op="tx.commit", s=12345, req=[cid, 1]) == {"ok": True}  # a retry
        # A new attempt with the same id, after the restart (nothing in memory): the
        # commit finds the durable result, answers it, and writes nothing.
        s = begin(c)
        create(c, s, cid + "-again", 1)
        assert ok(c, op="tx.commit", s=s, req=[cid, 1]) == {"ok": True}
        s = begin(c)
        assert (
            get(
                c,
                s,
                cid + "-again",
            )
            is None
        )
        ok(c, op="tx.rollback", s=s)
    wait_until(lambda: all(n["up"] for x in "ABC" for n in nodes_seen_by(cluster, x)), 20, "all up")
    assert balances(cluster, [cid, c_], "A") == {cid: 3, c_: 1}
