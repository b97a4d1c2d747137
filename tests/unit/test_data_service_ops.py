"""The data service in one process: branch ops, write sets, peer RPC, idle branches.

A fake runtime stands in for the network (it records what the service sends);
the store is a real ``nonstop.Database``.  The 3-node behaviour is
``tests/cluster/test_data_service.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.distmodel import Account

import nonstop
from nonstop import errors
from nonstop.dataplane.commit import map_run_reply
from nonstop.dataplane.ends import END_ALL
from nonstop.dataplane.service import DataService, ServiceConfig
from nonstop.dataplane.session_ops import merge_write
from nonstop.dataplane.store_ops import apply_writes, claim_and_record, execute, run_branch_op
from nonstop.model.codec import pack, unpack
from nonstop.model.ref import Ref
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.transaction import Isolation

ACC = "dist.Account"


class FakeRuntime:
    def __init__(self, name: str, location: int) -> None:
        self.name = name
        self.hello = SimpleNamespace(location=location, address="127.0.0.1:1")
        self.peers: dict[str, Any] = {}
        self.addresses: dict[str, Any] = {}
        self.machine: Any = None
        self.sent: list[tuple[str, Any]] = []
        self.notifiers: dict[str, list[Any]] = {}
        self.states: dict[str, str] = {}
        """The failure detector's view, once ``detect()`` installed one."""

    def send(self, to: str, payload: Any) -> None:
        self.sent.append((to, payload))

    def connected(self, name: str) -> bool:
        return False

    def add_notifier(self, kind: str, callback: Any) -> None:
        self.notifiers.setdefault(kind, []).append(callback)

    def detect(self, **states: str) -> None:
        """A cluster layer whose failure detector sees ``states``."""
        self.states.update(states)
        self.machine = SimpleNamespace(
            detector=SimpleNamespace(state_of=lambda name: self.states.get(name, "Down")),
            view_members=[],
        )

    def node_state(self, peer: str, new: str) -> None:
        """The failure detector's ``node_state`` notification."""
        old = self.states.get(peer)
        self.states[peer] = new
        for callback in self.notifiers.get("node_state", []):
            callback(
                SimpleNamespace(kind="node_state", data={"peer": peer, "old": old, "new": new})
            )


class FakeConn:
    def __init__(self) -> None:
        self.closed = False
        self.replies: dict[Any, Any] = {}

    def send(self, frame: Any) -> None:
        assert frame["t"] == "rep"
        self.replies[frame["id"]] = frame["p"]


async def client_call(svc: DataService, conn: FakeConn, payload: dict[str, Any]) -> Any:
    """One client op through the service; its reply."""
    rid = len(conn.replies) + 1 + id(payload) % 1000 * 1000
    svc.on_client(conn, rid, payload)
    for _ in range(400):
        if rid in conn.replies:
            return conn.replies.pop(rid)
        await asyncio.sleep(0.005)
    raise AssertionError(f"no reply to {payload.get('op')}")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[nonstop.Database]:
    database = nonstop.open(tmp_path / "store", durability="none", lock_timeout=0.2)
    with database.transaction() as tx:
        tx.create(Account, number="a1", balance=10)
        tx.create(Account, number="a2", balance=20)
    try:
        yield database
    finally:
        database.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def tx_of(db: nonstop.Database) -> AsyncTransaction:
    return AsyncTransaction(db, Isolation.SERIALIZABLE, 0.2)


# ------------------------------------------------------------------ pure mapping
def test_commit_reply_mapping() -> None:
    assert map_run_reply({"ok": True, "outcome": "commit"}) == {"ok": True}
    for why, name in [
        ("B voted no: conflict", "Conflict"),
        ("B voted no: lock timeout", "LockTimeout"),
        ("C voted no: deadlock", "Deadlock"),
        ("C voted no: branch timeout", "LockTimeout"),
        ("A voted no: branch gone", "BranchRolledBack"),
        ("C voted no: FieldError: x", "Aborted"),
        ("", "Aborted"),
    ]:
        reply = map_run_reply({"ok": False, "error": "Aborted", "why": why})
        assert reply["error"] == name, why
    # No vote in time: aborted on the coordinator's own authority -- retryable.
    assert map_run_reply({"ok": False, "error": "Unavailable", "why": "no vote"})["error"] == (
        "TransactionLost"
    )
    assert map_run_reply({"ok": False, "error": "BadRequest", "why": "x"})["error"] == "Error"
    assert map_run_reply(None)["error"] == "Error"


def test_later_writes_of_an_object_add_up() -> None:
    pending: dict[bytes, list[Any]] = {}
    ref = b"r" * 20
    merge_write(pending, [ref, ACC, 3, pack({"balance": 1})])
    merge_write(pending, [ref, ACC, 3, pack({"owner": "x", "balance": 2})])
    assert pending[ref][2] == 3
    assert unpack(pending[ref][3]) == {"balance": 2, "owner": "x"}


# ------------------------------------------------------------------ write sets
def test_apply_writes_checks_versions_types_and_fields(db: nonstop.Database) -> None:
    async def main() -> None:
        tx = tx_of(db)
        obj = await tx.get(Account, number="a1", lock="write")
        ref, version = obj._e.ref, obj._e.version
        await apply_writes(tx, [[ref, ACC, version, pack({"balance": 11})]])
        assert obj.balance == 11
        with pytest.raises(errors.Conflict, match="version"):
            await apply_writes(tx, [[ref, ACC, version + 1, pack({"balance": 12})]])
        await tx.rollback()
        tx = tx_of(db)
        with pytest.raises(errors.BadArgument, match=r"is a dist\.Account"):
            await apply_writes(tx, [[ref, "dist.Note", version, pack({"text": "x"})]])
        with pytest.raises(errors.FieldError):
            await apply_writes(tx, [[ref, ACC, version, pack({"nope": 1})]])
        with pytest.raises(errors.UnknownType):
            await apply_writes(tx, [[ref, "no.Type", version, pack({})]])
        with pytest.raises(errors.ProtocolError):
            await apply_writes(tx, [[ref, ACC, version]])
        with pytest.raises(errors.BadArgument):
            await apply_writes(tx, "not a list")
        with pytest.raises(errors.Conflict, match="deleted"):
            await apply_writes(tx, [[b"\0" * 20, ACC, 1, pack({"balance": 1})]])
        await tx.rollback()

    run(main())
    with db.transaction() as tx:
        assert tx.get(Account, number="a1").balance == 10  # nothing was committed


def test_branch_ops_refuse_bad_input(db: nonstop.Database) -> None:
    async def main() -> None:
        tx = tx_of(db)
        bad = [
            ("branch.get", {"type": ACC, "tv": 1, "key": pack({"number": "a", "owner": "b"})}),
            ("branch.get", {"type": ACC, "tv": 1, "key": b"\xc1garbage"}),
            ("branch.get", {"type": ACC, "tv": 1, "key": "not bytes"}),
            ("branch.query", {"type": ACC, "tv": 1, "range": pack(["owner", "a"])}),
            ("branch.query", {"type": ACC, "tv": 1, "order": "owner"}),
            ("branch.query", {"type": ACC, "tv": 1, "where": pack(["x"])}),
            ("branch.create", {"type": ACC, "tv": 1, "st": pack([1])}),
            ("branch.call", {"ref": b"x" * 20, "m": "__init__", "a": pack([[], {}])}),
            ("branch.ref", {"ref": b"short"}),
            ("branch.fly", {}),
        ]
        for op, fields in bad:
            with pytest.raises(errors.BadArgument):
                await execute(tx, op, fields)
        with pytest.raises(errors.TypeVersionMismatch):
            await execute(tx, "branch.count", {"type": ACC, "tv": 2})
        with pytest.raises(errors.NotFound):
            await execute(tx, "branch.delete", {"ref": b"\0" * 20})
        # The transaction is still usable after all of that.
        reply = await execute(tx, "branch.count", {"type": ACC, "tv": 1})
        assert reply == {"n": 2}
        a1 = (
            await execute(tx, "branch.get", {"type": ACC, "tv": 1, "key": pack({"number": "a1"})})
        )["o"]
        called = await execute(
            tx, "branch.call", {"ref": a1[0], "m": "audit_note", "a": pack([[], {}]), "ro": True}
        )
        raise AssertionError(f"not-remote method ran remotely: {called}")

    with pytest.raises(errors.NotRemote):
        run(main())


# ------------------------------------------------------------------ the service
def service(db: nonstop.Database, **config: Any) -> tuple[DataService, FakeRuntime]:
    rt = FakeRuntime("B", db.location)
    rt.peers["A"] = SimpleNamespace(location=1234, address="127.0.0.1:2")
    return DataService(rt, db, ServiceConfig(**config)), rt


async def peer_call(svc: DataService, rt: FakeRuntime, sender: str, msg: dict[str, Any]) -> Any:
    rt.sent.clear()
    svc.on_peer(sender, {"t": "data.req", "id": 7, **msg})
    for _ in range(200):
        await asyncio.sleep(0.005)
        # Other peer messages (the deadlock detector's data.waits) may come first.
        replies = [(to, p) for to, p in rt.sent if p.get("t") == "data.rep"]
        if replies:
            to, payload = replies[0]
            assert to == sender and payload["id"] == 7
            return payload["p"]
    raise AssertionError("no reply")


def test_participant_branch_lifecycle(db: nonstop.Database) -> None:
    async def main() -> None:
        svc, rt = service(db, branch_idle=0.3, sweep_every=0.05, lock_wait=0.2)
        rt.detect(A="Up", C="Up")
        svc.start()
        get = {"op": "branch.get", "type": ACC, "tv": 1, "key": pack({"number": "a1"})}
        # Only the coordinator named in the branch id may use it.
        assert (await peer_call(svc, rt, "C", {**get, "b": "A.1", "new": True}))["error"] == (
            "BadArgument"
        )
        # A branch is opened only by a request that says it is new.
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.1"})
        assert reply["error"] == "BranchRolledBack"
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.1", "new": True, "lock": "write"})
        obj = reply["o"]
        assert unpack(obj[3])["balance"] == 10 and "A.1" in svc.branches
        # A write set rides on the next op; the reply says the branch changed.
        w = [[obj[0], ACC, obj[2], pack({"balance": 9})]]
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.1", "w": w})
        assert reply["d"] is True and unpack(reply["o"][3])["balance"] == 9
        # Another branch waits for the write lock and times out: retryable, and
        # that branch is over at once.
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.2", "new": True, "lock": "write"})
        assert reply["error"] == "LockTimeout"
        assert "A.2" not in svc.branches
        # Idle for branch_idle: rolled back, the lock released, the id never reused.
        await asyncio.sleep(0.6)
        assert "A.1" not in svc.branches and svc.stats["idle_rollbacks"] == 1
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.1", "new": True})
        assert reply["error"] == "BranchRolledBack"
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.3", "new": True, "lock": "write"})
        assert unpack(reply["o"][3])["balance"] == 10  # the write was rolled back
        # The resource manager takes a branch over: it leaves the registry.
        tx = svc.lookup_branch("A.3")
        assert isinstance(tx, AsyncTransaction) and tx.active and "A.3" not in svc.branches
        assert svc.lookup_branch("A.3") is None
        await tx.rollback()
        # Its coordinator goes Down: its open branches here are rolled back at once.
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.4", "new": True, "lock": "write"})
        assert "A.4" in svc.branches
        rt.node_state("A", "Down")
        await asyncio.sleep(0.05)
        assert "A.4" not in svc.branches and svc.stats["orphan_rollbacks"] == 1
        reply = await peer_call(svc, rt, "A", {**get, "b": "A.4"})
        assert reply["error"] == "BranchRolledBack"
        # Its lock is free: another branch gets it at once.
        reply = await peer_call(svc, rt, "C", {**get, "b": "C.1", "new": True, "lock": "write"})
        assert reply["o"][0] == obj[0]
        # branch.end of an unknown branch is fine (idempotent); a bad message is dropped.
        assert await peer_call(svc, rt, "A", {"op": "branch.end", "b": "A.9"}) == {}
        svc.on_peer("A", {"t": "data.weird"})
        svc.on_peer("A", {"t": "data.rep", "id": 424242, "p": {}})  # nobody waits for it
        await svc.stop()

    run(main())


def test_calls_to_a_peer_fail_fast_when_it_is_not_up(db: nonstop.Database) -> None:
    async def main() -> None:
        svc, rt = service(db, rpc_timeout=0.2)
        rt.detect(A="Down")
        svc.start()
        conn = FakeConn()
        count = {"op": "tx.count", "type": ACC, "tv": 1, "scope": ["A"]}
        # A peer that is not up is not asked.
        on_a = {"op": "tx.ref", "ref": Ref.make(1234, 1, 1).raw, "begin": "serializable"}
        reply = await client_call(svc, conn, on_a)
        assert reply["error"] == "Unavailable" and "not up" in reply["message"]
        assert rt.sent == []
        # A reply for the call resolves it, from that peer only.
        rt.node_state("A", "Up")
        await asyncio.sleep(0.01)
        svc.on_client(conn, 1, {**count, "begin": "serializable"})
        await asyncio.sleep(0.01)
        # (A is up: it is told to end any branch of B it holds but open sessions'.)
        ((to, sent),) = [(to, p) for to, p in rt.sent if p.get("op") != END_ALL]
        assert to == "A" and sent["op"] == "branch.count" and sent["new"] is True
        svc.on_peer("C", {"t": "data.rep", "id": sent["id"], "p": {"n": 1}})  # wrong sender
        await asyncio.sleep(0.01)
        assert conn.replies == {}
        svc.on_peer("A", {"t": "data.rep", "id": sent["id"], "p": {"n": 3}})
        assert conn.replies.pop(1)["n"] == 3
        # Down fails the calls still waiting, at once.
        rt.sent.clear()
        svc.on_client(conn, 2, {**count, "begin": "serializable"})
        await asyncio.sleep(0.01)
        assert len(rt.sent) == 1
        rt.node_state("A", "Down")
        await asyncio.sleep(0.01)
        reply = conn.replies.pop(2)
        assert reply["error"] == "TransactionLost" and "down" in reply["message"]
        # No answer within rpc_timeout: Unavailable.
        rt.node_state("A", "Up")
        await asyncio.sleep(0.01)
        reply = await client_call(svc, conn, {**count, "begin": "serializable"})
        assert reply["error"] == "TransactionLost" and "did not answer" in reply["message"]
        await svc.stop()

    run(main())


def test_no_distributed_commit_without_quorum(db: nonstop.Database) -> None:
    async def main() -> None:
        svc, rt = service(db)
        rt.machine = SimpleNamespace(
            quorum_state="Disabled",
            detector=SimpleNamespace(state_of=lambda name: "Up"),
            view_members=["A", "B"],
        )
        svc.start()
        conn = FakeConn()
        sid = (await client_call(svc, conn, {"op": "tx.begin"}))["s"]
        remote = Ref.make(1234, 1, 1).raw  # mastered on A (location 1234)
        w = [[remote, ACC, 1, pack({"balance": 1})]]
        reply = await client_call(svc, conn, {"op": "tx.commit", "s": sid, "w": w})
        assert reply["error"] == "Unavailable" and "no quorum" in reply["message"]
        # The session is over, and nothing was sent anywhere (no submit, no RPC).
        reply = await client_call(svc, conn, {"op": "tx.count", "s": sid, "type": ACC, "tv": 1})
        assert reply["error"] == "TransactionClosed"
        assert [p for _, p in rt.sent if p.get("op") != END_ALL] == []
        # Disabled means disabled (D16): a commit that wrote only here is refused too.
        sid = (await client_call(svc, conn, {"op": "tx.begin"}))["s"]
        st = pack({"number": "q1", "balance": 1})
        create = {"op": "tx.create", "s": sid, "type": ACC, "tv": 1, "st": st}
        assert "o" in await client_call(svc, conn, create)
        reply = await client_call(svc, conn, {"op": "tx.commit", "s": sid})
        assert reply["error"] == "Unavailable" and "no quorum" in reply["message"]
        await svc.stop()

    run(main())
    with db.transaction() as tx:
        assert tx.find(Account, number="q1") is None


def test_local_session_and_exactly_once_through_the_service(db: nonstop.Database) -> None:
    async def main() -> None:
        svc, _ = service(db)
        svc.start()
        conn = FakeConn()
        key = pack({"number": "a1"})
        reply = await client_call(
            svc, conn, {"op": "tx.get", "begin": "serializable", "type": ACC, "tv": 1, "key": key}
        )
        sid, obj = reply["s"], reply["o"]
        w = [[obj[0], ACC, obj[2], pack({"balance": 42})]]
        commit = {"op": "tx.commit", "s": sid, "w": w, "req": ["me", 1]}
        assert await client_call(svc, conn, commit) == {"ok": True}
        assert svc.machine.branches == {} and svc._txs == {}
        # The reply was "lost": the retry (even after a restart of the service,
        # nothing in memory) answers the first outcome, and nothing runs again.
        svc2, _ = service(db)
        svc2.start()
        assert await client_call(svc2, conn, commit) == {"ok": True}
        reply = await client_call(svc2, conn, {"op": "request.result", "req": ["me", 1]})
        assert reply == {"state": "committed", "result": None}
        reply = await client_call(svc2, conn, {"op": "request.result", "req": ["me", 2]})
        assert reply["state"] == "unknown"
        # A closed connection rolls its sessions back.
        reply = await client_call(
            svc2,
            conn,
            {
                "op": "tx.get",
                "begin": "serializable",
                "type": ACC,
                "tv": 1,
                "key": key,
                "lock": "write",
            },
        )
        assert svc2._txs
        svc2.connection_closed(conn)
        await asyncio.sleep(0.02)
        assert svc2._txs == {} and svc2.machine.sessions == {}
        await svc.stop()
        await svc2.stop()

    run(main())
    with db.transaction() as tx:
        assert tx.get(Account, number="a1").balance == 42


def test_a_homed_lookup_waits_for_its_own_request_only(db: nonstop.Database) -> None:
    """``request.lookup`` on the home node (docs/design/requests.md §3, issue 10 H4): a
    prepared transaction that claimed the request's slot is waited for (its lock), and
    once the slot is free the answer is final -- another transaction prepared on the
    same store does not make it "in doubt".  (It did: under load some transaction is
    nearly always prepared, so a client whose commit reply was lost with its
    coordinator was told "running" for seconds about a request that never committed.)
    """

    async def go() -> None:
        other = tx_of(db)
        account = await other.get(Account, number="a1", lock="write")
        account.balance += 1
        assert await other.prepare(b"g-other") is True
        reply = await run_branch_op(tx_of(db), "request.lookup", {"req": ["cli", 1]}, None)
        assert reply == {"found": None, "in_doubt": False}

        mine = tx_of(db)
        assert await claim_and_record(mine, ("cli", 2), 16) is None
        (await mine.get(Account, number="a2", lock="write")).balance += 1
        assert await mine.prepare(b"g-mine") is True
        with pytest.raises(errors.LockTimeout):  # in doubt: waits for the slot's lock
            await run_branch_op(tx_of(db), "request.lookup", {"req": ["cli", 2]}, None)
        await mine.commit_prepared()
        reply = await run_branch_op(tx_of(db), "request.lookup", {"req": ["cli", 2]}, None)
        assert reply == {"found": [True, None], "in_doubt": False}
        await other.abort_prepared()

    run(go())


def test_a_fenced_lookup_settles_an_unrecorded_request_as_not_committed(
    db: nonstop.Database,
) -> None:
    """``request.lookup`` with ``fence`` (requests.md §3, issue 10 H4): nothing recorded
    and the slot free -> "not committed" is recorded in the lookup's branch; committed,
    it is every later attempt's answer (the attempt's claim finds it, so it commits
    nothing), and asking again finds the record.  A request that committed is found,
    not fenced; an attempt holding the slot (prepared) is waited for."""

    async def go() -> None:
        fence = tx_of(db)
        reply = await run_branch_op(
            fence, "request.lookup", {"req": ["cli", 7], "fence": True}, None
        )
        assert reply == {"found": None, "in_doubt": False, "fenced": True}
        await fence.commit()
        # A late attempt of the request (its coordinator was cut off, not dead): its
        # claim finds the fence, so it commits nothing.
        late = tx_of(db)
        found = await claim_and_record(late, ("cli", 7), 16)
        assert found is not None and found[0] is False and found[1][0] == "NotCommitted"
        await late.rollback()
        again = await run_branch_op(tx_of(db), "request.lookup", {"req": ["cli", 7]}, None)
        assert again["found"][0] is False and again["found"][1][0] == "NotCommitted"

        done = tx_of(db)
        assert await claim_and_record(done, ("cli", 8), 16) is None
        await done.commit()
        reply = await run_branch_op(
            tx_of(db), "request.lookup", {"req": ["cli", 8], "fence": True}, None
        )
        assert reply == {"found": [True, None], "in_doubt": False}

        held = tx_of(db)
        assert await claim_and_record(held, ("cli", 9), 16) is None
        assert await held.prepare(b"g-held") is True
        with pytest.raises(errors.LockTimeout):  # in doubt: waits for the slot's lock
            await run_branch_op(
                tx_of(db), "request.lookup", {"req": ["cli", 9], "fence": True}, None
            )
        await held.commit_prepared()
        reply = await run_branch_op(
            tx_of(db), "request.lookup", {"req": ["cli", 9], "fence": True}, None
        )
        assert reply == {"found": [True, None], "in_doubt": False}

    run(go())
