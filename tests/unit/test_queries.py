"""Keys and queries (A4, A5 local scope, A2 extents with subtypes)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.bankmodel import Account
from tests.conftest import run_threads

import nonstop
from nonstop import Managed, key


class Item(Managed, name="test_queries.Item"):
    sku: str = key(unique=True)
    code: int = key(unique=True, default=0)
    rank: int = key(ordered=True, default=0)
    colour: str = key(default="", mutable=True)
    slot: int = key(unique=True, mutable=True, default=0)
    note: str = ""


class Special(Item, name="test_queries.Special"):
    extra: int = 0


class Event(Managed, name="test_queries.Event"):
    at: dt.datetime = key(ordered=True)
    score: float = key(ordered=True, default=0.0)


def make_items(db: nonstop.Database, ranks: list[int]) -> None:
    with db.transaction() as tx:
        for i, r in enumerate(ranks):
            cls = Special if i % 3 == 2 else Item
            tx.create(cls, sku=f"s{i}", code=i, rank=r, colour="red" if i % 2 else "blue", slot=i)


def ranks(objs: list[Item]) -> list[int]:
    return [o.rank for o in objs]


# --------------------------------------------------------------- unique keys
def test_unique_lookup_find_get_and_not_found(db: nonstop.Database) -> None:
    make_items(db, [5, 1, 3])
    with db.transaction() as tx:
        assert tx.get(Item, sku="s1").rank == 1
        assert tx.find(Item, code=2).sku == "s2"  # type: ignore[union-attr]
        assert tx.find(Item, sku="nope") is None
        with pytest.raises(nonstop.NotFound, match="no Item with sku='nope'"):
            tx.get(Item, sku="nope")
        # a subtype lookup only finds objects of the subtype
        assert tx.find(Special, sku="s0") is None
        assert isinstance(tx.find(Special, sku="s2"), Special)
        with pytest.raises(nonstop.BadArgument, match="not a unique key"):
            tx.find(Item, rank=1)
        with pytest.raises(nonstop.BadArgument, match="exactly one unique key"):
            tx.find(Item, sku="s1", code=1)


def test_duplicate_key_writes_nothing_and_the_transaction_goes_on(db: nonstop.Database) -> None:
    make_items(db, [1])
    with db.transaction() as tx:
        with pytest.raises(nonstop.DuplicateKey, match="sku = 's0' is already taken"):
            tx.create(Item, sku="s0", code=99)
        # the failed create claimed nothing: code 99 is still free in this transaction
        assert tx.find(Item, code=99) is None
        tx.create(Item, sku="fresh", code=99, slot=99)
        with pytest.raises(nonstop.DuplicateKey, match="code = 99"):
            tx.create(Item, sku="other", code=99, slot=98)  # taken inside this very transaction
    with db.transaction() as tx:
        assert tx.count(Item) == 2
        assert tx.get(Item, code=99).sku == "fresh"


def test_duplicate_key_on_a_later_key_releases_the_earlier_claims(db: nonstop.Database) -> None:
    make_items(db, [1])  # sku s0, code 0, slot 0
    with db.transaction() as tx:
        with pytest.raises(nonstop.DuplicateKey, match="code = 0"):
            tx.create(Item, sku="brand-new", code=0, slot=50)
        assert tx.find(Item, sku="brand-new") is None
        assert tx.find(Item, slot=50) is None
        tx.create(Item, sku="brand-new", code=1, slot=50)
    with db.transaction() as tx:
        assert tx.get(Item, sku="brand-new").slot == 50
        assert tx.count(Item) == 2


def test_duplicate_key_between_concurrent_creators(db: nonstop.Database) -> None:
    gate = threading.Barrier(4)

    def create(i: int) -> str:
        gate.wait()
        try:
            with db.transaction() as tx:
                tx.create(Item, sku="contested", code=100 + i, slot=100 + i)
            return "created"
        except nonstop.DuplicateKey:
            return "duplicate"

    outcomes = run_threads(4, create)
    assert sorted(outcomes) == ["created", "duplicate", "duplicate", "duplicate"]
    with db.transaction() as tx:
        assert tx.count(Item) == 1
        assert len(tx.query(Item).where(sku="contested").all()) == 1


def test_immutable_keys_refuse_changes_mutable_keys_move_their_index(db: nonstop.Database) -> None:
    make_items(db, [1, 2])
    with db.transaction() as tx:
        a = tx.get(Item, sku="s0")
        with pytest.raises(nonstop.ImmutableKey, match=r"Item\.sku is an immutable key"):
            a.sku = "changed"
        with pytest.raises(nonstop.ImmutableKey):
            a.rank = 7
        a.colour = "green"  # mutable non-unique
        a.slot = 40  # mutable unique
        # read your own writes through the indexes
        assert tx.find(Item, slot=40) == a
        assert tx.find(Item, slot=0) is None
        assert [i.sku for i in tx.query(Item).where(colour="green").all()] == ["s0"]
        assert tx.query(Item).where(colour="blue").all() == []
        new = tx.create(Item, sku="n", code=77, slot=0)  # the old value is free again
        new.sku = "n2"  # keys of an object created in this transaction may still change
        new.rank = 9
    with db.transaction() as tx:
        assert tx.get(Item, slot=40).sku == "s0"
        assert tx.get(Item, slot=0).sku == "n2"
        assert tx.find(Item, sku="n") is None
        assert [i.sku for i in tx.query(Item).where(colour="green").all()] == ["s0"]
        assert [i.sku for i in tx.query(Item).where(colour="blue").all()] == []
        assert [i.sku for i in tx.query(Item).where(rank=9).all()] == ["n2"]


@pytest.mark.parametrize("load_order", ["mover_first", "holder_first"])
def test_unique_value_handed_from_one_object_to_another(
    db: nonstop.Database, load_order: str
) -> None:
    with db.transaction() as tx:
        tx.create(Item, sku="a", code=1, slot=1)
        tx.create(Item, sku="b", code=2, slot=2)
    with db.transaction() as tx:
        if load_order == "mover_first":
            a = tx.get(Item, sku="a")
            b = tx.get(Item, sku="b")
        else:
            b = tx.get(Item, sku="b")
            a = tx.get(Item, sku="a")
        b.slot = 3  # b frees slot 2 ...
        a.slot = 2  # ... and a takes it
    with db.transaction() as tx:
        assert tx.get(Item, slot=2).sku == "a"
        assert tx.get(Item, slot=3).sku == "b"
        assert tx.find(Item, slot=1) is None


def test_unique_values_swapped_between_two_objects(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Item, sku="a", code=1, slot=1)
        tx.create(Item, sku="b", code=2, slot=2)
    with db.transaction() as tx:
        a, b = tx.get(Item, sku="a"), tx.get(Item, sku="b")
        b.slot = 99
        a.slot = 2
        b.slot = 1
    with db.transaction() as tx:
        assert tx.get(Item, slot=1).sku == "b"
        assert tx.get(Item, slot=2).sku == "a"
        assert tx.find(Item, slot=99) is None


def test_created_object_takes_a_value_another_object_gives_up(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Item, sku="old", slot=1)
    with db.transaction() as tx:
        fresh = tx.create(Item, sku="fresh", code=1, slot=50)
        tx.get(Item, sku="old").slot = 2
        fresh.slot = 1
    with db.transaction() as tx:
        assert tx.get(Item, slot=1).sku == "fresh"
        assert tx.get(Item, slot=2).sku == "old"


def test_delete_then_recreate_a_unique_value(db: nonstop.Database) -> None:
    make_items(db, [1])
    with db.transaction() as tx:
        old = tx.get(Item, sku="s0")
        tx.delete(old)
        with pytest.raises(nonstop.Deleted, match="already deleted"):
            tx.delete(old)
        with pytest.raises(nonstop.Deleted, match="deleted in this transaction"):
            _ = old.rank
        assert tx.find(Item, sku="s0") is None
        again = tx.create(Item, sku="s0", code=0, slot=0, rank=42)
        assert tx.get(Item, sku="s0") == again
        gone = tx.create(Item, sku="tmp", code=5, slot=5)
        tx.delete(gone)  # created and deleted: never written
    with db.transaction() as tx:
        assert tx.count(Item) == 1
        assert tx.get(Item, code=0).rank == 42
        assert tx.find(Item, sku="tmp") is None
        assert [i.rank for i in tx.query(Item).order_by("rank").all()] == [42]


# ----------------------------------------------------- non-unique and ordered
def test_non_unique_iteration_and_cardinality(db: nonstop.Database) -> None:
    make_items(db, [1, 2, 3, 4, 5, 6, 7])
    with db.transaction() as tx:
        reds = tx.query(Item).where(colour="red").all()
        assert sorted(i.sku for i in reds) == ["s1", "s3", "s5"]
        assert tx.query(Item).where(colour="red").count() == 3
        assert tx.query(Special).where(colour="red").count() == 1  # s5
        assert tx.query(Item).where(colour="red", rank=4).count() == 1
        assert tx.query(Item).where(note="").count() == 7  # a non-key field: extent scan
        assert tx.query(Item).filter(lambda i: i.rank % 2 == 0).count() == 3
        assert tx.query(Item).where(colour="purple").all() == []


def test_ordered_iteration_both_directions_and_limits(db: nonstop.Database) -> None:
    make_items(db, [5, 3, 9, 1, 7, 3])
    with db.transaction() as tx:
        assert ranks(tx.query(Item).order_by("rank").all()) == [1, 3, 3, 5, 7, 9]
        assert ranks(tx.query(Item).order_by("rank", descending=True).all()) == [9, 7, 5, 3, 3, 1]
        assert ranks(tx.query(Item).order_by("rank").limit(2).all()) == [1, 3]
        assert tx.query(Item).order_by("rank", descending=True).first().rank == 9  # type: ignore[union-attr]
        assert tx.query(Item).limit(0).all() == []
        assert ranks(tx.query(Special).order_by("rank").all()) == [3, 9]
        with pytest.raises(nonstop.BadArgument, match="not a key"):
            tx.query(Item).order_by("note")
        # key() documents that range() and order_by() check the ordered flag
        with pytest.raises(nonstop.BadArgument, match=r"Item\.colour is not an ordered key"):
            tx.query(Item).range("colour", "a", "z")
        with pytest.raises(nonstop.BadArgument, match="not an ordered key"):
            tx.query(Item).order_by("sku")
        with pytest.raises(nonstop.BadArgument, match="no field"):
            tx.query(Item).where(nothing=1)
        with pytest.raises(nonstop.BadArgument, match="limit"):
            tx.query(Item).limit(-1)


@pytest.mark.parametrize(
    ("lo", "hi", "inclusive", "expected"),
    [
        (3, 7, (True, False), [3, 3, 5]),
        (3, 7, (True, True), [3, 3, 5, 7]),
        (3, 7, (False, True), [5, 7]),
        (3, 7, (False, False), [5]),
        (None, 5, (True, False), [1, 3, 3]),
        (5, None, (False, True), [7, 9]),
        (4, 4, (True, True), []),
        (10, 20, (True, True), []),
        (None, None, (True, True), [1, 3, 3, 5, 7, 9]),
    ],
)
def test_range_queries(
    db: nonstop.Database, lo: Any, hi: Any, inclusive: tuple[bool, bool], expected: list[int]
) -> None:
    make_items(db, [5, 3, 9, 1, 7, 3])
    with db.transaction() as tx:
        q = tx.query(Item).range("rank", lo, hi, inclusive=inclusive)
        assert ranks(q.all()) == expected
        assert q.count() == len(expected)
        down = tx.query(Item).range("rank", lo, hi, inclusive=inclusive)
        assert ranks(down.order_by("rank", descending=True).all()) == expected[::-1]


def test_range_on_one_key_with_equality_on_another(db: nonstop.Database) -> None:
    make_items(db, [5, 3, 9, 1, 7, 3])  # colours alternate blue, red, blue, red, blue, red
    with db.transaction() as tx:
        q = tx.query(Item).where(colour="blue").range("rank", 6, None)
        assert sorted(ranks(q.all())) == [7, 9]
        assert tx.query(Item).where(colour="blue").range("rank", 6, None).count() == 2
        assert tx.query(Item).where(colour="red").range("rank", None, 3).count() == 1


def test_range_over_datetimes_and_floats(db: nonstop.Database) -> None:
    base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    with db.transaction() as tx:
        for i, score in enumerate([-2.5, 0.0, 1e-9, 3.25, -1e300, 7.0]):
            tx.create(Event, at=base + dt.timedelta(hours=i), score=score)
    with db.transaction() as tx:
        got = (
            tx.query(Event)
            .range("at", base + dt.timedelta(hours=1), base + dt.timedelta(hours=3))
            .all()
        )
        assert [e.score for e in got] == [0.0, 1e-9]
        scores = [
            e.score for e in tx.query(Event).range("score", -3, 3.25, inclusive=(False, True)).all()
        ]
        assert scores == [-2.5, 0.0, 1e-9, 3.25]
        assert [
            e.score for e in tx.query(Event).order_by("score", descending=True).limit(2).all()
        ] == [7.0, 3.25]


def test_queries_see_this_transactions_own_writes(db: nonstop.Database) -> None:
    make_items(db, [1, 2, 3, 4])
    with db.transaction() as tx:
        tx.create(Item, sku="new", code=50, rank=25, colour="red", slot=50)
        tx.delete(tx.get(Item, sku="s0"))  # rank 1
        tx.get(Item, sku="s1").colour = "blue"
        assert ranks(tx.query(Item).order_by("rank").all()) == [2, 3, 4, 25]
        assert ranks(tx.query(Item).range("rank", 2, 4).all()) == [2, 3]
        assert ranks(tx.query(Item).order_by("rank", descending=True).all()) == [25, 4, 3, 2]
        assert sorted(i.sku for i in tx.query(Item).where(colour="red").all()) == ["new", "s3"]
        assert tx.query(Item).where(colour="red").count() == 2
        assert tx.query(Item).count() == 4 == tx.count(Item) == len(tx.extent(Item))
        assert tx.find(Item, sku="s0") is None
        assert tx.get(Item, code=50).sku == "new"
    with db.transaction() as tx:
        assert tx.count(Item) == 4


# ----------------------------------------------------------------- extents
def test_extents_include_subtypes(db: nonstop.Database) -> None:
    make_items(db, [1, 2, 3, 4, 5, 6])
    with db.transaction() as tx:
        assert tx.count(Item) == 6 == len(tx.extent(Item))
        specials = tx.extent(Special)
        assert tx.count(Special) == 2 == len(specials)
        assert all(isinstance(s, Special) for s in specials)
        assert sum(isinstance(i, Special) for i in tx.extent(Item)) == 2
        specials[0].extra = 5
    with db.transaction() as tx:
        assert sorted(s.extra for s in tx.extent(Special)) == [0, 5]


def test_extents_are_read_committed_under_serializable(db: nonstop.Database) -> None:
    make_items(db, [1])
    with db.transaction() as tx:
        assert tx.count(Item) == 1
        with db.transaction() as other:
            other.create(Item, sku="late", code=7, slot=7)
        assert tx.count(Item) == 2
        assert {i.sku for i in tx.extent(Item)} == {"s0", "late"}


def test_snapshot_extents_counts_and_lookups_see_one_state(db: nonstop.Database) -> None:
    """A snapshot transaction reads from the view pinned at its first read: a commit made
    after it is invisible to its counts, extents, queries and lookups alike."""
    make_items(db, [1])
    with db.transaction("snapshot") as tx:
        assert tx.count(Item) == 1
        with db.transaction() as other:
            other.create(Item, sku="late", code=7, slot=7)
            other.get(Item, sku="s0").note = "changed"
        assert tx.count(Item) == 1
        assert {i.sku for i in tx.extent(Item)} == {"s0"}
        assert tx.find(Item, sku="late") is None
        assert tx.find(Item, sku="s0").note == ""  # type: ignore[union-attr]
        assert tx.query(Item).count() == 1
    with db.transaction("snapshot") as tx:  # a new snapshot sees the commit
        assert tx.count(Item) == 2


def test_snapshot_reads_a_type_first_touched_after_its_view_was_pinned(
    store_dir: Any,
) -> None:
    """LMDB lets a read transaction use only the database handles opened before it began.
    A reopened store opens its existing indexes at once, so a snapshot that touches a
    type for the first time in this process after its view was pinned still reads its
    index; a type whose index did not exist at all when the view was pinned is a
    retryable Conflict, which a replay (``@transactional``) answers from a new view."""
    first = nonstop.open(store_dir, durability="none")
    make_items(first, [1])
    first.close()
    db = nonstop.open(store_dir, durability="none")
    try:
        with db.transaction("snapshot") as tx:
            assert tx.count(Account) == 0  # pins the view
            assert tx.find(Item, sku="s0") is not None  # Item's index opened after the pin
        conflict = pytest.raises(nonstop.Conflict, match="created after this snapshot")
        with conflict, db.transaction("snapshot") as tx:
            assert tx.count(Account) == 0
            tx.query(Event).range("score", 0.0, 9.0).all()  # index created after the pin

        @nonstop.transactional(isolation="snapshot")
        def events(tx: nonstop.Transaction) -> int:
            tx.count(Account)
            return len(tx.query(Event).range("at", None, None).all())

        assert events(db) == 0
    finally:
        db.close()


def test_snapshot_locked_read_of_an_object_changed_since_the_view_conflicts(
    db: nonstop.Database,
) -> None:
    make_items(db, [1, 2])
    conflict = pytest.raises(nonstop.Conflict, match="changed since this snapshot")
    with conflict, db.transaction("snapshot") as tx:
        assert tx.find(Item, sku="s0").note == ""  # type: ignore[union-attr]  # view pinned
        with db.transaction() as other:
            other.get(Item, sku="s1").note = "changed"
        tx.find(Item, sku="s1", lock="write")  # latest != view: no read skew


# ------------------------------------------------------------ get_or_create
def test_get_or_create_returns_existing_or_new(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        a, created = tx.get_or_create(Account, number="X", defaults={"balance": 5})
        assert created and a.balance == 5
        b, created = tx.get_or_create(Account, number="X", defaults={"balance": 9})
        assert not created and b == a
    with db.transaction() as tx:
        c, created = tx.get_or_create(Account, number="X")
        assert not created and c.balance == 5


@pytest.mark.timeout(60)
def test_get_or_create_is_atomic_under_concurrency(db: nonstop.Database) -> None:
    n = 8
    gate = threading.Barrier(n)

    @nonstop.transactional
    def claim(tx: nonstop.Transaction, i: int) -> bool:
        acct, created = tx.get_or_create(Account, number="shared", defaults={"balance": 0})
        time.sleep(0.005)
        acct.balance += 1
        return created

    def run(i: int) -> bool:
        gate.wait()
        return claim(db, i)

    created = run_threads(n, run)
    assert created.count(True) == 1
    with db.transaction() as tx:
        assert tx.count(Account) == 1
        assert tx.get(Account, number="shared").balance == n


async def test_get_or_create_in_async_tasks(db: nonstop.Database) -> None:
    import asyncio

    @nonstop.transactional
    async def claim(tx: nonstop.AsyncTransaction) -> bool:
        acct, created = await tx.get_or_create(Account, number="shared")
        await asyncio.sleep(0.001)
        acct.balance += 1
        return created

    created = await asyncio.gather(*(claim(db) for _ in range(10)))
    assert created.count(True) == 1
    async with db.transaction() as tx:
        assert (await tx.get(Account, number="shared")).balance == 10
        assert await tx.count(Account) == 1


# ------------------------------------------------------------- lock modes
def lock_of(db: nonstop.Database, tx: nonstop.Transaction, obj: Managed) -> Any:
    return db.engine.locks.mode_held(tx.id, tx.ref(obj).raw)


def test_query_lock_modes(db: nonstop.Database) -> None:
    from nonstop.tx.locks import LockMode

    make_items(db, [1, 2])
    with db.transaction() as tx:
        none = tx.query(Item).where(sku="s0").lock("none").all()[0]
        assert lock_of(db, tx, none) is None
        read = tx.query(Item).where(sku="s1").all()[0]  # serializable default: read
        assert lock_of(db, tx, read) is LockMode.READ
        write = tx.query(Item).order_by("rank").lock("write").all()
        assert all(lock_of(db, tx, o) is LockMode.WRITE for o in write)
        with pytest.raises(nonstop.BadArgument, match="lock must be"):
            tx.query(Item).lock("exclusive")
    with db.transaction("snapshot") as tx:
        o = tx.query(Item).all()[0]  # snapshot default: no lock
        assert lock_of(db, tx, o) is None
        o2 = tx.find(Item, sku="s1", lock="write")
        assert lock_of(db, tx, o2) is LockMode.WRITE  # type: ignore[arg-type]


def test_lock_none_reads_do_not_wait_and_locked_reads_do(db: nonstop.Database) -> None:
    make_items(db, [1])
    holder = db.transaction().__enter__()
    holder.get(Item, sku="s0", lock="write").note = "uncommitted"
    try:
        with db.transaction("snapshot", lock_timeout=0.1) as tx:
            # snapshot, lock none: the last committed state at once, never the buffered write
            assert tx.query(Item).all()[0].note == ""
            assert tx.find(Item, sku="s0").note == ""  # type: ignore[union-attr]
        with pytest.raises(nonstop.LockTimeout), db.transaction(lock_timeout=0.1) as tx:
            # serializable, lock none: the query itself takes no lock ...
            (found,) = tx.query(Item).lock("none").all()
            assert tx.find(Item, sku="s0", lock="none") == found
            _ = found.note  # ... but reading the object does (serializable)
        with pytest.raises(nonstop.LockTimeout), db.transaction(lock_timeout=0.1) as tx:
            tx.query(Item).lock("read").all()
    finally:
        holder.commit()
    with db.transaction() as tx:
        assert tx.get(Item, sku="s0").note == "uncommitted"


def test_absent_key_stays_absent_under_a_locked_lookup(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        assert tx.find(Account, number="ghost", lock="read") is None

        def creator() -> str:
            try:
                with db.transaction(lock_timeout=0.2) as other:
                    other.create(Account, number="ghost")
                return "created"
            except nonstop.LockTimeout:
                return "blocked"

        assert run_threads(1, lambda _: creator()) == ["blocked"]
        assert tx.find(Account, number="ghost") is None


# ---------------------------------------------- range queries vs a naive filter
_owners = st.text(alphabet="abc\x00", max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    committed=st.lists(_owners, max_size=8),
    changes=st.lists(st.tuples(st.sampled_from(["create", "move", "delete"]), _owners), max_size=5),
    lo=st.none() | _owners,
    hi=st.none() | _owners,
    inclusive=st.tuples(st.booleans(), st.booleans()),
    descending=st.booleans(),
)
def test_range_queries_match_a_naive_filter(
    tmp_path_factory: pytest.TempPathFactory,
    committed: list[str],
    changes: list[tuple[str, str]],
    lo: str | None,
    hi: str | None,
    inclusive: tuple[bool, bool],
    descending: bool,
) -> None:
    db = nonstop.open(tmp_path_factory.mktemp("range"), durability="none")
    try:
        model: dict[str, str] = {}
        with db.transaction() as tx:
            for i, owner in enumerate(committed):
                tx.create(Account, number=f"c{i}", owner=owner)
                model[f"c{i}"] = owner
        with db.transaction() as tx:
            for j, (kind, owner) in enumerate(changes):
                if kind == "create" or not model:
                    tx.create(Account, number=f"n{j}", owner=owner)
                    model[f"n{j}"] = owner
                    continue
                number = sorted(model)[j % len(model)]
                if kind == "move":
                    tx.get(Account, number=number).owner = owner
                    model[number] = owner
                else:
                    tx.delete(tx.get(Account, number=number))
                    del model[number]

            def wanted(o: str) -> bool:
                if lo is not None and (o < lo or (o == lo and not inclusive[0])):
                    return False
                return not (hi is not None and (o > hi or (o == hi and not inclusive[1])))

            expected = sorted((o for o in model.values() if wanted(o)), reverse=descending)
            q = tx.query(Account).range("owner", lo, hi, inclusive=inclusive)
            got = [a.owner for a in q.order_by("owner", descending=descending).all()]
            assert got == expected
            assert tx.query(Account).range("owner", lo, hi, inclusive=inclusive).count() == len(
                expected
            )
    finally:
        db.close()


async def test_async_queries_count_range_order_and_own_writes(db: nonstop.Database) -> None:
    make_items(db, [5, 3, 9, 1, 7, 3])
    async with db.transaction() as tx:
        await tx.create(Item, sku="x", code=60, rank=4, colour="blue", slot=60)
        q = tx.query(Item).where(colour="blue").range("rank", 6, None)
        assert sorted(ranks(await q.all())) == [7, 9]
        assert await tx.query(Item).where(colour="blue").range("rank", 6, None).count() == 2
        down = tx.query(Item).range("rank", 3, 7).order_by("rank", descending=True)
        assert ranks(await down.all()) == [5, 4, 3, 3]
        assert ranks([i async for i in tx.query(Item).order_by("rank").limit(2)]) == [1, 3]
        assert (await tx.query(Item).order_by("rank").first()).rank == 1  # type: ignore[union-attr]
        assert len(await tx.extent(Special)) == 2
