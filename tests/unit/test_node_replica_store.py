"""The object store behind the real node's replication machine (node/replica_store.py).

A one-node commit reaches the store only after its records were replicated (a
refusal rolls it back, locks released); write sets are split by partition (a
reference's location); at promotion the store takes the machine's copy of a
partition -- newer versions applied, older ones left, objects the copy lacks
deleted, other partitions untouched.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bankmodel import Account

import nonstop
from nonstop import errors
from nonstop.model.codec import pack
from nonstop.node import replica_store
from nonstop.node.replica_store import (
    LOAD_BATCH,
    RESULT_KEY,
    install,
    load_copy,
    partition_write_sets,
    replicated_commit,
)
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.entries import Isolation
from nonstop.tx.replica import copy_batch
from nonstop.tx.requests import g_record_result, lookup_result

P0, P1 = 0x1111_0000_0000_0001, 0x2222_0000_0000_0002


@pytest.fixture
def db(tmp_path: Path) -> Iterator[nonstop.Database]:
    with nonstop.open(tmp_path / "store") as d:
        yield d


def balances(db: nonstop.Database) -> dict[str, int]:
    with db.transaction() as tx:
        return {a.number: a.balance for a in tx.query(Account)}


def create(db: nonstop.Database, location: int, number: str, balance: int) -> bytes:
    with db.transaction() as tx:
        obj = tx.create_in(Account, location, 1, number=number, balance=balance)
        return tx.ref(obj).raw


def test_a_commit_reaches_the_store_only_after_its_records_were_replicated(
    db: nonstop.Database,
) -> None:
    create(db, P0, "a", 10)
    seen: list[list[Any]] = []

    async def run(replicate: Any) -> Any:
        tx = AsyncTransaction(db, Isolation.SERIALIZABLE, 5.0)
        account = await tx.get(Account, number="a", lock="write")
        account.balance = 11
        return await replicated_commit(tx, replicate)

    async def unknown(records: list[list[Any]]) -> dict[str, Any]:
        return {"error": "Unavailable", "message": "outcome unknown"}

    async def accepted(records: list[list[Any]]) -> None:
        (stored,) = copy_batch(db.engine, P0)[0]  # committed state, read without locks
        assert stored[3] == 1, "not in the store before the replicas have it"
        seen.extend(records)

    async def refused(records: list[list[Any]]) -> None:
        raise errors.NotActive("not acting")

    with pytest.raises(errors.NotActive):
        asyncio.run(run(refused))
    assert balances(db) == {"a": 10}
    # A record made, then failed: the reply of an unknown outcome, nothing committed here.
    assert asyncio.run(run(unknown)) == {"error": "Unavailable", "message": "outcome unknown"}
    assert balances(db) == {"a": 10}
    assert asyncio.run(run(accepted)) is None  # the others released their locks
    assert balances(db) == {"a": 11}
    (record,) = seen
    assert record[0] == "u" and record[3] == 2


def test_write_sets_are_split_by_partition_and_skip_node_objects() -> None:
    a, b, c = b"\x01" * 20, b"\x02" * 20, b"\x03" * 20
    where = {a: "p0", b: "p1"}
    records = [["c", a, "T", 1, b"s"], ["d", b, "T"], ["u", c, "T", 2, b"t"]]
    sets = partition_write_sets(records, where.get)
    assert sets == {"p0": {a.hex(): ["T", 1, b"s"]}, "p1": {b.hex(): None}}


def test_the_store_takes_the_machine_copy_of_one_partition(db: nonstop.Database) -> None:
    kept = create(db, P0, "kept", 1)
    stale = create(db, P0, "stale", 2)
    gone = create(db, P0, "gone", 3)
    other = create(db, P1, "other", 4)
    new_ref = bytes.fromhex(kept.hex()[:-2] + "ff")
    with db.transaction() as tx:
        type_name = tx.entry_of(tx.get(Account, number="kept")).info.name
    copy = {
        kept.hex(): [type_name, 1, pack({"number": "kept", "balance": 100})],  # same version
        stale.hex(): [type_name, 5, pack({"number": "stale", "balance": 20})],  # newer
        new_ref.hex(): [type_name, 1, pack({"number": "new", "balance": 7})],
    }
    applied = asyncio.run(load_copy(db, P0, copy))
    assert applied == 4  # three objects of the copy, one delete
    # "gone" deleted, "stale" replaced, "kept" left (same version), another partition untouched
    assert balances(db) == {"kept": 1, "stale": 20, "new": 7, "other": 4}
    assert gone not in {bytes(r[1]) for r in copy_batch(db.engine, P0)[0]}
    asyncio.run(install(db, {stale.hex(): None}))  # a resolved commit that deleted it
    assert balances(db) == {"kept": 1, "new": 7, "other": 4}
    assert other in {bytes(r[1]) for r in copy_batch(db.engine, P1)[0]}


def test_a_large_copy_loads_in_batches_and_lets_the_event_loop_run(
    db: nonstop.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A promotion's load of thousands of objects: store transactions of at most
    LOAD_BATCH records, the loop turning between them (a node stalled by one big load
    is seen Down by its peers)."""
    n = 3 * LOAD_BATCH + 7
    with db.transaction() as tx:
        refs = [
            tx.ref(tx.create_in(Account, P0, 1, number=f"old{i}", balance=i)).raw
            for i in range(LOAD_BATCH)
        ]
        type_name = tx.entry_of(tx.get(Account, number="old0")).info.name
    copy: dict[str, Any] = {
        bytes.fromhex(refs[0].hex()[:-6] + f"{0x800000 + i:06x}").hex(): [
            type_name,
            1,
            pack({"number": f"n{i}", "balance": 1}),
        ]
        for i in range(n)
    }
    copy.update({r.hex(): None for r in refs[:10]})  # deleted in the copy too
    turns = 0
    batches: list[tuple[int, int]] = []  # (records, loop turns seen when it began)
    real_apply = replica_store.apply_write_set_async

    async def spy(db: Any, records: Any, **kw: Any) -> Any:
        batches.append((len(records), turns))
        return await real_apply(db, records, **kw)

    monkeypatch.setattr(replica_store, "apply_write_set_async", spy)

    async def run() -> int:
        nonlocal turns
        loading = True

        async def ticker() -> None:
            nonlocal turns
            while loading:
                turns += 1
                await asyncio.sleep(0)

        tick = asyncio.ensure_future(ticker())
        applied = await load_copy(db, P0, copy)
        loading = False
        await tick
        return applied

    applied = asyncio.run(run())
    assert applied == n + LOAD_BATCH  # every object of the copy, every old one deleted
    assert sum(size for size, _ in batches) == applied
    assert len(batches) == -(-applied // LOAD_BATCH)
    assert max(size for size, _ in batches) <= LOAD_BATCH
    seen = [at for _, at in batches]
    assert all(b > a for a, b in itertools.pairwise(seen))  # the loop ran between
    numbers = set(balances(db))
    assert len(numbers) == n and all(x.startswith("n") for x in numbers)


def test_request_records_ride_with_the_write_sets_and_are_loaded_at_promotion(
    db: nonstop.Database,
) -> None:
    """docs/design/requests.md §6: a commit's request record is replicated with every
    partition it writes; a promoted store takes it with the copy."""
    create(db, P0, "a", 10)
    seen: list[list[Any]] = []

    async def run() -> None:
        async def accepted(records: list[list[Any]]) -> None:
            seen.extend(records)

        tx = AsyncTransaction(db, Isolation.SERIALIZABLE, 5.0)
        account = await tx.get(Account, number="a", lock="write")
        account.balance = 11
        await tx.adrive(g_record_result(tx, "cli", 7, True, None))
        await replicated_commit(tx, accepted)

    asyncio.run(run())
    results = [r for r in seen if r[0] == "r"]
    assert len(results) == 1 and results[0][2] is not None
    ref = next(r[1] for r in seen if r[0] == "u")
    sets = partition_write_sets(seen, {ref: "p0"}.get)
    (key,) = [k for k in sets["p0"] if k.startswith(RESULT_KEY)]
    # Another store (the promoted replica) takes the copy: the request is known there.
    with nonstop.open(Path(db.path).parent / "replica") as replica:
        assert lookup_result(replica, "cli", 7) is None
        asyncio.run(load_copy(replica, P0, {key: sets["p0"][key]}))
        assert lookup_result(replica, "cli", 7) == (True, None)
