"""A replica applies its active node's write sets verbatim (tx/replica.py, ha.md §5, §7):
creates with given references, updates, deletes, indexes kept, idempotent, all or nothing,
counters bumped; restore copies by location range; counts and queries per set of locations."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bankmodel import Account

import nonstop
from nonstop import Managed, key
from nonstop.errors import BadArgument, DuplicateKey, FieldError, UnknownType
from nonstop.model.codec import pack
from nonstop.model.ref import Ref, split_sequence
from nonstop.tx.replica import (
    ReplicaGap,
    apply_write_set,
    apply_write_set_async,
    copy_batch,
    g_copy_batch,
    iter_location,
    write_set_records,
)


def partition_location(name: str) -> int:
    """A private copy of ``nonstop.ha.partition_table.partition_location``."""
    digest = hashlib.blake2b(b"nonstop/partition/" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


P0 = partition_location("default.0")
P1 = partition_location("default.1")


class Audited(Managed, name="test.replica.Audited"):
    """Triggers that must not run on a replica: their effects come as records."""

    code: str = key(unique=True, mutable=True)
    value: int = 0
    updates: int = 0

    def on_update(self) -> None:
        self.updates += 1


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[nonstop.Database, nonstop.Database]]:
    """An active node's store and a replica's store."""
    with nonstop.open(tmp_path / "active") as a, nonstop.open(tmp_path / "replica") as b:
        yield a, b


class Captured:
    """The records of one transaction, taken at prepare (as the replication driver will)."""

    def __init__(self, tx: nonstop.Transaction) -> None:
        self.records: list[list[Any]] = []
        tx.on_prepare(lambda: self.records.extend(write_set_records(tx)))


def dump(db: nonstop.Database) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Every key and value of every named database but ``meta`` (where the state lives)."""
    store = db.engine.store
    out: dict[bytes, list[tuple[bytes, bytes]]] = {}
    with store.read() as rtxn:
        names = [bytes(k) for k in rtxn.cursor().iternext(values=False)]
        for name in names:
            if name == b"meta":
                continue
            out[name] = [(bytes(k), bytes(v)) for k, v in rtxn.cursor(db=store.db_by_name(name))]
    return out


def accounts(db: nonstop.Database) -> dict[str, tuple[Ref, str, int]]:
    with db.transaction() as tx:
        return {a.number: (tx.ref(a), a.owner, a.balance) for a in tx.query(Account).all()}


def test_creates_updates_deletes_reach_the_replica_with_indexes(pair: Any) -> None:
    a, b = pair
    with a.transaction() as tx:
        first = Captured(tx)
        for i in range(5):
            tx.create_in(Account, P0, 1, number=f"A-{i}", owner="ann", balance=i)
    applied = apply_write_set(b, first.records)
    assert (applied.created, applied.updated, applied.deleted) == (5, 0, 0)
    assert accounts(b) == accounts(a)
    with a.transaction() as tx:
        second = Captured(tx)
        tx.get(Account, number="A-1").owner = "bob"
        tx.get(Account, number="A-2").balance = 99
        tx.delete(tx.get(Account, number="A-3"))
    assert [r[0] for r in second.records] == ["u", "u", "d"]
    applied = apply_write_set(b, second.records)
    assert (applied.created, applied.updated, applied.deleted) == (0, 2, 1)
    assert accounts(b) == accounts(a)
    with b.transaction() as tx:
        assert tx.find(Account, number="A-3") is None
        assert sorted(x.number for x in tx.query(Account).where(owner="bob").all()) == ["A-1"]
        assert len(tx.query(Account).where(owner="ann").all()) == 3
        assert tx.count(Account) == 4
    # the whole store, indexes and counts included, is the active node's
    assert dump(b)[b"objects"] == dump(a)[b"objects"]
    for name in (b"extents", b"counts", b"ix:bank.Account:number", b"ix:bank.Account:owner"):
        assert dump(b)[name] == dump(a)[name], name


def test_applying_the_same_write_set_twice_changes_nothing(pair: Any) -> None:
    a, b = pair
    with a.transaction() as tx:
        first = Captured(tx)
        tx.create_in(Account, P0, 1, number="A-1", owner="ann")
        tx.create_in(Account, P0, 1, number="A-2", owner="ann")
    with a.transaction() as tx:
        second = Captured(tx)
        tx.get(Account, number="A-1").owner = "bob"
        tx.delete(tx.get(Account, number="A-2"))
    apply_write_set(b, first.records)
    apply_write_set(b, second.records)
    before = dump(b)
    again = apply_write_set(b, second.records)
    assert (again.updated, again.deleted, again.unchanged) == (0, 0, 2)
    # a replay of the whole stream, in order (a driver resending after a reconnection)
    apply_write_set(b, first.records)
    apply_write_set(b, second.records)
    assert dump(b) == before


def test_exact_repeat_is_a_no_op_for_every_database(pair: Any) -> None:
    a, b = pair
    with a.transaction() as tx:
        ws = Captured(tx)
        for i in range(3):
            tx.create_in(Account, P0, 2, number=f"A-{i}", owner="o")
    apply_write_set(b, ws.records)
    before = dump(b)
    again = apply_write_set(b, ws.records)
    assert again.unchanged == 3 and again.created == 0 and not again.counters
    assert dump(b) == before


def test_triggers_do_not_run_on_the_replica(pair: Any) -> None:
    a, b = pair
    with a.transaction() as tx:
        ws = Captured(tx)
        tx.create_in(Audited, P0, 1, code="x")
    apply_write_set(b, ws.records)
    with a.transaction() as tx:
        ws = Captured(tx)
        tx.get(Audited, code="x").value = 5  # on_update runs here: updates = 1
    apply_write_set(b, ws.records)
    with b.transaction() as tx:
        x = tx.get(Audited, code="x")
        assert (x.value, x.updates) == (5, 1)  # not 2: the replica ran no trigger


def test_counter_is_bumped_durably_so_a_promoted_replica_never_collides(
    tmp_path: Path, pair: Any
) -> None:
    a, b = pair
    with a.transaction() as tx:
        ws = Captured(tx)
        made = [tx.ref(tx.create_in(Account, P0, 3, number=f"A-{i}")) for i in range(4)]
    applied = apply_write_set(b, ws.records)
    highest = max(split_sequence(r.counter)[1] for r in made)
    assert applied.counters == {(P0, 3): highest}
    store = b.engine.store
    assert Ref(store.new_ref(P0, 3)) > max(made)  # even at the same epoch (never by I1)
    b.close()
    with nonstop.open(tmp_path / "replica") as again:
        assert Ref(again.engine.store.new_ref(P0, 3)) > max(made)
        promoted = Ref(again.engine.store.new_ref(P0, 4))
        assert promoted.epoch == 4 and promoted not in made


def good_record(db: nonstop.Database, number: str) -> list[Any]:
    ref = db.engine.store.new_ref(P0, 1)
    return ["c", ref, "bank.Account", 1, pack({"number": number, "owner": "", "balance": 0})]


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ("not a record", BadArgument, "record 1 is not a list"),
        (["x", bytes(20), "bank.Account"], BadArgument, "unknown kind 'x'"),
        (["c", bytes(19), "bank.Account", 1, pack({})], BadArgument, "reference is 20 bytes"),
        (["c", bytes(20), "bank.Account", 0, pack({})], BadArgument, "version is an int >= 1"),
        (["c", bytes(20), "bank.Account", True, pack({})], BadArgument, "version is an int"),
        (["c", bytes(20), "bank.Account", 1, b"\xc1"], BadArgument, "state does not decode"),
        (["c", bytes(20), "bank.Account", 1, pack([1])], BadArgument, "map of field names"),
        (["c", bytes(20), "bank.Account", 1], BadArgument, "has 5 items, got 4"),
        (["d", bytes(20)], BadArgument, "has 3 items, got 2"),
        (["c", bytes(20), "", 1, pack({})], BadArgument, "non-empty str"),
        (["c", bytes(20), "no.such.Type", 1, pack({})], UnknownType, "record 1: managed type"),
        (
            ["c", bytes(20), "bank.Account", 1, pack({"number": "Z", "colour": 1})],
            FieldError,
            "record 1: bank.Account has no field",
        ),
        (
            ["c", bytes(20), "bank.Account", 1, pack({"number": 7})],
            FieldError,
            "record 1: bank.Account.number takes str",
        ),
        (["u", bytes(20), "bank.Account", 2, pack({})], ReplicaGap, "does not hold"),
        (
            ["c", bytes(20), "bank.Account", 1, pack({"number": "A-1"})],
            DuplicateKey,
            "number = 'A-1' is already taken",
        ),
    ],
)
def test_a_bad_record_applies_nothing(pair: Any, bad: Any, error: type, message: str) -> None:
    _, b = pair
    before = dump(b)
    with pytest.raises(error, match=message):
        apply_write_set(b, [good_record(b, "A-1"), bad])
    after = dump(b)
    assert after[b"objects"] == before[b"objects"] == []
    assert after[b"counts"] == before[b"counts"]
    assert after.get(b"ix:bank.Account:number", []) == []
    with b.transaction() as tx:
        assert tx.count(Account) == 0


def test_a_write_set_must_be_a_list(pair: Any) -> None:
    with pytest.raises(BadArgument, match="a write set is a list of records, got dict"):
        apply_write_set(pair[1], {"c": 1})


def test_a_missing_version_is_a_gap_not_a_silent_patch(pair: Any) -> None:
    a, b = pair
    with a.transaction() as tx:
        ws = Captured(tx)
        ref = tx.ref(tx.create_in(Account, P0, 1, number="A-1"))
    apply_write_set(b, ws.records)
    skip = ["u", ref.raw, "bank.Account", 3, pack({"balance": 3})]
    with pytest.raises(ReplicaGap, match="is at version 1, the record makes it version 3"):
        apply_write_set(b, [skip])
    wrong_type = ["u", ref.raw, "test.replica.Audited", 2, pack({"value": 1})]
    with pytest.raises(BadArgument, match=r"is a bank\.Account, not a test\.replica\.Audited"):
        apply_write_set(b, [wrong_type])
    deleted_then_used = [["d", ref.raw, "bank.Account"], ["u", *skip[1:3], 2, pack({})]]
    with pytest.raises(BadArgument, match="deleted by an earlier record"):
        apply_write_set(b, deleted_then_used)
    assert accounts(b) == accounts(a)


@pytest.mark.parametrize("reverse", [False, True])
def test_unique_value_moved_between_objects_in_one_write_set(pair: Any, reverse: bool) -> None:
    """A value one object gives up may be taken by another, in either record order."""
    a, b = pair
    with a.transaction() as tx:
        ws = Captured(tx)
        tx.create_in(Audited, P0, 1, code="x")
        tx.create_in(Audited, P0, 1, code="y")
    apply_write_set(b, ws.records)
    with a.transaction() as tx:
        ws = Captured(tx)
        x, y = tx.get(Audited, code="x"), tx.get(Audited, code="y")
        x.code, y.code = "tmp", "x"
        moved = tx.ref(y)
    apply_write_set(b, list(reversed(ws.records)) if reverse else ws.records)
    with b.transaction() as tx:
        assert tx.ref(tx.get(Audited, code="x")) == moved
        assert tx.get(Audited, code="tmp") is not None and tx.find(Audited, code="y") is None
    assert dump(b)[b"ix:test.replica.Audited:code"] == dump(a)[b"ix:test.replica.Audited:code"]


def test_async_apply(pair: Any) -> None:
    a, b = pair
    with a.transaction() as tx:
        ws = Captured(tx)
        tx.create_in(Account, P1, 0, number="A-1")

    async def main() -> int:
        return (await apply_write_set_async(b, ws.records)).created

    assert asyncio.run(main()) == 1
    assert accounts(b) == accounts(a)


def test_restore_copy_scans_one_location_in_batches(tmp_path: Path, pair: Any) -> None:
    a, _ = pair
    with a.transaction() as tx:
        for i in range(23):
            tx.create_in(Account, P0, i % 3, number=f"P0-{i}", owner="x")
        for i in range(5):
            tx.create_in(Account, P1, 1, number=f"P1-{i}")
            tx.create(Account, number=f"own-{i}")
    records, resume = copy_batch(a.engine, P0, None, 10)
    assert len(records) == 10 and resume == records[-1][1]
    batches = list(iter_location(a.engine, P0, batch=10))
    assert [len(x) for x in batches] == [10, 10, 3]
    refs = [r[1] for batch in batches for r in batch]
    assert refs == sorted(refs) and len(set(refs)) == 23
    assert all(Ref(r).location == P0 for r in refs)
    assert copy_batch(a.engine, P0, refs[-1], 10) == ([], None)
    with nonstop.open(tmp_path / "restored") as c:
        for batch in batches:
            apply_write_set(c, batch)
        with c.transaction() as tx:
            assert tx.count(Account) == 23
            assert len(tx.query(Account).where(owner="x").all()) == 23
        assert {k: v for k, v in accounts(c).items()} == {
            k: v for k, v in accounts(a).items() if k.startswith("P0-")
        }
    with pytest.raises(BadArgument, match="resume key of location"):
        copy_batch(a.engine, P0, refs[0][:10], 10)
    with pytest.raises(BadArgument, match="resume key of location"):
        copy_batch(a.engine, P1, refs[0], 10)
    with pytest.raises(BadArgument, match="batch size is a positive int"):
        copy_batch(a.engine, P0, None, 0)
    with pytest.raises(BadArgument, match="location code is an int"):
        copy_batch(a.engine, "default.0", None, 10)  # type: ignore[arg-type]


def test_restore_copy_under_traffic_locks_its_batch_and_catches_up(
    tmp_path: Path, pair: Any
) -> None:
    """ha.md §7: the copy read-locks each batch until the target has it; writes made during
    the copy reach the target as write sets, applied with ``catching_up``."""
    a, _ = pair
    with a.transaction() as tx:
        for i in range(10):
            tx.create_in(Account, P0, 1, number=f"A-{i}", balance=i)
    with nonstop.open(tmp_path / "target") as c:
        copier = a.transaction().__enter__()
        first, resume = copier.drive(g_copy_batch(copier, P0, None, 5))
        copied = {Ref(r[1]) for r in first}
        # a writer of a copied object waits for the batch (here: gives up at once)
        writer = a.transaction(lock_timeout=0.05).__enter__()
        victim = next(
            x for x in writer.query(Account).lock("none").all() if writer.ref(x) in copied
        )
        with pytest.raises(nonstop.LockTimeout):
            writer.lock(victim, "write")
        writer.rollback()
        apply_write_set(c, first)
        copier.rollback()  # (read only: the batch is on the target, let writers in)
        # traffic: one copied object and one not yet copied change, one of each is deleted
        with a.transaction() as tx:
            traffic = Captured(tx)
            done, pending = (
                sorted(copied)[0],
                max(tx.ref(x) for x in tx.query(Account).all() if tx.ref(x) not in copied),
            )
            tx.by_ref(done).balance = 100  # type: ignore[union-attr]
            tx.by_ref(pending).balance = 200  # type: ignore[union-attr]
            tx.delete(tx.by_ref(sorted(copied)[1]))  # type: ignore[arg-type]
        with pytest.raises(ReplicaGap, match="does not hold"):
            apply_write_set(c, traffic.records)  # an in-sync replica never sees this
        applied = apply_write_set(c, traffic.records, catching_up=True)
        assert (applied.created, applied.updated, applied.deleted) == (1, 1, 1)
        copier = a.transaction().__enter__()
        rest, end = copier.drive(g_copy_batch(copier, P0, resume, 5))
        assert end is None and len(rest) == 5
        later = apply_write_set(c, rest, catching_up=True)
        assert later.unchanged == 1 and later.created == 4  # (the pending one came first)
        copier.rollback()
        assert accounts(c) == accounts(a)


def test_catching_up_still_refuses_a_partial_update_of_an_absent_object(pair: Any) -> None:
    _, b = pair
    partial = ["u", b.engine.store.new_ref(P0, 1), "bank.Account", 4, pack({"balance": 1})]
    with pytest.raises(ReplicaGap, match="does not hold"):
        apply_write_set(b, [partial], catching_up=True)
