"""The 2PC participant on the real store: DtxNode + StoreResourceManager + DtxPersister.

Two or three real Databases in one process, driven by the in-process runtime of
tests/dtx_store_harness.py: transfers across stores commit, refused branches
(conflict, lock timeout, missing branch, failing trigger) abort and change
nothing, a participant closed and reopened between its prepare and the
outcome comes back in doubt and applies the outcome exactly once, and the
machine's durable keys always agree with the store's prepared records.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
from tests.bankmodel import Account
from tests.dtx_store_harness import CFG, Cluster, NoStore

import nonstop
from nonstop.dataplane.participant import (
    RECORD,
    DtxPersister,
    StoreResourceManager,
    recovered_dtx_state,
)
from nonstop.dtx.protocol import K_PREPARED, K_TOMB, RM, VOTE, DtxConfig, DtxNode, Ready, Refused
from nonstop.errors import StoreError
from nonstop.model.codec import pack
from nonstop.runtime.interface import Log, Persist, Received, Started

pytestmark = pytest.mark.timeout(60)


class Card(nonstop.Managed, name="tests.dist_resource.Card"):
    code: str = nonstop.key(unique=True)
    holder: Account | None = None


def run(test: Callable[[Path], Awaitable[None]], root: Path) -> None:
    asyncio.run(test(root))


def balances(db: nonstop.Database) -> dict[str, int]:
    with db.transaction(isolation="snapshot") as tx:
        return {a.number: a.balance for a in tx.query(Account).all()}


def seed(root: Path, accounts: dict[str, dict[str, int]]) -> None:
    for node, numbers in accounts.items():
        with nonstop.open(root / node) as db, db.transaction() as tx:
            for number, balance in numbers.items():
                tx.create(Account, number=number, balance=balance)


def dtx_keys(db: nonstop.Database, prefix: bytes) -> dict[bytes, bytes]:
    return {k[len(prefix) :]: v for k, v in recovered_dtx_state(db).items() if k.startswith(prefix)}


def consistent(db: nonstop.Database) -> None:
    """The store's in-doubt set is exactly the machine's prepared keys."""
    assert set(db.in_doubt()) == set(dtx_keys(db, K_PREPARED))


async def transfer_branches(
    c: Cluster, amount: int, *, src: str = "n1", dst: str = "n2"
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """Open a branch on each node, read the accounts under write locks, build the writes."""
    b1, tx1 = await c.branch(src)
    b2, tx2 = await c.branch(dst)
    a = await tx1.get(Account, number="A", lock="write")
    b = await tx2.get(Account, number="B", lock="write")
    ops = {
        src: [["b", b1], c.write(a, balance=a.balance - amount)],
        dst: [["b", b2], c.write(b, balance=b.balance + amount)],
    }
    return ops, {src: tx1, dst: tx2}


# ------------------------------------------------------------------ happy path
def test_transfer_across_two_stores_commits(tmp_path: Path) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"])
        try:
            ops, txs = await transfer_branches(c, 30)
            b2 = ops["n2"][0][1]
            plain = c.persisters["n2"].persist
            held: list[bool] = []

            def persist(writes: Any, done: Any) -> None:
                # The outcome's write: the RM has ended the branch in memory, but
                # the data service must keep its hands off until it is durable.
                if any(k.startswith(K_TOMB) for k, _ in writes):
                    held.append(c.rms["n2"].holds(b2))
                plain(writes, done)

            c.persisters["n2"].persist = persist  # type: ignore[method-assign]
            reply = await c.run("n1", ops)
            assert reply["ok"] is True and reply["outcome"] == "commit", reply
            await c.settled()
            assert held == [True] and not c.rms["n2"].holds(b2)
            assert balances(c.dbs["n1"]) == {"A": 70}
            assert balances(c.dbs["n2"]) == {"B": 30}
            assert not txs["n1"].active and not txs["n2"].active  # ended by phase two
            for n in ("n1", "n2"):
                consistent(c.dbs[n])
                assert dtx_keys(c.dbs[n], K_TOMB) == {reply["g"].encode(): b"commit"}
            # Locks are released: a new transaction writes both accounts at once.
            for n, number in (("n1", "A"), ("n2", "B")):
                async with c.dbs[n].transaction(lock_timeout=0.2) as tx:
                    (await tx.get(Account, number=number, lock="write")).balance += 1
            # A second transfer (the coordinator's seq moves on) commits too.
            ops, _ = await transfer_branches(c, 10)
            reply2 = await c.run("n1", ops)
            assert reply2["ok"] is True and reply2["g"] != reply["g"]
            await c.settled()
            assert balances(c.dbs["n1"]) == {"A": 61}
            assert balances(c.dbs["n2"]) == {"B": 41}
            assert not c.errors
        finally:
            c.close()

    run(body, tmp_path)


def test_transfer_creating_an_object_and_three_nodes(tmp_path: Path) -> None:
    """A branch may create objects before the commit; the write set names them at version 0."""
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}, "n3": {}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2", "n3"])
        try:
            ops, _ = await transfer_branches(c, 25)
            b3, tx3 = await c.branch("n3")
            created = await tx3.create(Account, number="C", balance=0)
            ops["n3"] = [["b", b3], c.write(created, balance=5)]
            reply = await c.run("n2", ops)  # a coordinator that is also a participant
            assert reply["ok"] is True, reply
            await c.settled()
            assert balances(c.dbs["n1"]) == {"A": 75}
            assert balances(c.dbs["n2"]) == {"B": 25}
            assert balances(c.dbs["n3"]) == {"C": 5}
            with c.dbs["n3"].transaction() as tx:
                assert tx.count(Account) == 1
        finally:
            c.close()

    run(body, tmp_path)


def test_read_only_branch_votes_yes_and_holds_its_read_lock_until_the_outcome(
    tmp_path: Path,
) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 7}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"])
        try:
            b1, tx1 = await c.branch("n1")
            b2, tx2 = await c.branch("n2")
            a = await tx1.get(Account, number="A", lock="write")
            assert (await tx2.get(Account, number="B")).balance == 7  # a read lock only
            held: list[bool] = []

            def on_vote(sender: str, to: str, payload: Any) -> bool:
                if sender == "n2" and payload.get("t") == VOTE:
                    # n2 voted yes: it is prepared (with an empty write set), still locked.
                    held.append(c.dbs["n2"].in_doubt() == [payload["g"].encode()])
                    held.append(c.rms["n2"].holds(b2))
                return False

            c.drop = on_vote
            reply = await c.run("n1", {"n1": [["b", b1], c.write(a, balance=1)], "n2": [["b", b2]]})
            assert reply["ok"] is True, reply
            await c.settled()
            assert held == [True, True]
            assert not c.rms["n2"].holds(b2)
            assert balances(c.dbs["n1"]) == {"A": 1}
            assert balances(c.dbs["n2"]) == {"B": 7}
            assert not tx2.active
            async with c.dbs["n2"].transaction(lock_timeout=0.2) as tx:
                (await tx.get(Account, number="B", lock="write")).balance = 8
            consistent(c.dbs["n2"])
        finally:
            c.close()

    run(body, tmp_path)


# ------------------------------------------------------------------ refusals
def _refused_case(
    tmp_path: Path,
    spoil: Callable[[Cluster, dict[str, list[Any]], dict[str, Any]], Awaitable[None]],
    why: str,
    lock_timeout: float = 0.3,
    config: DtxConfig | None = None,
    rollback_left: bool = False,
) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"], lock_timeout=lock_timeout, config=config or CFG)
        try:
            ops, txs = await transfer_branches(c, 30)
            await spoil(c, ops, txs)
            before = {n: balances(c.dbs[n]) for n in ("n1", "n2")}
            assert before["n1"] == {"A": 100} and before["n2"]["B"] == 0
            reply = await c.run("n1", ops)
            assert reply["ok"] is False and reply["error"] == "Aborted", reply
            assert why in reply["why"], reply
            if rollback_left:  # a branch never taken: its session's end rolls it back
                for tx in txs.values():
                    if tx.active:
                        await tx.rollback()
            await c.settled()
            assert {n: balances(c.dbs[n]) for n in ("n1", "n2")} == before
            for n in ("n1", "n2"):
                consistent(c.dbs[n])
                # Durable abort tombstones only where a branch had prepared.
                assert set(dtx_keys(c.dbs[n], K_TOMB).values()) <= {b"abort"}
                assert not c.dbs[n].engine.prepared.staged()
                assert not txs[n].active  # rolled back, locks released
                async with c.dbs[n].transaction(lock_timeout=2.0) as tx:
                    for acc in await tx.query(Account).lock("write").all():
                        acc.balance += 0
            assert not c.errors
        finally:
            c.close()

    run(body, tmp_path)


def test_stale_version_is_refused_as_conflict(tmp_path: Path) -> None:
    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        ops["n2"][1][3] += 1  # the client read another version than the branch holds

    _refused_case(tmp_path, spoil, "n2 voted no: conflict")


def test_missing_branch_is_refused_at_once(tmp_path: Path) -> None:
    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        del c.branches[ops["n2"][0][1]]  # idle-rolled-back / unknown to the data service
        await txs["n2"].rollback()

    _refused_case(tmp_path, spoil, "n2 voted no: branch gone")


def _lapse_on(c: Cluster, node: str, lapsed: set[str]) -> None:
    """``node``'s data plane refuses the branches in ``lapsed`` for a lapse of its lease."""
    rm = c.rms[node]
    take = rm.lookup_branch
    rm.lookup_branch = lambda bid: None if bid in lapsed else take(bid)
    rm.branch_lapsed = lambda bid: bid in lapsed


def test_a_prepare_that_meets_a_lapse_of_the_lease_votes_once_it_is_back(
    tmp_path: Path,
) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"])
        try:
            ops, _ = await transfer_branches(c, 30)
            lapsed = {ops["n2"][0][1]}
            _lapse_on(c, "n2", lapsed)
            rid = c.submit("n1", ops)
            await asyncio.sleep(0.3)  # the prepare waits: no vote yet
            assert not c.replies[rid].done()
            assert c.rms["n2"].branches() == {}  # nothing taken from the data plane
            lapsed.clear()  # a renewal applied: the lease is back
            reply = await asyncio.wait_for(c.replies[rid], 5)
            assert reply["ok"] is True and reply["outcome"] == "commit", reply
            await c.settled()
            assert balances(c.dbs["n2"]) == {"B": 30}
            assert not c.errors
        finally:
            c.close()

    run(body, tmp_path)


def test_a_prepare_whose_lease_does_not_come_back_votes_no(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nonstop.dataplane.participant.VOTE_LAPSE_WAIT", 0.3)

    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        _lapse_on(c, "n2", {ops["n2"][0][1]})

    # (The branch stays the data plane's: the harness's data service rolls it back.)
    _refused_case(tmp_path, spoil, "n2 voted no: branch gone", rollback_left=True)


def test_lock_wait_past_the_lock_timeout_is_refused(tmp_path: Path) -> None:
    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        # The branch read C without locking it; another transaction holds C's write
        # lock through the prepare, so the write waits past lock_timeout (0.3 s).
        b2 = ops["n2"][0][1]
        async with c.dbs["n2"].transaction() as tx:
            await tx.create(Account, number="C", balance=3)
        c_obj = await txs["n2"].get(Account, number="C", lock="none")
        ops["n2"].append(c.write(c_obj, balance=4))
        blocker = await c.dbs["n2"].transaction().__aenter__()
        await blocker.get(Account, number="C", lock="write")
        c.loop.call_later(0.6, lambda: c.loop.create_task(blocker.rollback()))
        assert b2 in c.branches

    _refused_case(tmp_path, spoil, "n2 voted no: lock timeout")


def test_failing_prepare_notifier_is_refused_with_its_reason(tmp_path: Path) -> None:
    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        def veto() -> None:
            raise nonstop.Abort("the external system said no")

        txs["n1"].on_prepare(veto)

    _refused_case(tmp_path, spoil, "n1 voted no: Abort: the external system said no")


def test_unknown_field_is_refused(tmp_path: Path) -> None:
    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        ops["n2"][1][4] = pack({"_e": 1})  # must never reach an attribute that is not a field

    _refused_case(tmp_path, spoil, "n2 voted no: FieldError")


def test_no_vote_aborts_a_branch_already_prepared_elsewhere(tmp_path: Path) -> None:
    """n1 prepares durably (in doubt, locked), n2 refuses: n1's prepared record goes away."""
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"])
        try:
            ops, txs = await transfer_branches(c, 30)
            ops["n2"][1][3] += 5
            seen: list[list[bytes]] = []

            def delay_n2(sender: str, to: str, payload: Any) -> bool:
                # n2's no vote gets through only once n1 is durably prepared (the
                # coordinator resends the prepare; n2 answers no again).
                if sender == "n2" and payload.get("t") == VOTE:
                    seen.append(c.dbs["n1"].in_doubt())
                    return not seen[-1]
                return False

            c.drop = delay_n2
            reply = await c.run("n1", ops)
            # (the resent prepare finds n2's abort tombstone: "aborted", not "conflict")
            assert reply["ok"] is False and "n2 voted no" in reply["why"], reply
            await c.settled()
            assert balances(c.dbs["n1"]) == {"A": 100}
            assert c.dbs["n1"].in_doubt() == []
            # n1 had prepared durably and then applied the abort with a durable tombstone.
            assert seen[-1] == [reply["g"].encode()]
            assert dtx_keys(c.dbs["n1"], K_TOMB) == {reply["g"].encode(): b"abort"}
            consistent(c.dbs["n1"])
            assert not txs["n1"].active
        finally:
            c.close()

    run(body, tmp_path)


# ------------------------------------------------------------------ restarts
def test_participant_reopened_in_doubt_applies_the_outcome_once(tmp_path: Path) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        # decision_timeout long enough that n2 learns the outcome from the coordinator.
        cfg = DtxConfig(tick=0.02, retry=0.05, vote_timeout=1.5, branch_timeout=1.0,
                        decision_timeout=5.0)  # fmt: skip
        c = Cluster(root, ["n1", "n2"], config=cfg)
        try:
            ops, _ = await transfer_branches(c, 30)
            state: dict[str, Any] = {"down": False}

            def cut(sender: str, to: str, payload: Any) -> bool:
                if sender == "n2" and payload.get("t") == VOTE and not state["down"]:
                    # n2 is durably prepared; it goes down before any outcome reaches it.
                    state["down"] = True
                    c.stop("n2")
                    state["reopened"] = nonstop.open(root / "n2", lock_timeout=0.2)
                    return False  # the vote itself was sent: it gets through
                return state["down"] and "n2" in (sender, to) and sender != to

            c.drop = cut
            reply = await c.run("n1", ops)
            assert reply["ok"] is True, reply  # n2's yes vote was delivered before it stopped
            db2: nonstop.Database = state["reopened"]
            gtid = reply["g"].encode()
            assert db2.in_doubt() == [gtid]  # recovered in doubt, with its write lock
            assert dtx_keys(db2, K_PREPARED).keys() == {gtid}
            assert balances(db2) == {"B": 0}
            with pytest.raises(nonstop.LockTimeout), db2.transaction() as tx:
                tx.get(Account, number="B", lock="write")
            db2.close()
            await asyncio.sleep(0.2)  # the coordinator keeps resending the outcome
            state["down"] = False
            c.start("n2")
            assert c.rms["n2"].branches() == {reply["g"]: "recovered"}
            await c.settled()
            assert balances(c.dbs["n1"]) == {"A": 70}
            assert balances(c.dbs["n2"]) == {"B": 30}
            consistent(c.dbs["n2"])
            assert dtx_keys(c.dbs["n2"], K_TOMB) == {gtid: b"commit"}
            # Duplicated outcomes after the fact are acknowledged, never re-applied.
            dup = {"t": "dtx.outcome", "g": reply["g"], "o": "commit"}
            for _ in range(3):
                c.dispatch("n2", Received(c.loop.time(), "n1", dup))
            await asyncio.sleep(0.1)
            assert balances(c.dbs["n2"]) == {"B": 30}
            c.stop("n2")
            c.start("n2")
            assert balances(c.dbs["n2"]) == {"B": 30}
            assert c.dbs["n2"].in_doubt() == []
            assert not c.errors
        finally:
            c.close()

    run(body, tmp_path)


def test_in_doubt_participant_of_a_dead_coordinator_aborts_through_the_log(
    tmp_path: Path,
) -> None:
    """The coordinator stops after the prepares: n2 asks the log (B9), gets abort, rolls back."""
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"])
        try:
            ops, _ = await transfer_branches(c, 30)

            def kill_coordinator(sender: str, to: str, payload: Any) -> bool:
                if to == "n1" and sender == "n2" and payload.get("t") == VOTE:
                    if "n1" in c.machines:
                        c.stop("n1")
                    return True
                return False

            c.drop = kill_coordinator
            c.submit("n1", ops)
            await asyncio.sleep(1.0)
            db2 = c.dbs["n2"]
            assert db2.in_doubt() == []  # decided abort by the log after decision_timeout
            assert balances(db2) == {"B": 0}
            assert list(dtx_keys(db2, K_TOMB).values()) == [b"abort"]
            consistent(db2)
            c.drop = lambda *_: False
            c.start("n1")  # recovers its record and its prepared branch, learns abort
            await c.settled()
            assert balances(c.dbs["n1"]) == {"A": 100}
            consistent(c.dbs["n1"])
        finally:
            c.close()

    run(body, tmp_path)


# ------------------------------------------------------------------ pieces
def test_machine_accepts_rm_progress_only_from_itself(tmp_path: Path) -> None:

    node = DtxNode("n2", NoStore(), random.Random(1), {})
    node.handle(Started(0.0))
    node.handle(Received(0.0, "n1", {"t": "dtx.prepare", "g": "n1.1", "ops": [1], "f": 0}))
    assert node.branches["n1.1"].state == "locking"
    forged = node.handle(Received(0.1, "n1", {"t": RM, "p": [Ready("n1.1", b"r", {})]}))
    assert [type(a) for a in forged] == [Log]
    assert node.branches["n1.1"].state == "locking"
    junk = node.handle(Received(0.1, "n2", {"t": RM, "p": "nonsense"}))
    assert [type(a) for a in junk] == [Log] and node.branches["n1.1"].state == "locking"
    mine = node.handle(Received(0.2, "n2", {"t": RM, "p": [Ready("n1.1", b"r", {})]}))
    assert [type(a) for a in mine] == [Persist]
    assert mine[0].writes[0][0] == K_PREPARED + b"n1.1"
    assert node.branches["n1.1"].state == "persisting"
    node.handle(Received(0.3, "n1", {"t": "dtx.prepare", "g": "n1.2", "ops": [1], "f": 0}))
    refused = node.handle(Received(0.3, "n2", {"t": RM, "p": [Refused("n1.2", "conflict")]}))
    assert "n1.2" not in node.branches
    assert refused[0].payload == {"t": VOTE, "g": "n1.2", "v": "no", "why": "conflict"}


def test_real_config_orders_its_timeouts() -> None:
    cfg = DtxConfig.real()
    assert cfg.tick < cfg.retry < cfg.branch_timeout < cfg.vote_timeout
    assert cfg.decision_timeout >= cfg.vote_timeout
    assert cfg != DtxConfig()


def test_check_ops_shapes(tmp_path: Path) -> None:
    with nonstop.open(tmp_path / "s") as db:
        rm = StoreResourceManager(db, lambda _: None, lambda _: None)
        ref = b"r" * 20
        assert rm.check_ops([["b", "c.1"]]) is None
        assert rm.check_ops([["b", "c.1"], ["w", ref, "T", 3, b"\x80"]]) is None
        for bad in (
            [],
            "x",
            [["w", ref, "T", 3, b"\x80"]],
            [["b", ""]],
            [["b", "c.1"], ["w", b"short", "T", 3, b"\x80"]],
            [["b", "c.1"], ["w", ref, "T", -1, b"\x80"]],
            [["b", "c.1"], ["w", ref, "T", True, b"\x80"]],
            [["b", "c.1"], ["w", ref, "T", 1, {}]],
            [["b", "c.1"], ["x", ref, "T", 1, b"\x80"]],
        ):
            assert rm.check_ops(bad) is not None, bad


def test_persister_writes_plain_keys_and_a_resolve_for_an_unknown_gtid(tmp_path: Path) -> None:
    with nonstop.open(tmp_path / "s") as db:
        p = DtxPersister(db)
        results: list[BaseException | None] = []

        def persist(writes: tuple[tuple[bytes, bytes | None], ...]) -> None:
            box: list[BaseException | None] = []
            import threading

            ev = threading.Event()
            p.persist(writes, lambda exc: (box.append(exc), ev.set()))
            assert ev.wait(5)
            results.extend(box)

        persist(((b"dtx/seq", b"\x05"), (b"dtx/c/n1.4", b"rec")))
        # Abort of a branch that never prepared here: only the machine's keys change.
        persist(((K_PREPARED + b"n9.1", None), (K_TOMB + b"n9.1", b"abort")))
        assert results == [None, None]
        assert recovered_dtx_state(db) == {
            b"dtx/seq": b"\x05",
            b"dtx/c/n1.4": b"rec",
            K_TOMB + b"n9.1": b"abort",
        }
        with pytest.raises(ValueError):
            p.persist(((b"raft/x", b"1"),), lambda exc: None)
        with pytest.raises(StoreError):  # a prepared key with no prepared write set: a bug
            p.persist(((K_PREPARED + b"n9.2", RECORD),), lambda exc: None)


def test_recover_refuses_dtx_state_of_another_store(tmp_path: Path) -> None:
    with nonstop.open(tmp_path / "s") as db:
        rm = StoreResourceManager(db, lambda _: None, lambda _: None)
        with pytest.raises(StoreError):
            rm.recover("n1.1", RECORD)


def test_old_store_without_the_dtx_database_opens(tmp_path: Path) -> None:
    path = tmp_path / "old"
    with nonstop.open(path) as db, db.transaction() as tx:
        tx.create(Account, number="A", balance=5)
        assert tx.prepare(b"g-old") is True
    # Make it look like a store written before the dtx database existed.
    env = lmdb.open(str(path), max_dbs=64)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"dtx", txn=txn), delete=True)
    with env.begin() as txn:
        names = {bytes(k) for k, _ in txn.cursor()}
    env.close()
    assert b"dtx" not in names and b"prepared" in names
    with nonstop.open(path) as db:
        assert recovered_dtx_state(db) == {}
        assert db.in_doubt() == [b"g-old"]
        assert db.resolve(b"g-old", commit=True) is True
        assert balances(db) == {"A": 5}
        DtxPersister(db)  # and the new database is usable at once
    with nonstop.open(path) as db:
        assert balances(db) == {"A": 5} and db.in_doubt() == []


def test_branch_timeout_during_a_lock_wait_cancels_the_prepare(tmp_path: Path) -> None:
    """The machine gives up on a branch still waiting for a lock (branch_timeout < lock timeout).

    finish() stops the preparation and rolls the transaction back at once; the
    other transaction then gets its lock, and nothing of the branch is written.
    """

    observed: list[Any] = []

    async def spoil(c: Cluster, ops: dict[str, list[Any]], txs: dict[str, Any]) -> None:
        async with c.dbs["n2"].transaction() as tx:
            await tx.create(Account, number="C", balance=3)
        c_obj = await txs["n2"].get(Account, number="C", lock="none")
        ops["n2"].append(c.write(c_obj, balance=4))
        blocker = await c.dbs["n2"].transaction().__aenter__()
        await blocker.get(Account, number="C", lock="write")

        async def release_later() -> None:
            await asyncio.sleep(1.5)  # after branch_timeout (1.0), before lock_timeout (5)
            # The branch was rolled back while it still waited for the lock.
            observed.append((txs["n2"].active, c.rms["n2"].branches()))
            await blocker.rollback()

        c.loop.create_task(release_later())

    # n1, prepared, must not ask the log first (decision_timeout > branch_timeout).
    cfg = DtxConfig(tick=0.02, retry=0.05, vote_timeout=2.0, branch_timeout=1.0,
                    decision_timeout=3.0)  # fmt: skip
    _refused_case(tmp_path, spoil, "n2 voted no: branch timeout", lock_timeout=5.0, config=cfg)
    assert observed == [(False, {})]


def test_prepare_commit_failure_rolls_the_branch_back(tmp_path: Path) -> None:
    async def body(root: Path) -> None:
        seed(root, {"n1": {"A": 1}})
        db = nonstop.open(root / "n1")
        try:
            tx = await db.transaction().__aenter__()
            a = await tx.get(Account, number="A", lock="write")
            fed: list[Any] = []
            got = asyncio.Event()

            def feed(progress: list[Any]) -> None:
                fed.extend(progress)
                got.set()

            rm = StoreResourceManager(db, {"c.1": tx}.get, feed)
            ops = [["b", "c.1"], Cluster.write(a, balance=2)]
            assert rm.check_ops(ops) is None
            assert rm.open("n1.1", ops) == []
            await asyncio.wait_for(got.wait(), 5)
            assert fed == [Ready("n1.1", RECORD, {})]
            assert rm.holds("c.1") and db.engine.prepared.is_staged(b"n1.1")
            db.engine.committer.close()  # the store can no longer commit
            with pytest.raises(StoreError):
                DtxPersister(db).persist(((K_PREPARED + b"n1.1", b"rec"),), lambda exc: None)
            assert not tx.active and db.in_doubt() == []
            assert db.engine.locks.held_by(tx.id) == {}
        finally:
            db.close()

    run(body, tmp_path)


def test_cluster_composition_routes_rm_progress_to_the_dtx_node() -> None:
    """The node runtime builds a DtxClusterNode: its own dtx.rm message reaches the DtxNode."""
    from nonstop.cluster.node import ClusterConfig
    from nonstop.dtx.clustered import DtxClusterNode

    cfg = ClusterConfig(name="a", address="sim://a", store_timestamp=1, members=("a", "b"))
    node = DtxClusterNode(cfg, NoStore(), random.Random(1), {})
    node.handle(Started(0.0))
    node.handle(Received(0.0, "b", {"t": "dtx.prepare", "g": "b.1", "ops": [1], "f": 0}))
    assert node.dtx.branches["b.1"].state == "locking"
    out = node.handle(Received(0.1, "a", {"t": RM, "p": [Ready("b.1", b"r", {})]}))
    persists = [a for a in out if isinstance(a, Persist)]
    assert len(persists) == 1 and persists[0].token % 2 == 1  # the DtxNode's token parity
    assert persists[0].writes[0][0] == K_PREPARED + b"b.1"
    forged = node.handle(Received(0.2, "b", {"t": RM, "p": [Refused("b.1", "x")]}))
    assert not [a for a in forged if isinstance(a, Persist)]
    assert node.dtx.branches["b.1"].state == "persisting"


def test_the_node_compositions_take_the_runtime_s_liveness_notes() -> None:
    """The real node's machine is a composition (``DtxClusterNode``, and
    ``ReplicatedClusterNode`` on it), not a ``ClusterNode``: it must still ask the runtime
    for its notes of a peer's bare messages, and hand them to its detector."""
    from nonstop.cluster.failure import NodeIdentity, NodeState, location_code
    from nonstop.cluster.node import ClusterConfig
    from nonstop.dtx.clustered import DtxClusterNode
    from nonstop.node.replicated import ReplicatedClusterNode
    from nonstop.runtime.interface import ALIVE, TimerFired

    assert issubclass(ReplicatedClusterNode, DtxClusterNode)
    cfg = ClusterConfig(name="a", address="sim://a", store_timestamp=1, members=("a", "b"))
    node = DtxClusterNode(cfg, NoStore(), random.Random(1), {})
    assert node.hears_bare_messages
    node.handle(Started(0.0))
    b = NodeIdentity("b", "sim://b", location_code("b"), 2, (1, 1))
    hello = {"t": "hello", "id": b.to_wire(), "en": True, "ack": True, "peers": {}}
    node.handle(Received(0.0, "b", {"k": "fd", "en": True, "b": hello}))
    detector = node.cluster.detector
    assert detector.state_of("b") is NodeState.UP
    t = 0.0
    while t < 3.0:  # b's keep-alives never come; its bulk frames do
        t += 0.1
        node.handle(Received(t, "b", {"k": ALIVE}))
        node.handle(TimerFired(t, "fd:tick"))
    assert detector.state_of("b") is NodeState.UP


def test_two_branches_promoting_the_same_read_lock_one_is_the_deadlock_victim(
    tmp_path: Path,
) -> None:
    """Two global transactions read B, then both write it: one votes no (deadlock), one commits."""
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"], lock_timeout=5.0)
        try:
            runs = []
            for amount in (1, 2):
                b2, tx2 = await c.branch("n2")
                b = await tx2.get(Account, number="B")  # a read lock, promoted at prepare
                runs.append({"n2": [["b", b2], c.write(b, balance=b.balance + amount)]})
            replies = await asyncio.gather(*(c.run("n1", ops) for ops in runs))
            oks = [r for r in replies if r["ok"]]
            nos = [r for r in replies if not r["ok"]]
            assert len(oks) == 1 and len(nos) == 1, replies
            assert nos[0]["why"] == "n2 voted no: deadlock"
            await c.settled()
            assert balances(c.dbs["n2"])["B"] in (1, 2)
            consistent(c.dbs["n2"])
        finally:
            c.close()

    run(body, tmp_path)


def test_a_reference_field_may_point_to_an_object_of_another_node(tmp_path: Path) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 0}})

    async def body(root: Path) -> None:
        c = Cluster(root, ["n1", "n2"])
        try:
            _, tx1 = await c.branch("n1")
            a = await tx1.get(Account, number="A")
            a_ref = tx1.ref(a)
            b2, tx2 = await c.branch("n2")
            card = await tx2.create(Card, code="K")
            card_ref = tx2.ref(card).raw
            reply = await c.run("n1", {"n2": [["b", b2], c.write(card, holder=a_ref)]})
            assert reply["ok"] is True, reply
            await c.settled()
            await tx1.rollback()
            stored = c.dbs["n2"].engine.store.get_object(card_ref)
            assert stored is not None and stored[3]["holder"] == a_ref
        finally:
            c.close()

    run(body, tmp_path)


def test_a_prepared_transaction_keeps_its_read_locks_across_a_restart(tmp_path: Path) -> None:
    """Strict 2PL across a crash: what a prepared branch read stays read-locked till the outcome."""
    path = tmp_path / "s"
    seed(tmp_path, {"s": {"A": 10, "B": 0}})
    db = nonstop.open(path, lock_timeout=0.2)
    tx = db.transaction().__enter__()
    assert tx.get(Account, number="A").balance == 10  # read lock only
    tx.get(Account, number="B", lock="write").balance = 10
    assert tx.prepare(b"g-read") is True
    db.close()  # the process "dies" prepared
    with nonstop.open(path, lock_timeout=0.2) as db:
        assert db.in_doubt() == [b"g-read"]
        with db.transaction() as other:  # readers may share it ...
            assert other.get(Account, number="A").balance == 10
        with pytest.raises(nonstop.LockTimeout), db.transaction() as other:
            other.get(Account, number="A", lock="write")  # ... writers wait for the outcome
        assert db.resolve(b"g-read", commit=True) is True
        with db.transaction() as other:
            other.get(Account, number="A", lock="write").balance = 11
        assert balances(db) == {"A": 11, "B": 10}


def test_read_only_branch_restarted_in_doubt_keeps_its_read_lock(tmp_path: Path) -> None:
    seed(tmp_path, {"n1": {"A": 100}, "n2": {"B": 7}})

    async def body(root: Path) -> None:
        cfg = DtxConfig(tick=0.02, retry=0.05, vote_timeout=1.5, branch_timeout=1.0,
                        decision_timeout=5.0)  # fmt: skip
        c = Cluster(root, ["n1", "n2"], config=cfg)
        try:
            b1, tx1 = await c.branch("n1")
            b2, tx2 = await c.branch("n2")
            a = await tx1.get(Account, number="A", lock="write")
            await tx2.get(Account, number="B")  # read lock only: a read-only branch
            state: dict[str, Any] = {"down": False}

            def cut(sender: str, to: str, payload: Any) -> bool:
                if sender == "n2" and payload.get("t") == VOTE and not state["down"]:
                    state["down"] = True
                    c.stop("n2")
                    db2 = nonstop.open(root / "n2", lock_timeout=0.2)
                    try:
                        state["in_doubt"] = db2.in_doubt()
                        with db2.transaction() as tx:
                            tx.get(Account, number="B", lock="write")
                    except nonstop.LockTimeout:
                        state["locked"] = True
                    finally:
                        db2.close()
                    return False
                return state["down"] and "n2" in (sender, to) and sender != to

            c.drop = cut
            ops = {"n1": [["b", b1], c.write(a, balance=1)], "n2": [["b", b2]]}
            reply = await c.run("n1", ops)
            assert reply["ok"] is True, reply
            assert state["in_doubt"] == [reply["g"].encode()] and state["locked"] is True
            state["down"] = False
            c.start("n2")
            await c.settled()
            async with c.dbs["n2"].transaction(lock_timeout=0.2) as tx:
                (await tx.get(Account, number="B", lock="write")).balance = 8
            assert balances(c.dbs["n1"]) == {"A": 1} and balances(c.dbs["n2"]) == {"B": 8}
        finally:
            c.close()

    run(body, tmp_path)
