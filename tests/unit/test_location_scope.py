"""Counts, queries and lookups restricted to a set of locations (``tx.restrict_to``): a node
holding several partitions answers for the ones it is active for, each partition once."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from tests.bankmodel import Account

import nonstop
from nonstop.errors import BadArgument, DuplicateKey


def partition_location(name: str) -> int:
    """A private copy of ``nonstop.ha.partition_table.partition_location``."""
    digest = hashlib.blake2b(b"nonstop/partition/" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


P0 = partition_location("default.0")
P1 = partition_location("default.1")


@pytest.fixture
def db(tmp_path: Path) -> nonstop.Database:
    """Active for P0 (3 accounts), replica of P1 (2 accounts), 1 account of its own."""
    db = nonstop.open(tmp_path / "store")
    with db.transaction() as tx:
        for i in range(3):
            tx.create_in(Account, P0, 1, number=f"P0-{i}", owner="ann")
        for i in range(2):
            tx.create_in(Account, P1, 4, number=f"P1-{i}", owner="ann")
        tx.create(Account, number="own", owner="ann")
    return db


def test_default_scope_is_everything(db: nonstop.Database) -> None:
    with db, db.transaction() as tx:
        assert tx.scope is None
        assert tx.count(Account) == 6 == tx.query(Account).count()
        assert len(tx.query(Account).where(owner="ann").all()) == 6


def test_restricted_counts_queries_and_lookups(db: nonstop.Database) -> None:
    with db, db.transaction() as tx:
        tx.restrict_to([P0])
        assert tx.count(Account) == 3
        assert tx.query(Account).count() == 3
        assert sorted(a.number for a in tx.query(Account).all()) == ["P0-0", "P0-1", "P0-2"]
        assert len(tx.query(Account).where(owner="ann").all()) == 3  # (an index scan)
        assert len(tx.query(Account).order_by("owner").all()) == 3
        assert len(list(tx.query(Account).lock("none"))) == 3  # (the streaming path)
        assert tx.find(Account, number="P0-1") is not None
        assert tx.find(Account, number="P1-1") is None  # held here, not in scope
        assert tx.query(Account).where(number="P0-0").first() is not None
        assert tx.query(Account).where(number="P1-0").first() is None  # (a unique eq scan)
        tx.create_in(Account, P0, 1, number="P0-new")
        tx.create_in(Account, P1, 4, number="P1-new")  # (writes are not restricted)
        assert tx.count(Account) == 4 and tx.query(Account).count() == 4


def test_each_partition_once_no_double_counting(db: nonstop.Database) -> None:
    with db:
        total = 0
        seen: list[str] = []
        for scope in ([P0], [P1], [db.location]):
            with db.transaction() as tx:
                tx.restrict_to(scope)
                total += tx.count(Account)
                seen += [a.number for a in tx.query(Account).all()]
        with db.transaction() as tx:
            assert total == tx.count(Account) == 6
            assert sorted(seen) == sorted(a.number for a in tx.query(Account).all())


def test_by_ref_outside_the_scope_is_absent(db: nonstop.Database) -> None:
    with db:
        with db.transaction() as tx:
            ref = tx.ref(tx.get(Account, number="P1-0"))
        with db.transaction() as tx:
            tx.restrict_to([P0, db.location])
            assert tx.by_ref(ref) is None
            tx.restrict_to(None)
            assert tx.by_ref(ref) is not None


def test_unique_values_stay_unique_in_the_whole_store(db: nonstop.Database) -> None:
    """A create in scope of a value an out-of-scope object holds is refused, not duplicated."""
    with db, db.transaction() as tx:
        tx.restrict_to([P0])
        with pytest.raises(DuplicateKey):
            tx.get_or_create(Account, number="P1-0")


def test_async_scope(db: nonstop.Database) -> None:
    async def main() -> tuple[int, int, bool]:
        async with db.transaction() as tx:
            tx.restrict_to([P1])
            n = await tx.count(Account)
            found = await tx.query(Account).all()
            absent = await tx.find(Account, number="P0-0") is None
            return n, len(found), absent

    with db:
        assert asyncio.run(main()) == (2, 2, True)


@pytest.mark.parametrize("bad", ["default.0", -1, 1 << 64, 2.0, None])
def test_a_bad_location_is_refused_and_the_scope_unchanged(
    db: nonstop.Database, bad: object
) -> None:
    with db, db.transaction() as tx:
        with pytest.raises(BadArgument, match="location code"):
            tx.restrict_to([P0, bad])  # type: ignore[list-item]
        assert tx.scope is None and tx.count(Account) == 6
