"""The node's data service on a real 3-node cluster (data-path.md sections 3-5).

Driven with raw ``Client.request`` payloads, as the client library will send
them.  One cluster serves the whole module (starting one costs seconds on a
shared 2-core machine), routing by partition (the default): ``node=`` of a create
is ignored there, so a test that needs an object served by a given node picks a key
whose partition that node acts for (:func:`numbers_on`).  The tests of routing by
node (creates on named nodes, lookup hints, killed nodes) are in
test_data_service_by_node.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.distmodel  # noqa: F401  (the types the nodes load with --app)
from nonstop.client import AsyncClient, Client
from nonstop.ha.partition_table import partition_location
from nonstop.model.codec import pack, unpack
from tests.cluster.conftest import Procs

ROOT = Path(__file__).resolve().parents[2]
ACC = "dist.Account"
_ids = itertools.count(1)


@contextlib.contextmanager
def data_cluster(folder: Path, **options: Any) -> Iterator[Procs]:
    """Three nodes serving tests.distmodel, Active and every partition served, then gone."""
    # The node processes import tests.distmodel: make the repository importable.
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))
    procs = Procs(
        folder,
        3,
        {"app": ["tests.distmodel"], "lock_wait": 1.0, "branch_idle": 10.0, **options},
    )
    try:
        procs.start_all()
        procs.wait_quorum(["A", "B", "C"], "Active", 30)
        procs.wait_served(["A", "B", "C"])
        yield procs
    finally:
        procs.cleanup()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    """Routing by partition, the default (the tests of routing by node are in
    test_data_service_by_node.py)."""
    with data_cluster(tmp_path_factory.mktemp("data")) as procs:
        yield procs


def client(cluster: Procs, node: str = "A") -> Client:
    return Client([cluster.address(node)], timeout=20, rounds=1)


def ok(c: Client, **payload: Any) -> Any:
    reply = c.request(payload)
    assert isinstance(reply, dict) and "error" not in reply, reply
    return reply


def fails(c: Client, error: str, **payload: Any) -> dict[str, Any]:
    reply = c.request(payload)
    assert isinstance(reply, dict) and reply.get("error") == error, reply
    return reply  # type: ignore[no-any-return]


def begin(c: Client, iso: str = "serializable") -> int:
    return int(ok(c, op="tx.begin", iso=iso)["s"])


def uniq(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_ids)}"


def state(obj: list[Any]) -> dict[str, Any]:
    return unpack(obj[3])  # type: ignore[no-any-return]


def create(
    c: Client, s: int, number: str, balance: int = 0, node: str | None = None, **kw: Any
) -> list[Any]:
    fields = {"number": number, "balance": balance, **kw}
    payload: dict[str, Any] = {"s": s, "type": ACC, "tv": 1, "st": pack(fields)}
    if node is not None:
        payload["node"] = node
    return ok(c, op="tx.create", **payload)["o"]  # type: ignore[no-any-return]


def get(c: Client, s: int, number: str, lock: str | None = None) -> list[Any] | None:
    reply = ok(c, op="tx.get", s=s, type=ACC, tv=1, key=pack({"number": number}), lock=lock)
    return reply["o"]  # type: ignore[no-any-return]


def write(obj: list[Any], **changes: Any) -> list[Any]:
    return [obj[0], obj[1], obj[2], pack(changes)]


def make_accounts(cluster: Procs, spec: dict[str, tuple[str, int]]) -> dict[str, list[Any]]:
    """Create accounts ``number -> (master node, balance)`` in one committed transaction."""
    with client(cluster) as c:
        s = begin(c)
        objs = {n: create(c, s, n, bal, node=node) for n, (node, bal) in spec.items()}
        ok(c, op="tx.commit", s=s)
    return objs


def balances(cluster: Procs, numbers: list[str], node: str = "C") -> dict[str, int]:
    with client(cluster, node) as c:
        s = begin(c)
        out = {}
        for n in numbers:
            o = get(c, s, n)
            assert o is not None, n
            out[n] = state(o)["balance"]
        ok(c, op="tx.commit", s=s)
    return out


def nodes_seen_by(cluster: Procs, node: str) -> list[dict[str, Any]]:
    with client(cluster, node) as c:
        return ok(c, op="nodes")["nodes"]  # type: ignore[no-any-return]


def servers(cluster: Procs) -> dict[int, str]:
    """Reference location -> the node serving it: a node's own location (routing by
    node), a partition's location -> its active node (routing by partition)."""
    with client(cluster) as c:
        nodes = ok(c, op="nodes")["nodes"]
    by_location = {n["location"]: n["name"] for n in nodes}
    for part in cluster.status("A")["partitions"]:
        by_location[partition_location(part["name"])] = part["active"]
    return by_location


def master_of(cluster: Procs, obj: list[Any]) -> str:
    """The node serving ``obj`` (see :func:`servers`)."""
    return servers(cluster)[int.from_bytes(obj[0][:8], "big")]


def numbers_on(cluster: Procs, nodes: str, prefix: str) -> list[str]:
    """New account numbers, the i-th served by ``nodes[i]`` wherever it is created: under
    routing by partition the key picks the partition, so candidates are tried (created in
    a session rolled back) until each node has one."""
    wanted = list(nodes)
    found: list[str | None] = [None] * len(wanted)
    by_location = servers(cluster)
    with client(cluster) as c:
        s = begin(c)
        for _ in range(40 * len(wanted)):
            number = uniq(prefix)
            node = by_location[int.from_bytes(create(c, s, number)[0][:8], "big")]
            if node in wanted:
                i = wanted.index(node)
                wanted[i] = ""
                found[i] = number
                if all(found):
                    break
        ok(c, op="tx.rollback", s=s)
    assert all(found), (nodes, found)
    return [n for n in found if n is not None]


# ====================================================================== tests
def test_nodes_and_types(cluster: Procs) -> None:
    with client(cluster, "B") as c:
        nodes = ok(c, op="nodes")["nodes"]
        assert [n["name"] for n in nodes] == ["B", "A", "C"]
        assert all(n["up"] for n in nodes)
        assert len({n["location"] for n in nodes}) == 3
        assert {n["address"] for n in nodes} == {cluster.address(x) for x in "ABC"}
        types = ok(c, op="types")["types"]
        assert types[ACC]["version"] == 1
        assert types["dist.Note"]["version"] == 2
        assert set(types[ACC]["schema"]["fields"]) == {"number", "owner", "balance"}


def stats_of(cluster: Procs, node: str) -> dict[str, int]:
    """The data service's counters of ``node``."""
    with client(cluster, node) as c:
        return c.request({"op": "runtime_stats"})["data"]  # type: ignore[no-any-return]


def two_phase_commits(cluster: Procs, node: str) -> int:
    """Distributed commits ``node`` coordinated so far."""
    return int(stats_of(cluster, node).get("two_phase", 0))


def test_a_node_keeps_its_start_up_objects_out_of_garbage_collection(cluster: Procs) -> None:
    # Issue 14: a full collection walked every module, class and table of start-up (≈ 60,000
    # objects, 40-160 ms with the loop held); they are frozen once the node listens.
    with client(cluster, "A") as c:
        lag = c.request({"op": "runtime_stats"})["loop_lag"]
    assert lag["gc_frozen"] > 10_000


def test_the_replicas_data_has_a_route_of_its_own(cluster: Procs) -> None:
    """``rep/`` keys go through their own bounded route to the cluster store's writer
    (runtime.md, Persists): a replicated commit moves that route's counters."""

    def counters() -> dict[str, int]:
        with client(cluster, "A") as c:
            return c.request({"op": "runtime_stats"})["stats"]  # type: ignore[no-any-return]

    before = counters()
    (a,) = numbers_on(cluster, "A", "repw")
    with client(cluster, "A") as c:
        s = begin(c)
        create(c, s, a, 1)
        ok(c, op="tx.commit", s=s, req=[uniq("repw"), 1])
    after = counters()
    for key in ("rep_persists", "rep_store_commits"):
        assert after.get(key, 0) > before.get(key, 0), key
    assert after["commits"] > before["commits"]  # the one writer's commits


def test_begin_folded_into_the_first_op(cluster: Procs) -> None:
    a = uniq("fold")
    with client(cluster, "B") as c:
        reply = ok(
            c,
            op="tx.create",
            begin="serializable",
            type=ACC,
            tv=1,
            st=pack({"number": a, "balance": 4}),
        )
        s = reply["s"]
        assert state(reply["o"])["number"] == a
        ok(c, op="tx.commit", s=s)
        # A failing first op still opened the session: its id comes with the error.
        bad = fails(
            c, "UnknownType", op="tx.get", begin="read_committed", type="no.T", tv=1, key=pack({})
        )
        assert get(c, bad["s"], a) is not None
        ok(c, op="tx.rollback", s=bad["s"])
        fails(c, "BadArgument", op="tx.get", begin="chaos", type=ACC, tv=1, key=pack({}))
    assert balances(cluster, [a]) == {a: 4}


def test_one_phase_commit_on_the_coordinator(cluster: Procs) -> None:
    (a,) = numbers_on(cluster, "A", "one")
    before = two_phase_commits(cluster, "A")
    with client(cluster, "A") as c:
        s = begin(c)
        obj = create(c, s, a, 10)
        # A read elsewhere (a branch on B and C) does not make it two-phase.
        assert get(c, s, uniq("nobody")) is None
        ok(c, op="tx.commit", s=s, w=[write(obj, balance=11)], req=[uniq("one"), 1])
    assert balances(cluster, [a]) == {a: 11}
    # No distributed transaction was started for it: only one node wrote.
    assert two_phase_commits(cluster, "A") == before


def test_two_phase_transfer_with_deferred_writes(cluster: Procs) -> None:
    x, y = numbers_on(cluster, "BC", "x")
    make_accounts(cluster, {x: ("B", 100), y: ("C", 0)})
    before = two_phase_commits(cluster, "A")
    with client(cluster, "A") as c:
        s = begin(c)
        ox = get(c, s, x, lock="write")
        oy = get(c, s, y, lock="write")
        assert ox is not None and oy is not None
        # Field writes are deferred: they travel with the commit (C5).
        w = [write(ox, balance=70), write(oy, balance=30)]
        assert ok(c, op="tx.commit", s=s, w=w, req=["t-client", 1]) == {"ok": True}
    assert balances(cluster, [x, y]) == {x: 70, y: 30}
    assert two_phase_commits(cluster, "A") == before + 1


def test_exactly_once_commit_and_request_result(cluster: Procs) -> None:
    a = uniq("h1")
    cid = uniq("client")
    with client(cluster, "A") as c:
        assert ok(c, op="request.result", req=[cid, 7])["state"] == "unknown"
        s = begin(c)
        create(c, s, a, 5, node="B")
        assert ok(c, op="tx.commit", s=s, req=[cid, 7]) == {"ok": True}
        assert ok(c, op="request.result", req=[cid, 7])["state"] == "committed"
        # The reply was "lost": the client retries the same commit request.
        assert ok(c, op="tx.commit", s=s, req=[cid, 7]) == {"ok": True}
        # Even a fresh session with the same request id does not run again.
        s2 = begin(c)
        create(c, s2, a + "-dup", 1)
        assert ok(c, op="tx.commit", s=s2, req=[cid, 7]) == {"ok": True}
        s3 = begin(c)
        assert get(c, s3, a + "-dup") is None
        assert state(get(c, s3, a) or [])["balance"] == 5
        ok(c, op="tx.rollback", s=s3)
        fails(c, "BadArgument", op="request.result", req=["x"])
    # Durable, not only in memory: the node that recorded it was asked directly.
    with client(cluster, "A") as c:
        assert ok(c, op="request.result", req=[cid, 7])["state"] == "committed"


def test_cluster_queries_merge_order_and_limit(cluster: Procs) -> None:
    owner = uniq("q")
    spec = {n: ("ABC"[i % 3], i) for i, n in enumerate(numbers_on(cluster, "ABC" * 3, owner))}
    make_accounts(cluster, spec)
    with client(cluster, "A") as c:
        s = begin(c)
        # Set owners (deferred writes, flushed before the query, C5): "o<owner>-<i>".
        objs = {n: get(c, s, n, lock="write") for n in spec}
        w = [write(o, owner=f"{owner}/{8 - i}") for i, o in enumerate(objs.values()) if o]
        rng = pack(["owner", f"{owner}/", f"{owner}/~", True, False])
        got = ok(c, op="tx.query", s=s, type=ACC, tv=1, range=rng, w=w)["os"]
        owners = [state(o)["owner"] for o in got]
        assert owners == sorted(owners) and len(owners) == 9
        assert len({o[0] for o in got}) == 9
        desc = ok(
            c,
            op="tx.query",
            s=s,
            type=ACC,
            tv=1,
            range=rng,
            order=["owner", True],
            limit=4,
        )["os"]
        assert [state(o)["owner"] for o in desc] == sorted(owners, reverse=True)[:4]
        local = ok(c, op="tx.query", s=s, type=ACC, tv=1, range=rng, scope="local")["os"]
        assert {master_of(cluster, o) for o in local} == {"A"} and len(local) == 3
        some = ok(c, op="tx.query", s=s, type=ACC, tv=1, range=rng, scope=["B", "C"])["os"]
        assert {master_of(cluster, o) for o in some} == {"B", "C"} and len(some) == 6
        where = pack({"owner": f"{owner}/3"})
        one = ok(c, op="tx.query", s=s, type=ACC, tv=1, where=where)["os"]
        assert [state(o)["owner"] for o in one] == [f"{owner}/3"]
        total = ok(c, op="tx.count", s=s, type=ACC, tv=1)["n"]
        assert total >= 9
        ok(c, op="tx.commit", s=s)


def test_remote_call_runs_on_the_master(cluster: Procs) -> None:
    a, b = numbers_on(cluster, "AB", "c")
    objs = make_accounts(cluster, {a: ("A", 1), b: ("B", 10)})
    with client(cluster, "A") as c:
        s = begin(c)
        ob = get(c, s, b)
        assert ob is not None
        reply = ok(c, op="tx.call", s=s, ref=ob[0], m="deposit", a=pack([[5], {}]))
        assert unpack(reply["r"]) == 15
        assert [state(o)["balance"] for o in reply["os"]] == [15]
        # A deferred write flushed before the call is seen by the method.
        reply = ok(
            c,
            op="tx.call",
            s=s,
            ref=ob[0],
            m="deposit",
            a=pack([[1], {}]),
            w=[write(reply["os"][0], owner="zed")],
        )
        assert unpack(reply["r"]) == 16 and state(reply["os"][0])["owner"] == "zed"
        # Not marked remote: refused on another node's object (C4)...
        fails(c, "NotRemote", op="tx.call", s=s, ref=ob[0], m="audit_note", a=pack([[], {}]))
        ok(c, op="tx.commit", s=s)
    assert balances(cluster, [b]) == {b: 16}
    with client(cluster, "A") as c:
        s = begin(c)
        # ...but any method may run on an object of the attached node.
        reply = ok(c, op="tx.call", s=s, ref=objs[a][0], m="audit_note", a=pack([[], {}]))
        assert unpack(reply["r"]) == f"{a}:1"
        fails(c, "BadArgument", op="tx.call", s=s, ref=objs[a][0], m="_e", a=pack([[], {}]))
        fails(c, "BadArgument", op="tx.call", s=s, ref=objs[a][0], m="nope", a=pack([[], {}]))
        # An exception of the method comes back as its error; the session goes on.
        fails(c, "BadArgument", op="tx.call", s=s, ref=objs[a][0], m="deposit", a=pack([[-1], {}]))
        ok(c, op="tx.rollback", s=s)


def test_delete_a_remote_object(cluster: Procs) -> None:
    gone, kept = uniq("del"), uniq("keep")
    objs = make_accounts(cluster, {gone: ("C", 1), kept: ("C", 2)})
    with client(cluster, "A") as c:
        s = begin(c)
        o = get(c, s, gone, lock="write")
        assert o is not None
        assert ok(c, op="tx.delete", s=s, ref=o[0]) == {}
        assert get(c, s, gone) is None  # this transaction sees its own delete
        fails(c, "NotFound", op="tx.delete", s=s, ref=o[0])
        ok(c, op="tx.commit", s=s)
        s = begin(c)
        assert ok(c, op="tx.ref", s=s, ref=objs[gone][0])["o"] is None
        assert get(c, s, gone) is None
        assert get(c, s, kept) is not None
        ok(c, op="tx.rollback", s=s)


def test_bulk_ops_run_on_the_node(cluster: Procs) -> None:
    owner = uniq("bulk")
    make_accounts(cluster, {n: ("B", i) for i, n in enumerate(numbers_on(cluster, "BBB", owner))})
    with client(cluster, "B") as c:
        plan = ok(c, op="bulk.plan", type=ACC, tv=1, splits=2)
        assert plan["node"] == "B" and plan["count"] >= 3 and plan["ranges"]
        fails(c, "BadArgument", op="bulk.plan", type=ACC, tv=1, splits=0)
        fails(c, "BadArgument", op="bulk.nothing")


def test_stale_write_is_a_conflict(cluster: Procs) -> None:
    b = uniq("stale")
    make_accounts(cluster, {b: ("B", 1)})
    with client(cluster, "A") as c1, client(cluster, "C") as c2:
        # Serializable: the read waits for phase two of the creating commit (its
        # locks), where a lock-free read_committed one could still miss it.
        s1 = begin(c1)
        old = get(c1, s1, b)
        assert old is not None
        ok(c1, op="tx.rollback", s=s1)
        s2 = begin(c2)
        fresh = get(c2, s2, b, lock="write")
        assert fresh is not None
        ok(c2, op="tx.commit", s=s2, w=[write(fresh, balance=2)])
        # Writing on the copy read before that commit: Conflict (B7), retryable.
        s3 = begin(c1)
        assert get(c1, s3, b, lock="write") is not None
        fails(c1, "Conflict", op="tx.commit", s=s3, w=[write(old, balance=99)])
        fails(c1, "TransactionClosed", op="tx.get", s=s3, type=ACC, tv=1, key=pack({"number": b}))
    assert balances(cluster, [b]) == {b: 2}


def test_bad_inputs(cluster: Procs) -> None:
    with client(cluster, "A") as c:
        s = begin(c)
        fails(c, "UnknownType", op="tx.get", s=s, type="no.Such", tv=1, key=pack({"x": 1}))
        fails(c, "TypeVersionMismatch", op="tx.create", s=s, type="dist.Note", tv=1, st=pack({}))
        fails(
            c,
            "BadArgument",
            op="tx.create",
            s=s,
            type=ACC,
            tv=1,
            st=pack({"number": "n"}),
            node="Z",
        )
        fails(c, "BadArgument", op="tx.query", s=s, type=ACC, tv=1, scope=["A", "Z"])
        fails(c, "BadArgument", op="tx.query", s=s, type=ACC, tv=1, audit="sometimes")
        fails(c, "BadArgument", op="tx.ref", s=s, ref=b"short")
        fails(c, "BadArgument", op="tx.ref", s=s, ref=b"\xff" * 20)  # no node has it
        fails(c, "FieldError", op="tx.create", s=s, type=ACC, tv=1, st=pack({"nope": 1}))
        fails(c, "BadArgument", op="tx.begin", iso="chaos")
        fails(c, "BadArgument", op="tx.commit", s=s, req=["c", -1])
        # After those errors the session still works and commits.
        create(c, s, uniq("after-errors"))
        ok(c, op="tx.commit", s=s)
        fails(c, "TransactionClosed", op="tx.count", s=s, type=ACC, tv=1)
        fails(c, "TransactionClosed", op="tx.commit", s=s)
        fails(c, "TransactionClosed", op="tx.get", s=999_999, type=ACC, tv=1, key=pack({}))
        assert ok(c, op="tx.rollback", s=s) == {}
    with client(cluster, "B") as other:
        # A session belongs to its connection: another client cannot use it.
        s = begin(other)
        with client(cluster, "B") as third:
            fails(third, "TransactionClosed", op="tx.count", s=s, type=ACC, tv=1)
        ok(other, op="tx.rollback", s=s)


def test_closed_connection_rolls_back_its_branches(cluster: Procs) -> None:
    b = uniq("held")
    make_accounts(cluster, {b: ("B", 1)})
    c1 = client(cluster, "A")
    s1 = begin(c1)
    assert get(c1, s1, b, lock="write") is not None  # a write lock held on B
    c1.close()
    started = time.monotonic()
    with client(cluster, "C") as c2:
        s2 = begin(c2)
        # Granted well before the 2 s idle timeout: the coordinator ended the branch.
        assert get(c2, s2, b, lock="write") is not None
        ok(c2, op="tx.rollback", s=s2)
    assert time.monotonic() - started < 1.5


def test_lock_wait_timeout_is_retryable(cluster: Procs) -> None:
    b = uniq("wait")
    make_accounts(cluster, {b: ("B", 1)})
    with client(cluster, "A") as c1, client(cluster, "C") as c2:
        s1 = begin(c1)
        assert get(c1, s1, b, lock="write") is not None
        s2 = begin(c2)
        fails(
            c2,
            "LockTimeout",
            op="tx.get",
            s=s2,
            type=ACC,
            tv=1,
            key=pack({"number": b}),
            lock="write",
        )
        # The loser's session is over everywhere; the holder goes on and commits.
        fails(c2, "TransactionClosed", op="tx.count", s=s2, type=ACC, tv=1)
        ok(c1, op="tx.commit", s=s1, w=[write(get(c1, s1, b) or [], balance=5)])
    assert balances(cluster, [b]) == {b: 5}


def test_concurrent_cross_node_transfers_conserve_money(cluster: Procs) -> None:
    numbers = [uniq("m") for _ in range(6)]
    make_accounts(cluster, {n: ("ABC"[i % 3], 1000) for i, n in enumerate(numbers)})
    applied: dict[str, int] = dict.fromkeys(numbers, 0)
    retries = collections.Counter[str]()

    async def transfer(c: AsyncClient, src: str, dst: str, amount: int) -> None:
        while True:
            s = (await c.request({"op": "tx.begin"}))["s"]
            objs = {}
            failed = None
            # Half of the workers lock in the opposite order: distributed deadlocks
            # happen and end by lock-wait timeout (B4), then the transfer is replayed.
            for n in (src, dst):
                r = await c.request(
                    {
                        "op": "tx.get",
                        "s": s,
                        "type": ACC,
                        "tv": 1,
                        "key": pack({"number": n}),
                        "lock": "write",
                    }
                )
                if "error" in r:
                    failed = r
                    break
                objs[n] = r["o"]
            if failed is None:
                w = [
                    write(objs[src], balance=state(objs[src])["balance"] - amount),
                    write(objs[dst], balance=state(objs[dst])["balance"] + amount),
                ]
                failed = await c.request({"op": "tx.commit", "s": s, "w": w})
                if "error" not in failed:
                    applied[src] -= amount
                    applied[dst] += amount
                    return
            assert failed["error"] in ("LockTimeout", "Deadlock", "Conflict"), failed
            retries[failed["error"]] += 1
            await c.request({"op": "tx.rollback", "s": s})

    async def worker(i: int) -> None:
        async with AsyncClient([cluster.address("ABC"[i % 3])], timeout=30, rounds=1) as c:
            for k in range(6):
                src, dst = numbers[(i + k) % 6], numbers[(i + 2 * k + 1) % 6]
                if src == dst:
                    continue
                await transfer(c, src, dst, 1 + (i + k) % 7)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(9))), 90)

    asyncio.run(main())
    final = balances(cluster, numbers, "B")
    assert sum(final.values()) == 6 * 1000
    assert final == {n: 1000 + applied[n] for n in numbers}, (final, applied, retries)
