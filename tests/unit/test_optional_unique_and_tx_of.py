"""Optional unique keys (None is not indexed), transaction_of, and a failed open's cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest

import nonstop
from nonstop.model.codec import pack


class Member(nonstop.Managed, name="tests.optional.Member"):
    email: str | None = nonstop.key(unique=True, ordered=True, mutable=True, default=None)
    name: str = ""


class Parent(nonstop.Managed, name="tests.optional.Parent"):
    name: str = nonstop.key(unique=True)
    children: int = 0

    @nonstop.asynchronous
    def adopt(self, child: str) -> None:
        tx = nonstop.transaction_of(self)  # an async method reaches its transaction
        tx.create(Child, name=child, parent=self.name)
        self.children += 1


class Child(nonstop.Managed, name="tests.optional.Child"):
    name: str = nonstop.key(unique=True)
    parent: str = ""


@pytest.fixture
def db(tmp_path: Path):
    database = nonstop.open(tmp_path / "store")
    yield database
    database.close()


def test_many_objects_may_leave_an_optional_unique_key_unset(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Member, name="a")
        tx.create(Member, name="b")
        tx.create(Member, name="c", email="c@x")
        assert tx.find(Member, email=None) is None  # None is not a key value
    with db.transaction() as tx:
        assert tx.count(Member) == 3
        assert [m.name for m in tx.query(Member).where(email=None).all()] == ["a", "b"]
        assert [m.name for m in tx.query(Member).order_by("email").all()] == ["c"]
        b = tx.query(Member).where(name="b").first()
        assert b is not None
        b.email = "b@x"  # set it: now indexed and unique
    with db.transaction() as tx:
        assert tx.get(Member, email="b@x").name == "b"
        with pytest.raises(nonstop.DuplicateKey):
            tx.create(Member, name="d", email="b@x")
        tx.get(Member, email="c@x").email = None  # unset again: leaves the index
    with db.transaction() as tx:
        assert tx.find(Member, email="c@x") is None
        tx.create(Member, name="e", email="c@x")  # the value is free again
        assert tx.query(Member).where(email=None).count() == 2


def test_delete_of_object_with_unset_unique_key(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Member, name="gone")
    with db.transaction() as tx:
        tx.delete(tx.query(Member).where(name="gone").first())
    with db.transaction() as tx:
        assert tx.count(Member) == 0


def test_transaction_of_lets_async_methods_create_objects(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        p = tx.create(Parent, name="p")
        assert nonstop.transaction_of(p) is tx
        p.adopt("kid-1")
        p.adopt("kid-2")
    assert db.wait_for_async(30)
    with db.transaction() as tx:
        assert tx.get(Parent, name="p").children == 2
        assert sorted(c.name for c in tx.query(Child).all()) == ["kid-1", "kid-2"]
    with pytest.raises(nonstop.ObjectNotInTransaction):
        nonstop.transaction_of(p)  # its transaction has ended
    with pytest.raises(nonstop.BadArgument):
        nonstop.transaction_of("not an object")  # type: ignore[arg-type]


def test_failed_open_releases_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with nonstop.open(path) as db, db.transaction() as tx:
        tx.create(Member, name="x")
    # Damage a prepared-transaction record so that recovery fails during open.
    import lmdb

    env = lmdb.open(str(path), max_dbs=512)
    with env.begin(write=True) as txn:
        txn.put(b"broken", pack({"ops": "nonsense"}), db=env.open_db(b"prepared", txn=txn))
    env.close()
    with pytest.raises(Exception):  # noqa: B017 - any error; what matters is what follows
        nonstop.open(path)
    # The failed open must not keep the directory locked in this process.
    env = lmdb.open(str(path), max_dbs=512)
    with env.begin(write=True) as txn:
        txn.delete(b"broken", db=env.open_db(b"prepared", txn=txn))
    env.close()
    with nonstop.open(path) as db, db.transaction() as tx:
        assert tx.count(Member) == 1
