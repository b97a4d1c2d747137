"""The client data API against a real 3-node cluster (issue 4, client side).

The README's ``transfer`` runs unchanged through ``nonstop.connect`` with
accounts mastered on different nodes, from threads and from asyncio tasks;
remote methods, cluster queries, deferred writes, bad inputs, and the attached
node SIGKILLed mid-transaction.  Nodes load ``tests.distmodel`` (``--app``).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import nonstop
from nonstop.model import managed
from tests.cluster.conftest import Procs, wait_until
from tests.distmodel import Account, Note

NAMES = ["A", "B", "C"]
T = TypeVar("T")


@nonstop.transactional  # the README's function, unchanged
def transfer(tx, src, dst, amount):  # type: ignore[no-untyped-def]
    a = tx.get(Account, number=src, lock="write")
    b = tx.get(Account, number=dst, lock="write")
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount


@nonstop.transactional
async def transfer_async(tx, src, dst, amount):  # type: ignore[no-untyped-def]
    a = await tx.get(Account, number=src, lock="write")
    b = await tx.get(Account, number=dst, lock="write")
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount


def start(folder: Path, **options: object) -> Procs:
    procs = Procs(folder, 3, {"app": ["tests.distmodel"], **options})
    procs.start_all()
    addresses = [procs.address(n) for n in NAMES]

    def everyone_up() -> bool:
        for address in addresses:
            with nonstop.Client([address], timeout=1, rounds=1) as c:
                if not all(n["up"] for n in c.nodes()):
                    return False
        return True

    wait_until(everyone_up, 30, "every node to see every node up")
    procs.wait_served()
    return procs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # A slower failure detector than the suite's: no node looks down under CPU load
    # while the tests below count objects across the cluster.
    procs = start(tmp_path_factory.mktemp("remote"), nonresponse_timeout=2.0)
    try:
        addresses = ",".join(procs.address(n) for n in NAMES)
        with nonstop.connect(addresses) as c, c.transaction() as tx:
            # Three accounts per letter; under routing by partition (the default) node=
            # is ignored and each account goes to its key's partition.
            for node in NAMES:
                for i in range(3):
                    tx.create(
                        Account,
                        number=f"{node}-{i}",
                        owner=f"{node.lower()}{i}",
                        balance=100,
                        node=node,
                    )
        with nonstop.connect(addresses) as c:
            # Applied everywhere once acknowledged (read your writes); the wait only
            # covers a node that looks down for a moment (fail_if_down).
            wait_until(lambda: len(balances(c)) == 9, 20, "the accounts on every node")
        yield addresses
    finally:
        procs.cleanup()


def steady(fn: Callable[[], T]) -> T:
    """Run ``fn`` again while a node of the scope looks down (failure-detector flaps on a
    loaded machine: queries use audit fail_if_down, so a flap is an error, not a gap)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return fn()
        except nonstop.Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def asteady(fn: Callable[[], Awaitable[T]]) -> T:
    deadline = time.monotonic() + 20
    while True:
        try:
            return await fn()
        except nonstop.Unavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def balances(c: nonstop.Client) -> dict[str, int]:
    def read() -> dict[str, int]:
        with c.transaction() as tx:
            return {a.number: a.balance for a in tx.extent(Account, audit="fail_if_down")}

    return steady(read)


def test_transfer_across_nodes_sync(cluster: str) -> None:
    with nonstop.connect(cluster) as c:
        before = balances(c)
        transfer(c, "A-0", "B-0", 5)
        transfer(c, "B-0", "C-0", 7)
        with pytest.raises(nonstop.Abort):
            transfer(c, "C-1", "A-1", 1_000)
        after = balances(c)
    assert after["A-0"] == before["A-0"] - 5
    assert after["B-0"] == before["B-0"] + 5 - 7
    assert after["C-0"] == before["C-0"] + 7
    assert after["C-1"] == before["C-1"] and after["A-1"] == before["A-1"]
    assert sum(after.values()) == sum(before.values()) == 900


def test_spread_handles_coordinate_on_every_node(cluster: str) -> None:
    """H5 against real nodes: three handles made in turn have three primaries, and
    each one's transactions are coordinated by its own (no node is down here)."""
    addresses = cluster.split(",")
    handles = [nonstop.connect(cluster) for _ in range(3)]
    try:
        assert sorted(h.primary for h in handles) == sorted(addresses)
        for h in handles:
            with h.transaction() as tx:
                tx.count(Account, scope="local")
                assert tx.node == NAMES[addresses.index(h.primary)]
    finally:
        for h in handles:
            h.close()


def test_concurrent_threads_conserve_the_total(cluster: str) -> None:
    # Every transfer locks its accounts in one global order (src < dst), so that
    # cross-node waits never form a cycle (those end only by the lock timeout).
    pairs = [("A-0", "B-1"), ("A-2", "C-2"), ("B-1", "C-0"), ("A-0", "C-0")]
    errors: list[BaseException] = []
    shared = nonstop.connect(cluster)
    before = balances(shared)

    def worker(k: int) -> None:
        own = nonstop.connect(cluster) if k % 2 else None  # shared and private clients
        try:
            for i in range(10):
                src, dst = pairs[(k + i) % len(pairs)]
                transfer(own or shared, src, dst, 1)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            if own is not None:
                own.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert time.monotonic() - t0 < 60
    after = balances(shared)
    shared.close()
    assert sum(after.values()) == sum(before.values())
    moved = {n: 0 for n in before}
    for k in range(4):
        for i in range(10):
            src, dst = pairs[(k + i) % len(pairs)]
            moved[src] -= 1
            moved[dst] += 1
    assert after == {n: before[n] + moved[n] for n in before}


def test_concurrent_async_tasks_on_one_connection(cluster: str) -> None:
    pairs = [("A-1", "B-2"), ("B-2", "C-1"), ("A-1", "C-1")]

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        async with nonstop.connect_async(cluster) as c:

            async def read() -> dict[str, int]:
                async with c.transaction() as tx:
                    found = await tx.extent(Account, audit="fail_if_down")
                    return {a.number: a.balance for a in found}

            before = await asteady(read)
            jobs = [transfer_async(c, *pairs[i % len(pairs)], 2) for i in range(24)]
            await asyncio.wait_for(asyncio.gather(*jobs), 60)
            return before, await asteady(read)

    before, after = asyncio.run(main())
    assert sum(after.values()) == sum(before.values())
    assert after["A-1"] == before["A-1"] - 2 * 16
    assert after["B-2"] == before["B-2"]
    assert after["C-1"] == before["C-1"] + 2 * 16


def test_remote_method_runs_on_the_master(cluster: str) -> None:
    with nonstop.connect(cluster) as c:
        with c.transaction() as tx:
            acct = tx.get(Account, number="C-2", lock="write")
            start_balance = acct.balance
            acct.balance += 1  # deferred: flushed before the call
            assert acct.deposit(10) == start_balance + 11
            assert acct.balance == start_balance + 11
            assert acct.audit_note() == f"C-2:{start_balance + 11}"  # a plain method, here
            with pytest.raises(nonstop.BadArgument):
                acct.deposit(-1)  # the method's own error, raised on node C
        with c.transaction() as tx:
            assert tx.get(Account, number="C-2").balance == start_balance + 11


def test_cluster_query_returns_each_object_once(cluster: str) -> None:
    # Pinned to A (balance="first"): "local" below is A's store, the others B's and C's.
    with nonstop.connect(cluster, balance="first") as c:
        steady(lambda: check_queries(c))


def check_queries(c: nonstop.Client) -> None:
    with c.transaction() as tx:
        # The default audit skips nodes that look down; here a flap must not pass.
        audited = tx.query(Account).audit("fail_if_down")
        everything = audited.all()
        numbers = [a.number for a in everything]
        assert sorted(numbers) == sorted(f"{n}-{i}" for n in NAMES for i in range(3))
        assert len(set(numbers)) == len(numbers)
        ordered = audited.order_by("owner", descending=True).all()
        assert [a.owner for a in ordered] == sorted((a.owner for a in everything), reverse=True)
        ranged = tx.query(Account).audit("fail_if_down").range("owner", "b", "c").all()
        assert [a.owner for a in ranged] == ["b0", "b1", "b2"]
        # A node scope asks those nodes' stores: A's ("local", the attached node) and B's
        # and C's hold every account once (which ones A holds is the partitions' choice).
        local = [a.number for a in tx.query(Account).scope("local").all()]
        others = [a.number for a in tx.query(Account).scope(["B", "C"]).audit("fail_if_down")]
        assert sorted(local + others) == sorted(numbers)
        assert tx.query(Account).scope(["B", "C"]).audit("fail_if_down").count() == len(others)
        assert tx.count(Account, audit="fail_if_down") == 9
        assert tx.count(Account, scope="local") == len(local)
        assert tx.query(Account).where(owner="c1").audit("fail_if_down").first().number == "C-1"


def test_deferred_writes_are_visible_after_commit(cluster: str) -> None:
    addresses = cluster.split(",")
    # Pinned (balance="first"): c is attached to A, other to C.
    with (
        nonstop.connect(cluster, balance="first") as c,
        nonstop.connect(addresses[::-1], balance="first") as other,
    ):
        with c.transaction() as tx:
            acct = tx.get(Account, number="B-0", lock="write")
            acct.owner = "zed"  # a mutable key, on node B, written from a client on A
            with other.transaction() as tx2:
                assert tx2.find(Account, number="B-0", lock="none").owner == "b0"
                assert tx2.node == "C"
        with other.transaction() as tx2:
            assert tx2.get(Account, number="B-0").owner == "zed"
            zed = tx2.query(Account).where(owner="zed").audit("fail_if_down").first()
            assert zed.number == "B-0"
        with c.transaction() as tx:
            tx.get(Account, number="B-0", lock="write").owner = "b0"


def test_bad_inputs(cluster: str) -> None:
    class Unknown(nonstop.Managed, name="remote.test.Unknown"):
        tag: str = nonstop.key(unique=True)

    real_note = managed._REGISTRY["dist.Note"]
    try:

        class OldNote(nonstop.Managed, name="dist.Note", version=1):
            text: str = ""

        with nonstop.connect(cluster) as c:
            with pytest.raises(nonstop.UnknownType), c.transaction() as tx:
                tx.create(Unknown, tag="x")
            with pytest.raises(nonstop.TypeVersionMismatch), c.transaction() as tx:
                tx.create(OldNote, text="old")
            with c.transaction() as tx:
                assert tx.count(Note) == 0, "nothing was written"
                with pytest.raises(nonstop.BadArgument):
                    tx.create(Account, number="X-1", node="nowhere")
                with pytest.raises(nonstop.BadArgument):
                    tx.query(Account).scope(["A", "nowhere"]).all()
            with pytest.raises(nonstop.DuplicateKey), c.transaction() as tx:
                tx.create(Account, number="A-0")
            with c.transaction() as tx:
                a = tx.get(Account, number="A-0")
            with pytest.raises(nonstop.TransactionClosed):
                tx.get(Account, number="A-0")
            with pytest.raises(nonstop.ObjectNotInTransaction):
                _ = a.balance
            assert c.status()["nodes"], "admin requests still work"
    finally:
        managed._REGISTRY["dist.Note"] = real_note


def open_per_node(c: nonstop.Client, tag: str) -> None:
    """One account per node: ``A-<tag>`` on A, and so on, balance 10."""
    with c.transaction() as tx:
        for node in NAMES:
            tx.create(Account, number=f"{node}-{tag}", balance=10, node=node)


def test_attached_node_killed_then_next_transaction_elsewhere(tmp_path: Path) -> None:
    procs = start(tmp_path / "kill")
    try:
        addresses = [procs.address(n) for n in NAMES]
        # Pinned to A (balance="first"): the transaction holds A-9 and then reads an
        # account it has not read yet, on another node, when A is killed.
        with nonstop.connect(addresses, balance="first") as c:
            open_per_node(c, "9")
            tx = c.transaction()
            tx.get(Account, number="A-9", lock="write").balance = 0
            victim = tx.node  # A, unless A was too slow to answer under load
            assert victim in NAMES
            one, two = (f"{n}-9" for n in NAMES if n != victim)
            procs.kill(victim)
            t0 = time.monotonic()
            with pytest.raises(nonstop.Unavailable):
                tx.get(Account, number=one)
            assert time.monotonic() - t0 < 5
            with pytest.raises(nonstop.Unavailable):
                tx.commit()  # doomed: the same error again, nothing committed

            def moved() -> bool:
                transfer(c, one, two, 1)
                return True

            wait_until(moved, 20, "a transfer through another node")
            with c.transaction() as tx2:
                x, y = tx2.get(Account, number=one), tx2.get(Account, number=two)
                assert tx2.node not in (None, victim)
                assert x.balance + y.balance == 20 and x.balance <= 9
                y_balance = y.balance

        async def via_async() -> int:
            async with nonstop.connect_async(addresses) as ac:
                await transfer_async(ac, two, one, 1)  # the victim is down: elsewhere
                async with ac.transaction() as atx:
                    # A read lock: it waits for phase two of the transfer on that node.
                    return (await atx.get(Account, number=two)).balance

        assert asyncio.run(via_async()) == y_balance - 1
    finally:
        procs.cleanup()


def test_async_attached_node_killed_then_next_transaction_elsewhere(tmp_path: Path) -> None:
    procs = start(tmp_path / "akill")
    addresses = [procs.address(n) for n in NAMES]

    async def main() -> None:
        # Pinned to A (balance="first"), as the blocking test above: A-8 is held, the
        # accounts read after the kill are not.
        async with nonstop.connect_async(addresses, balance="first") as c:
            async with c.transaction() as tx:
                for node in NAMES:
                    await tx.create(Account, number=f"{node}-8", balance=10, node=node)
            tx = c.transaction()
            (await tx.get(Account, number="A-8", lock="write")).balance = 0
            victim = tx.node
            assert victim in NAMES
            one, two = (f"{n}-8" for n in NAMES if n != victim)
            # Other transactions of this client share the connection: they fail too.
            other = c.transaction()
            await other.count(Account, scope="local")
            await asyncio.to_thread(procs.kill, victim)
            for doomed in (tx, other):
                with pytest.raises(nonstop.Unavailable):
                    await doomed.get(Account, number=one, lock="none")
                await doomed.rollback()
            deadline = time.monotonic() + 20
            while True:
                try:
                    await transfer_async(c, one, two, 1)
                    break
                except nonstop.Error:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            async with c.transaction() as tx2:
                x = await tx2.get(Account, number=one)
                y = await tx2.get(Account, number=two)
                assert tx2.node not in (None, victim)
                assert x.balance + y.balance == 20 and x.balance <= 9

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        procs.cleanup()


def test_async_timed_out_first_op_does_not_leave_its_session(cluster: str) -> None:
    """A first op (it opens the session) that times out on a live node: the shared
    connection stays, and the session its late reply names is rolled back."""

    async def main() -> None:
        async with (
            nonstop.connect_async(cluster) as holder,
            nonstop.connect_async(cluster, op_timeout=1.0) as c,
        ):
            htx = holder.transaction()
            await htx.get(Account, number="A-0", lock="write")
            tx = c.transaction()
            with pytest.raises(nonstop.Unavailable):
                await tx.get(Account, number="A-0", lock="write")  # waits for htx's lock
            await htx.rollback()  # the waiting op now gets the lock; its reply comes late
            await asyncio.sleep(0.3)
            async with c.transaction() as tx3:  # same connection; the lock must be free
                acct = await tx3.get(Account, number="A-0", lock="write")
                assert acct.number == "A-0"
            assert c.node is not None and c.node.name == tx3.node

    asyncio.run(asyncio.wait_for(main(), 30))


def test_lost_commit_reply_is_answered_by_the_recorded_outcome(
    cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """H1 against the real node: the commit reaches node A, its reply is lost with the
    connection; the client asks ``request.result`` on a new connection and the
    transfer is applied once."""
    from nonstop.client.channel import SyncChannel
    from nonstop.net.frames import encode

    original = SyncChannel.call
    asked: list[list[object]] = []

    def lossy(chan: SyncChannel, payload: dict, timeout: float) -> object:  # type: ignore[type-arg]
        if payload.get("op") == "request.result":
            asked.append(payload["req"])
        if payload.get("op") != "tx.commit":
            return original(chan, payload, timeout)
        chan._sock.sendall(encode({"t": "req", "id": 10**6, "p": payload}, chan.max_frame))
        chan.close()  # the reply, if any, is never read
        raise ConnectionResetError("reply lost (test)")

    with nonstop.connect(cluster) as c:
        before = balances(c)
        monkeypatch.setattr(SyncChannel, "call", lossy)
        transfer(c, "A-2", "C-0", 3)
        monkeypatch.setattr(SyncChannel, "call", original)
        after = balances(c)
        assert len(asked) >= 1 and str(asked[0][0]).startswith(c.client_id)
        assert after["A-2"] == before["A-2"] - 3 and after["C-0"] == before["C-0"] + 3
        # A request id the node never saw: not committed, said as Unavailable.
        with pytest.raises(nonstop.Unavailable, match="not committed"):
            c.sessions.request_result(c.address, [f"{c.client_id}.999", 1], ConnectionResetError())


def test_silent_node_gives_unavailable_after_the_op_timeout(tmp_path: Path) -> None:
    procs = start(tmp_path / "stop")
    try:
        addresses = [procs.address(n) for n in NAMES]
        with nonstop.connect(addresses, op_timeout=1.5, timeout=2.0) as c:
            open_per_node(c, "5")
            tx = c.transaction()
            # Only the attached node is touched: a stopped coordinator's branches on
            # other nodes would keep their locks until they idle out (branch_idle).
            tx.count(Account, scope="local")
            victim = tx.node
            assert victim in NAMES
            one, two = (f"{n}-5" for n in NAMES if n != victim)
            procs.signal(victim, signal.SIGSTOP)
            t0 = time.monotonic()
            with pytest.raises(nonstop.Unavailable):
                tx.get(Account, number=one, lock="none")
            assert time.monotonic() - t0 < 4
            tx.rollback()

            def moved() -> bool:
                transfer(c, one, two, 1)
                return True

            wait_until(moved, 20, "a transfer through another node")
            with c.transaction() as tx2:
                assert tx2.get(Account, number=two).balance == 11
                assert tx2.node not in (None, victim)
    finally:
        procs.cleanup()


def test_asynchronous_call_on_a_remote_object_runs_once_after_commit(cluster: str) -> None:
    """A6 to a remote target: queued with the commit on the master, run there once; a
    rolled-back transaction's calls never run."""
    from tests.distmodel import Inbox

    # Pinned to A (balance="first"): the inbox on C is a remote target.
    with nonstop.connect(cluster, balance="first") as c:
        with c.transaction() as tx:
            tx.create(Inbox, name="inbox-c", node="C")
        wait_until(lambda: _inbox(c) is not None, 20, "the inbox on C")
        with c.transaction() as tx:  # attached to A: the inbox is remote
            box = tx.get(Inbox, name="inbox-c")
            box.post("one")
            box.post("two")
            assert box.items == []  # queued, not run: it runs after the commit
        with pytest.raises(RuntimeError), c.transaction() as tx:
            tx.get(Inbox, name="inbox-c").post("never")
            raise RuntimeError("roll back")
        with pytest.raises(nonstop.BadArgument), c.transaction() as tx:
            tx.get(Inbox, name="inbox-c").post(object())  # cannot be sent: nothing queued
        wait_until(lambda: _inbox(c) == ["one", "two"], 20, "both calls to run on C, in order")
        time.sleep(0.3)
        assert _inbox(c) == ["one", "two"]


def test_asynchronous_call_from_an_async_client(cluster: str) -> None:
    from tests.distmodel import Inbox

    async def main() -> list[str] | None:
        async with nonstop.connect_async(cluster) as c:
            async with c.transaction() as tx:
                await tx.create(Inbox, name="inbox-b", node="B")
            for _ in range(200):
                async with c.transaction() as tx:
                    if await tx.find(Inbox, name="inbox-b") is not None:
                        break
                await asyncio.sleep(0.05)
            async with c.transaction() as tx:
                box = await tx.get(Inbox, name="inbox-b")
                box.post.after(0.2, "later")  # a timer (D20): the delay rides tx.call
                box.post("x")
            for _ in range(200):
                async with c.transaction() as tx:
                    items = (await tx.get(Inbox, name="inbox-b")).items
                if len(items) >= 2:
                    return list(items)
                await asyncio.sleep(0.05)
            return None

    assert asyncio.run(main()) == ["x", "later"]


def _inbox(c: nonstop.Client) -> list[str] | None:
    from tests.distmodel import Inbox

    with c.transaction() as tx:
        box = tx.find(Inbox, name="inbox-c")
        return None if box is None else list(box.items)
