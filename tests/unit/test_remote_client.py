"""The client's remote transactions against an in-process fake of the node's data service.

Handles, deferred writes (C5), local errors, @transactional replay, exactly-once
commit (H1), fail-over and the asyncio flavour.  The real cluster is in
tests/cluster/test_remote_client.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bankmodel import Account, Transfer, transfer, transfer_async
from tests.unit.remote_fake import FakeCluster, FakeServer, refused_address
from tests.unit.test_transport import make_certs

import nonstop
from nonstop.client.failures import TLS_REFUSED, NodeRefused
from nonstop.client.remote import RemoteTransaction
from nonstop.client.remote_async import AsyncRemoteTransaction
from nonstop.net.handshake import PROTOCOL_MAX, UNSUPPORTED_PROTOCOL, WRONG_CLUSTER


class Wallet(nonstop.Managed, name="rc.Wallet"):
    owner: str = nonstop.key(unique=True)
    rank: int = nonstop.key(ordered=True, mutable=True, default=0)
    cash: int = 0
    tags: list = nonstop.field(default_factory=list)
    partner: Wallet | None = None

    @nonstop.remote
    def deposit(self, amount: int) -> int:
        self.cash += amount
        return self.cash

    def rich(self) -> bool:
        return self.cash >= 100


class ClientOnly(nonstop.Managed, name="rc.ClientOnly"):
    tag: str = nonstop.key(unique=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    db = nonstop.open(tmp_path / "store")
    try:
        with db.transaction() as tx:
            for n in ("A-1", "A-2", "B-7"):
                tx.create(Account, number=n, owner=n.lower(), balance=100)
            tx.create(Wallet, owner="ann", rank=3, cash=10)
            tx.create(Wallet, owner="bob", rank=1, cash=200)
            tx.create(Wallet, owner="cid", rank=2, cash=50)
        yield FakeCluster(db, ["n1", "n2"])
    finally:
        db.close()


def balance(c: nonstop.Client, number: str) -> int:
    with c.transaction() as tx:
        return tx.get(Account, number=number).balance


# --------------------------------------------------------------- handles
def test_handles_are_instances_with_cached_fields_and_local_methods(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c, c.transaction() as tx:
        assert isinstance(tx, RemoteTransaction)
        w = tx.get(Wallet, owner="bob")
        sent = len(node.log)
        again = tx.find(Wallet, owner="bob")  # held under a read lock: no round trip
        assert isinstance(w, Wallet) and w is again and w == again and hash(w) == hash(again)
        assert (w.owner, w.rank, w.cash, w.rich()) == ("bob", 1, 200, True)
        assert len(node.log) == sent, "field reads and plain methods must not go to the node"
        assert tx.ref(w) == nonstop.Ref(w._e.ref)
        assert tx.find(Wallet, owner="nobody") is None
        with pytest.raises(nonstop.NotFound):
            tx.get(Wallet, owner="nobody")
        assert tx.get(Wallet, owner="bob", lock="write") is w  # a stronger lock: asked
        assert w._e.lock == 2
    # The session began with the first op; one round trip per op, none for begin.
    assert [p["op"] for p in node.log] == ["tx.get"] * 4 + ["tx.commit"]
    assert "begin" in node.log[0] and all("begin" not in p for p in node.log[1:])
    assert len({p["s"] for p in node.log[1:]}) == 1


def test_writes_are_deferred_and_sent_with_the_commit(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c:
        with c.transaction() as tx:
            w = tx.get(Wallet, owner="ann", lock="write")
            before = len(node.log)
            w.cash = 11
            w.cash += 1
            w.tags = ["x"]
            w.rank = 9  # a mutable key
            assert (w.cash, w.tags, w.rank) == (12, ["x"], 9)  # reads see own writes
            assert len(node.log) == before, "no round trip per field write"
        commit = node.ops("tx.commit")[-1]
        assert len(commit["w"]) == 1 and commit["req"][0] == f"{c.client_id}.1"
        with c.transaction() as tx:
            w = tx.get(Wallet, owner="ann")
            assert (w.cash, w.tags, w.rank) == (12, ["x"], 9)


def test_lookups_of_objects_already_held_need_no_round_trip(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c, c.transaction() as tx:
        eve = tx.create(Wallet, owner="eve", cash=1)
        ann = tx.get(Wallet, owner="ann", lock="write")
        sent = len(node.log)
        assert tx.get(Wallet, owner="eve") is eve and tx.get(Wallet, owner="ann") is ann
        assert tx.get_or_create(Wallet, owner="eve") == (eve, False)
        assert len(node.log) == sent
        tx.delete(eve)
        assert tx.find(Wallet, owner="eve") is None  # deleted: asked again, not cached
        assert len(node.log) == sent + 2
        tx.rollback()


def test_pending_writes_flush_with_a_query_and_are_seen_by_it(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c, c.transaction() as tx:
        ann = tx.get(Wallet, owner="ann", lock="write")
        ann.rank = 0
        found = tx.query(Wallet).range("rank", 0, 2).all()
        assert [x.owner for x in found] == ["ann", "bob"]
        assert node.ops("tx.query")[-1]["w"], "the query carried the pending write"
        tx.rollback()
    with cluster.client() as c, c.transaction() as tx:
        assert tx.get(Wallet, owner="ann").rank == 3, "rolled back: nothing written"


def test_bad_writes_fail_locally_before_anything_is_sent(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c, c.transaction() as tx:
        w = tx.get(Wallet, owner="ann")
        sent = len(node.log)
        with pytest.raises(nonstop.FieldError):
            w.cash = "lots"
        with pytest.raises(nonstop.FieldError):
            w.nonsense = 1
        with pytest.raises(nonstop.ImmutableKey):
            w.owner = "eve"
        with pytest.raises(nonstop.FieldError):
            w.tags = [object()]
        with pytest.raises(nonstop.FieldError):
            tx.create(Wallet, owner="x", bogus=1)
        with pytest.raises(nonstop.FieldError):
            tx.create(Account, balance=1)  # number is required
        with pytest.raises(nonstop.BadArgument):
            tx.find(Wallet, cash=1)  # not a unique key
        with pytest.raises(nonstop.BadArgument):
            tx.query(Wallet).range("cash", 0, 1)  # not an ordered key
        with pytest.raises(nonstop.BadArgument):
            tx.query(Wallet).scope("everywhere")
        with pytest.raises(nonstop.BadArgument):
            tx.query(Wallet).audit("sometimes")
        with pytest.raises(nonstop.BadArgument):
            tx.get(Wallet, owner="ann", lock="exclusive")
        assert len(node.log) == sent
        assert w.cash == 10 and tx.active


def test_create_on_a_node_delete_and_refs(cluster: FakeCluster) -> None:
    with cluster.client() as c:
        with c.transaction() as tx:
            dan = tx.create(Wallet, owner="dan", cash=5, node="n2")
            bob = tx.get(Wallet, owner="bob")
            dan.partner = bob
            assert dan.partner is bob
            tx.delete(tx.get(Wallet, owner="cid"))
        with c.transaction() as tx:
            dan = tx.get(Wallet, owner="dan")
            assert dan.partner.owner == "bob"  # loaded through tx.ref
            assert tx.find(Wallet, owner="cid") is None
            tx.delete(dan)
            with pytest.raises(nonstop.Deleted):
                _ = dan.cash
            with pytest.raises(nonstop.Deleted):
                tx.delete(dan)
            tx.rollback()
        with c.transaction() as tx, pytest.raises(nonstop.BadArgument):
            tx.create(Wallet, owner="eve", node="n9")


def test_unknown_type_and_version_mismatch_write_nothing(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    node.hidden_types.add("rc.Wallet")
    with cluster.client() as c:
        with pytest.raises(nonstop.UnknownType), c.transaction() as tx:
            tx.create(Wallet, owner="zed")
        node.hidden_types.clear()
        node.versions["rc.Wallet"] = 2
        with pytest.raises(nonstop.TypeVersionMismatch), c.transaction() as tx:
            tx.get(Wallet, owner="ann")
        node.versions.clear()
        with c.transaction() as tx:
            assert tx.find(Wallet, owner="zed") is None


def test_an_error_on_the_first_op_keeps_the_session_it_opened(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c, c.transaction() as tx:
        with pytest.raises(nonstop.BadArgument):
            tx.query(Wallet).scope(["nowhere"]).all()  # the node's error, first op
        assert tx.active and tx.node == "n1"
        assert tx.get(Wallet, owner="ann").cash == 10
        first, second = node.log[-2:]
        assert "begin" in first and "s" not in first and second["s"] in node.sessions
        assert len(node.sessions) == 1


def test_remote_method_runs_on_the_node_after_flushing(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c:
        with c.transaction() as tx:
            w = tx.get(Wallet, owner="ann", lock="write")
            w.cash = 40  # pending: must reach the node before the call
            assert w.deposit(5) == 45
            call = node.ops("tx.call")[-1]
            assert call["m"] == "deposit" and call["w"]
            assert w.cash == 45  # the state after the call was copied back
            assert not w.rich()  # a plain method, run here
            assert len(node.ops("tx.call")) == 1
        assert balance_of_wallet(c, "ann") == 45


def balance_of_wallet(c: nonstop.Client, owner: str) -> int:
    with c.transaction() as tx:
        return tx.get(Wallet, owner=owner).cash


def test_remote_decorator_runs_locally_in_an_embedded_transaction(tmp_path: Path) -> None:
    with nonstop.open(tmp_path / "db") as db, db.transaction() as tx:
        w = tx.create(Wallet, owner="x", cash=1)
        assert w.deposit(2) == 3 and w.cash == 3
    assert getattr(Wallet.deposit, "__nonstop_remote__", False)


def test_queries_and_counts(cluster: FakeCluster) -> None:
    with cluster.client() as c, c.transaction() as tx:
        ranked = tx.query(Wallet).order_by("rank", descending=True).scope("cluster").all()
        assert [w.owner for w in ranked] == ["ann", "cid", "bob"], "each object once"
        assert tx.query(Wallet).where(owner="cid").first().cash == 50
        rich = tx.query(Wallet).filter(lambda w: w.rich()).limit(1).all()
        assert [w.owner for w in rich] == ["bob"]
        assert tx.query(Wallet).range("rank", 1, 3).count() == 2
        assert tx.query(Wallet).scope(["n1"]).audit("fail_if_down").count() == 3
        assert tx.count(Wallet) == 3 and tx.count(Account, scope="local") == 3
        assert len(tx.extent(Account)) == 3
        assert tx.query(Wallet).limit(0).all() == []
        with pytest.raises(nonstop.BadArgument):
            tx.query(Wallet).scope(["n1", "n7"]).all()
        assert tx.active, "a bad argument on the node does not end the transaction"


# --------------------------------------------------- transactions, errors
def test_the_bank_transfer_runs_unchanged(cluster: FakeCluster) -> None:
    with cluster.client() as c:
        transfer(c, "t1", "A-1", "B-7", 5)
        transfer(c, "t2", "B-7", "A-2", 30)
        assert [balance(c, n) for n in ("A-1", "A-2", "B-7")] == [95, 130, 75]
        with c.transaction() as tx:
            assert tx.count(Transfer) == 2


def test_retryable_errors_replay_and_abort_propagates(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    node.inject["tx.commit"] = [nonstop.Conflict("stale"), nonstop.Deadlock("victim")]
    runs = []

    @nonstop.transactional
    def bump(tx: RemoteTransaction) -> None:
        runs.append(1)
        tx.get(Account, number="A-1", lock="write").balance += 1

    with cluster.client() as c:
        bump(c)
        assert len(runs) == 3 and balance(c, "A-1") == 101

        @nonstop.transactional
        def refuse(tx: RemoteTransaction) -> None:
            tx.get(Account, number="A-1", lock="write").balance = 0
            raise nonstop.Abort("no")

        with pytest.raises(nonstop.Abort):
            refuse(c)
        assert balance(c, "A-1") == 101

        @nonstop.transactional
        def outer(tx: RemoteTransaction) -> None:
            bump(tx)  # joins, no second transaction
            bump(tx)

        outer(c)
        assert balance(c, "A-1") == 103


def test_use_after_commit_is_refused(cluster: FakeCluster) -> None:
    with cluster.client() as c:
        with c.transaction() as tx:
            a = tx.get(Account, number="A-1")
        assert not tx.active
        with pytest.raises(nonstop.TransactionClosed):
            tx.get(Account, number="A-1")
        with pytest.raises(nonstop.TransactionClosed):
            tx.commit()
        with pytest.raises(nonstop.ObjectNotInTransaction):
            _ = a.balance
        tx.rollback()  # harmless
        with c.transaction() as other, pytest.raises(nonstop.ObjectNotInTransaction):
            other.delete(a)
        with pytest.raises(nonstop.BadArgument):
            c.transaction(isolation="chaotic")


def test_session_closed_on_the_node_is_an_error(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c, c.transaction() as tx:
        tx.get(Account, number="A-1")
        node.sessions.clear()  # the node forgot it (e.g. rolled back on idle)
        with pytest.raises(nonstop.TransactionClosed):
            tx.get(Account, number="A-2")
        tx.rollback()


# ------------------------------------------------------------ exactly once
# The blocking and asyncio clients share one core (client/core.py): every rule
# below is run against both, and must behave the same.
FLAVOURS = ("blocking", "asyncio")


def run_transfer(cluster: FakeCluster, flavour: str, tid: str, src: str, dst: str, n: int) -> None:
    """The bank transfer through a fresh blocking or asyncio client."""
    if flavour == "blocking":
        with cluster.client() as c:
            transfer(c, tid, src, dst, n)
        return

    async def main() -> None:
        async with cluster.async_client() as c:
            await transfer_async(c, tid, src, dst, n)

    asyncio.run(main())


def read_balance(cluster: FakeCluster, number: str) -> int:
    with cluster.client() as c:
        return balance(c, number)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_lost_commit_reply_asks_for_the_result_instead_of_committing_again(
    cluster: FakeCluster, flavour: str
) -> None:
    node = cluster.nodes["n1"]
    node.drop_commit_reply = True
    node.running_polls = 2
    run_transfer(cluster, flavour, "t9", "A-1", "A-2", 7)
    assert node.commits == 1, "committed once"
    polls = node.ops("request.result")
    assert len(polls) == 3  # two "running", then the outcome
    assert polls[0]["req"] == node.ops("tx.commit")[0]["req"]
    assert read_balance(cluster, "A-1") == 93


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_lost_commit_reply_of_a_refused_commit_raises_its_error(
    cluster: FakeCluster, flavour: str
) -> None:
    node = cluster.nodes["n1"]
    node.inject["tx.commit"] = [nonstop.errors.Aborted("a participant refused")]
    node.drop_commit_reply = True
    with pytest.raises(nonstop.errors.Aborted, match="a participant refused"):
        run_transfer(cluster, flavour, "t8", "A-1", "A-2", 7)
    assert node.commits == 0 and len(node.ops("request.result")) == 1
    assert read_balance(cluster, "A-1") == 100


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_outcome_unknown_when_the_node_dies_with_the_reply(
    cluster: FakeCluster, flavour: str
) -> None:
    node = cluster.nodes["n1"]
    original = node.handle

    def commit_then_die(conn, p):  # type: ignore[no-untyped-def]
        reply = original(conn, p)
        if p.get("op") == "tx.commit":
            node.up = False
        return reply

    node.handle = commit_then_die  # type: ignore[method-assign]
    with pytest.raises(nonstop.Unavailable, match="outcome is unknown"):
        run_transfer(cluster, flavour, "t7", "A-1", "A-2", 1)
    assert node.commits == 1
    node.handle = original  # type: ignore[method-assign]
    node.up = True
    assert read_balance(cluster, "A-1") == 99, "it did commit: the client could not know"


# ------------------------------------------------------------- fail-over
def ping_with(flavour: str, addresses: list[str], **options: Any) -> tuple[dict[str, Any], str]:
    """Ping through a fresh blocking or asyncio client: (reply, name of the node that answered).
    The first address first (``balance="first"``): the tests say which one refuses."""
    options.setdefault("balance", "first")
    if flavour == "blocking":
        with nonstop.Client(addresses, **options) as c:
            reply = c.ping()
            assert c.node is not None
            return reply, c.node.name

    async def main() -> tuple[dict[str, Any], str]:
        async with nonstop.AsyncClient(addresses, **options) as c:
            reply = await c.ping()
            assert c.node is not None
            return reply, c.node.name

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    ("server", "client", "code"),
    [
        ({"cluster": "c1"}, {"cluster": "c2"}, WRONG_CLUSTER),
        (
            {"protocol": (PROTOCOL_MAX + 1, PROTOCOL_MAX + 2)},
            {"cluster": "c1"},
            UNSUPPORTED_PROTOCOL,
        ),
    ],
    ids=["wrong-cluster", "unsupported-protocol"],
)
def test_a_handshake_refusal_raises_at_once_naming_the_node(
    cluster: FakeCluster,
    flavour: str,
    server: dict[str, Any],
    client: dict[str, Any],
    code: str,
) -> None:
    """A configuration error every node would repeat: no fail-over, no vague Unavailable."""
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    with FakeServer(n1, **server) as refusing, FakeServer(n2) as fine:
        with pytest.raises(NodeRefused) as info:
            ping_with(flavour, [refusing.address, fine.address], timeout=2, **client)
        refused = info.value
        assert isinstance(refused, nonstop.errors.ProtocolError)
        assert (refused.code, refused.address) == (code, refusing.address)
        assert str(refused).startswith(f"connection to node {refusing.address} refused: {code}")
        assert (refusing.accepted, fine.accepted) == (1, 0), "neither retried nor failed over"
        assert ping_with(flavour, [fine.address], cluster="c1") == ({"name": "n2"}, "n2")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_an_untrusted_node_certificate_is_refused_at_once(
    cluster: FakeCluster, flavour: str, tmp_path: Path
) -> None:
    """TLS credentials are configuration too: a client whose CA did not sign the
    cluster's certificates would distrust every node."""
    ours, theirs = make_certs(mkdir(tmp_path / "ours")), make_certs(mkdir(tmp_path / "theirs"))
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    with FakeServer(n1, tls=theirs) as first, FakeServer(n2, tls=theirs) as second:
        with pytest.raises(NodeRefused, match="certificate") as info:
            ping_with(flavour, [first.address, second.address], timeout=2, tls=ours)
        assert (info.value.code, info.value.address) == (TLS_REFUSED, first.address)
        assert second.accepted == 0, "not failed over"
        assert ping_with(flavour, [second.address], tls=theirs) == ({"name": "n2"}, "n2")


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_refused_tcp_connection_fails_over_to_the_next_address(
    cluster: FakeCluster, flavour: str
) -> None:
    dead = refused_address()
    with FakeServer(cluster.nodes["n2"]) as alive:
        assert ping_with(flavour, [dead, alive.address], timeout=2) == ({"name": "n2"}, "n2")
        assert alive.accepted == 1
    with pytest.raises(nonstop.Unavailable, match="no node answered"):
        ping_with(flavour, [dead], timeout=1, rounds=1)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_transaction_starts_on_the_next_node_when_the_first_refuses_connections(
    cluster: FakeCluster, flavour: str
) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    n1.up = False
    run_transfer(cluster, flavour, "f1", "A-1", "A-2", 5)
    assert (n1.commits, n2.commits, n1.dials) == (0, 1, 0)
    n1.up = True
    assert read_balance(cluster, "A-1") == 95


def test_failover_to_the_next_node_and_unavailable_mid_transaction(cluster: FakeCluster) -> None:
    n1, n2 = cluster.nodes["n1"], cluster.nodes["n2"]
    with cluster.client() as c:
        tx = c.transaction()
        tx.get(Account, number="A-1", lock="write").balance = 0
        assert tx.node == "n1"
        n1.up = False
        with pytest.raises(nonstop.Unavailable):
            tx.get(Account, number="A-2")
        with pytest.raises(nonstop.Unavailable):
            tx.commit()  # doomed: it raises the same error
        assert not tx.active
        transfer(c, "t3", "A-1", "A-2", 1)  # the next transaction goes to n2
        assert n2.commits == 1 and n1.commits == 0
        assert balance(c, "A-1") == 99
        n2.up = False
        with pytest.raises(nonstop.Unavailable):
            transfer(c, "t4", "A-1", "A-2", 1)
        n1.up = n2.up = True
        transfer(c, "t4", "A-1", "A-2", 1)
        assert balance(c, "A-1") == 98


def test_read_only_commits_carry_no_request_id_and_writers_use_lanes(
    cluster: FakeCluster,
) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c:
        assert balance(c, "A-1") == 100
        assert node.ops("tx.commit")[-1]["req"] is None, "nothing to record for a read"
        transfer(c, "l1", "A-1", "A-2", 1)
        transfer(c, "l2", "A-1", "A-2", 1)
        reqs = [p["req"] for p in node.ops("tx.commit") if p["req"]]
        assert reqs == [[f"{c.client_id}.1", 1], [f"{c.client_id}.1", 2]]


def test_request_lanes_one_commit_at_a_time_per_lane() -> None:
    from nonstop.client.lanes import RequestLanes

    lanes = RequestLanes("cid")
    a, b = lanes.take(), lanes.take()
    assert a == ["cid.1", 1] and b == ["cid.2", 1]
    lanes.done(b)
    assert lanes.take() == ["cid.2", 2]
    lanes.done(a)
    assert lanes.take() == ["cid.1", 2] and lanes.lanes == 2


def test_connections_are_reused_between_transactions(cluster: FakeCluster) -> None:
    node = cluster.nodes["n1"]
    with cluster.client() as c:
        for i in range(5):
            transfer(c, f"r{i}", "A-1", "A-2", 1)
        assert node.dials == 1


# ----------------------------------------------------------------- asyncio
def test_async_transfer_concurrent_tasks_share_one_connection(cluster: FakeCluster) -> None:
    async def main() -> None:
        c = cluster.async_client()
        async with c:
            async with c.transaction() as tx:
                for i in range(20):
                    await tx.create(Account, number=f"P{i:02d}", balance=10)
            # Disjoint pairs: the fake's locks block its thread, so no two tasks collide.
            tasks = [
                transfer_async(c, f"a{i}", f"P{i:02d}", f"P{i + 10:02d}", 1) for i in range(10)
            ]
            await asyncio.gather(*tasks)
            async with c.transaction() as tx:
                assert isinstance(tx, AsyncRemoteTransaction)
                accounts = await tx.extent(Account)
                assert sum(a.balance for a in accounts) == 300 + 200
                assert (await tx.get(Account, number="P15")).balance == 11
                assert await tx.count(Transfer) == 10
                w = await tx.get(Wallet, owner="ann", lock="write")
                w.cash = 20
                assert await w.deposit(1) == 21
                q = tx.query(Wallet).order_by("rank")
                assert [x.owner async for x in q] == ["bob", "cid", "ann"]
            chans = type(c).channels  # type: ignore[attr-defined]
            assert len(chans) == 1 and chans[0].max_in_flight > 1, "multiplexed"

    asyncio.run(main())


def test_async_errors_failover_and_use_after_commit(cluster: FakeCluster) -> None:
    n1 = cluster.nodes["n1"]

    async def main() -> None:
        async with cluster.async_client() as c:
            tx = c.transaction()
            a = await tx.get(Account, number="A-1", lock="write")
            with pytest.raises(nonstop.ImmutableKey):
                a.number = "Z"
            a.balance = 0
            n1.up = False
            with pytest.raises(nonstop.Unavailable):
                await tx.get(Account, number="A-2")
            await tx.rollback()
            await transfer_async(c, "x1", "A-1", "A-2", 3)  # goes to n2
            async with c.transaction() as tx2:
                assert (await tx2.get(Account, number="A-1")).balance == 97
            with pytest.raises(nonstop.TransactionClosed):
                await tx2.get(Account, number="A-1")
            n1.up = True
            n2 = cluster.nodes["n2"]
            n2.drop_commit_reply = True
            await transfer_async(c, "x2", "A-1", "A-2", 1)
            assert n2.commits == 3 and n2.ops("request.result")  # x1, the read, x2 once

    asyncio.run(main())


def test_async_slow_op_and_cancelled_task_keep_the_shared_connection(
    cluster: FakeCluster,
) -> None:
    node = cluster.nodes["n1"]

    async def main() -> None:
        async with cluster.async_client(op_timeout=0.2) as c:
            chans = type(c).channels  # type: ignore[attr-defined]
            tx = c.transaction()
            await tx.get(Account, number="A-1")
            node.delay["tx.get"] = 0.5  # slower than op_timeout, but the node answers pings
            with pytest.raises(nonstop.Unavailable):
                await tx.get(Account, number="A-2")
            assert len(chans) == 1 and not chans[0].closed, "a slow op keeps the connection"
            await tx.rollback()

            tx2 = c.transaction()
            await tx2.get(Account, number="A-1")
            node.delay["tx.get"] = 0.1
            task = asyncio.ensure_future(tx2.get(Account, number="A-2"))
            await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(nonstop.Unavailable, match="cancelled"):
                await tx2.get(Account, number="A-2")
            await tx2.rollback()
            await transfer_async(c, "s1", "A-1", "A-2", 4)
            assert len(chans) == 1 and not chans[0].closed, "still the one connection"
            assert not node.sessions, "every abandoned session was rolled back"
        with cluster.client() as sc:
            assert balance(sc, "A-1") == 96

    asyncio.run(main())
