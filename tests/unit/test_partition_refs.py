"""References that name a partition (issue 10, ha.md §9): store format 3, creates into a
partition at an epoch, counters per (location, epoch) that survive restarts."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import lmdb
import pytest
from tests.bankmodel import Account

import nonstop
from nonstop.errors import BadArgument, IncompatibleStore
from nonstop.model.codec import pack
from nonstop.model.ref import MAX_EPOCH, Ref, split_sequence
from nonstop.store.lmdb_store import COUNTER_BLOCK, FORMAT_VERSION


def partition_location(name: str) -> int:
    """A private copy of ``nonstop.ha.partition_table.partition_location`` (ha-wire adds it)."""
    digest = hashlib.blake2b(b"nonstop/partition/" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


P0 = partition_location("default.0")
P1 = partition_location("default.1")


def set_format(path: Path, version: int) -> None:
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"format", pack(["nonstop-store", version]), db=env.open_db(b"meta", txn=txn))
    env.close()


def test_format_2_store_with_objects_is_refused_in_one_line(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db, db.transaction() as tx:
        tx.create(Account, number="A-1")
    set_format(store_dir, 2)
    with pytest.raises(IncompatibleStore) as caught:
        nonstop.open(store_dir)
    message = str(caught.value)
    assert "\n" not in message
    assert "store format 2 " in message and f"reads format {FORMAT_VERSION}" in message
    assert "name the creating node, not a partition" in message
    assert "nonstop pipeline export" in message  # what to do about it


def test_empty_format_2_store_is_upgraded_and_keeps_its_counter(store_dir: Path) -> None:
    """An empty format-2 store (one meta counter) opens as format 3; its counter continues."""
    with nonstop.open(store_dir) as db:
        location = db.location
    env = lmdb.open(str(store_dir), max_dbs=16)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(b"format", pack(["nonstop-store", 2]), db=meta)
        txn.put(b"counter", pack(5 * COUNTER_BLOCK), db=meta)
        txn.drop(env.open_db(b"seqs", txn=txn), delete=True)
    env.close()
    with nonstop.open(store_dir) as db:
        ref = Ref(db.engine.store.new_ref())
        assert ref.location == location and ref.counter > 5 * COUNTER_BLOCK
    with nonstop.open(store_dir) as db, db.engine.store.read() as rtxn:
        assert rtxn.get(b"counter", db=db.engine.store.meta) is None


def test_plain_create_is_unchanged_own_location_epoch_0(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db, db.transaction() as tx:
        ref = tx.ref(tx.create(Account, number="A-1"))
        assert ref.location == db.location and ref.epoch == 0
        assert ref.timestamp == db.engine.store.timestamp


def test_create_in_names_the_partition_and_the_epoch(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db:
        with db.transaction() as tx:
            a = tx.ref(tx.create_in(Account, P0, 3, number="A-1"))
            b = tx.ref(tx.create_in(Account, P1, 0, number="B-1"))
        assert (a.location, a.epoch, split_sequence(a.counter)[1]) == (P0, 3, 1)
        assert a.timestamp == 0  # no node in a partition's reference
        assert (b.location, b.epoch) == (P1, 0)
        with db.transaction() as tx:
            assert tx.by_ref(a).number == "A-1"  # type: ignore[union-attr]
            assert tx.get(Account, number="B-1") is not None
            assert tx.count(Account) == 2


def test_async_create_in(store_dir: Path) -> None:
    async def main(db: nonstop.Database) -> Ref:
        async with db.transaction() as tx:
            return tx.ref(await tx.create_in(Account, P0, 2, number="A-1"))

    with nonstop.open(store_dir) as db:
        ref = asyncio.run(main(db))
    assert (ref.location, ref.epoch) == (P0, 2)


def test_counter_per_location_and_epoch_survives_restart(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db:
        store = db.engine.store
        first = [store.new_ref(P0, 1) for _ in range(3)]
        other_epoch = [store.new_ref(P0, 2) for _ in range(3)]
    with nonstop.open(store_dir) as db:
        store = db.engine.store
        again = store.new_ref(P0, 1)
        later = store.new_ref(P0, 2)
    # never reused: the restart skips the rest of the reserved block
    assert again > max(first) and Ref(again).counter > (1 << 40) + COUNTER_BLOCK
    assert later > max(other_epoch)
    # two epochs of one location never collide: the epoch is in the sequence
    assert not {*first, again} & {*other_epoch, later}
    assert {Ref(r).epoch for r in first} == {1} and {Ref(r).epoch for r in other_epoch} == {2}
    # one location is one key range: the location code is the key prefix; in it,
    # references sort in creation order across epochs
    everything = [*first, *other_epoch, again, later]
    assert all(r[:8] == P0.to_bytes(8, "big") for r in everything)
    assert max(first) < min(other_epoch) and sorted([*first, again]) == [*first, again]


def test_two_nodes_active_at_different_epochs_never_share_a_reference(tmp_path: Path) -> None:
    """Node A active for P at epoch 4, then B promoted at epoch 5: disjoint references."""
    with nonstop.open(tmp_path / "a") as a, nonstop.open(tmp_path / "b") as b:
        from_a = set(a.engine.store.new_refs(1000, P0, 4))
        from_b = set(b.engine.store.new_refs(1000, P0, 5))
    assert len(from_a) == len(from_b) == 1000 and not from_a & from_b


@pytest.mark.parametrize(
    ("location", "epoch", "message"),
    [
        ("default.0", 0, "a location code is an int"),
        (1.5, 0, "a location code is an int"),
        (True, 0, "a location code is an int"),
        (-1, 0, "a location code is in 0..2\\*\\*64-1"),
        (1 << 64, 0, "a location code is in 0..2\\*\\*64-1"),
        (P0, -1, "an epoch is in 0..16777215"),
        (P0, MAX_EPOCH + 1, "an epoch is in 0..16777215"),
        (P0, "1", "an epoch is an int"),
    ],
)
def test_bad_location_or_epoch_is_refused_and_nothing_created(
    store_dir: Path, location: object, epoch: object, message: str
) -> None:
    with nonstop.open(store_dir) as db:
        with db.transaction() as tx:
            with pytest.raises(BadArgument, match=message):
                tx.create_in(Account, location, epoch, number="A-1")  # type: ignore[arg-type]
            with pytest.raises(BadArgument, match=message):
                db.engine.store.new_ref(location, epoch)  # type: ignore[arg-type]
        with db.transaction() as tx:
            assert tx.count(Account) == 0


def test_epoch_2_pow_24_minus_1_is_the_last_one(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db:
        ref = Ref(db.engine.store.new_ref(P0, MAX_EPOCH))
    assert ref.epoch == MAX_EPOCH and split_sequence(ref.counter) == (MAX_EPOCH, 1)
