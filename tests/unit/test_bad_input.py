"""Bad input gets a specific nonstop exception with a message that says what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest
from tests.bankmodel import Account, account_numbers, open_accounts
from tests.conftest import ROOT, child_env

import nonstop
from nonstop.model.codec import pack


class Node(nonstop.Managed, name="test_bad_input.Node"):
    name: str = nonstop.key(unique=True)
    next: Node | None = None


# ------------------------------------------------------------ objects and fields
def test_wrong_field_names(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        with pytest.raises(nonstop.FieldError, match=r"bank\.Account has no field\(s\) 'colour'"):
            tx.create(Account, number="x", colour="red")
        a = tx.create(Account, number="x")
        with pytest.raises(nonstop.FieldError, match="has no field 'colour'"):
            a.colour = "red"  # type: ignore[attr-defined]
        with pytest.raises(AttributeError):  # FieldError is also an AttributeError
            a.colour = "red"  # type: ignore[attr-defined]
        with pytest.raises(nonstop.BadArgument, match="has no field 'colour'"):
            tx.query(Account).where(colour="red")


def test_wrong_field_types(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        with pytest.raises(nonstop.FieldError, match=r"Account\.balance takes int, not str"):
            tx.create(Account, number="x", balance="lots")
        with pytest.raises(nonstop.FieldError, match=r"Account\.number takes str, not int"):
            tx.create(Account, number=5)
        with pytest.raises(nonstop.FieldError, match="needs a value for 'number'"):
            tx.create(Account)
        a = tx.create(Account, number="x")
        with pytest.raises(nonstop.FieldError, match=r"balance takes int, not bool"):
            a.balance = True
        with pytest.raises(nonstop.FieldError, match="number takes str"):
            tx.find(Account, number=b"x")
        with pytest.raises(nonstop.FieldError, match="owner takes str"):
            tx.query(Account).range("owner", 1, 2)
        assert a.balance == 0  # nothing changed by the refused writes


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"log": [object()]}, r"Mailbox\.log cannot be stored: cannot encode a object"),
        ({"log": [{1, 2}]}, r"Mailbox\.log cannot be stored: cannot encode a set"),
        ({"log": ["bad \ud800"]}, r"Mailbox\.log cannot be stored: .*surrogates"),
        ({"runs": 2**70}, r"Mailbox\.runs cannot be stored"),
    ],
)
def test_values_that_cannot_be_stored(
    db: nonstop.Database, values: dict[str, object], message: str
) -> None:
    from tests.bankmodel import Mailbox

    with pytest.raises(nonstop.FieldError, match=message), db.transaction() as tx:
        tx.create(Mailbox, name="ok")
        tx.create(Mailbox, name="bad", **values)
    with db.transaction() as tx:
        assert tx.count(Mailbox) == 0  # nothing was written
        tx.create(Mailbox, name="ok")  # and the store is fine


def test_unencodable_strings_as_keys_and_async_arguments(db: nonstop.Database) -> None:
    from tests.bankmodel import Mailbox

    with db.transaction() as tx:
        with pytest.raises(nonstop.FieldError, match="surrogate"):
            tx.create(Account, number="bad \ud800")
        with pytest.raises(nonstop.FieldError, match="surrogate"):
            tx.find(Account, number="bad \udcff")
        m = tx.create(Mailbox, name="m")
        with pytest.raises(nonstop.BadArgument, match="cannot be stored"):
            m.deliver("bad \ud800")
        with pytest.raises(nonstop.BadArgument, match="cannot be stored"):
            m.deliver(2**70)
        assert tx.count(Account) == 0


def test_writing_an_immutable_key(db: nonstop.Database) -> None:
    open_accounts(db, ["k"])
    with db.transaction() as tx:
        a = tx.get(Account, number="k")
        with pytest.raises(
            nonstop.ImmutableKey, match=r"bank\.Account\.number is an immutable key"
        ):
            a.number = "k2"
        a.owner = "fine"  # declared mutable
    with db.transaction() as tx:
        assert tx.get(Account, number="k").owner == "fine"


def test_touching_an_object_outside_its_transaction(db: nonstop.Database) -> None:
    open_accounts(db, ["o"])
    with db.transaction() as t1:
        a = t1.get(Account, number="o")
        with db.transaction() as t2:
            with pytest.raises(nonstop.ObjectNotInTransaction, match="get it again in this"):
                t2.delete(a)
            with pytest.raises(nonstop.ObjectNotInTransaction):
                t2.lock(a)
            with pytest.raises(nonstop.ObjectNotInTransaction):
                t2.ref(a)
    with pytest.raises(nonstop.ObjectNotInTransaction, match="outside its transaction"):
        _ = a.balance
    with pytest.raises(nonstop.ObjectNotInTransaction, match="outside its transaction"):
        a.balance = 1
    t3 = db.transaction().__enter__()
    with pytest.raises(nonstop.BadArgument, match="expected a managed object"):
        t3.delete("not an object")  # type: ignore[arg-type]
    t3.rollback()


def test_referring_to_an_object_of_another_transaction(db: nonstop.Database) -> None:
    with db.transaction() as t1:
        stale = t1.create(Node, name="stale")
    with db.transaction() as t2:
        with pytest.raises(nonstop.ObjectNotInTransaction):
            t2.create(Node, name="a", next=stale)
        b = t2.create(Node, name="b")
        with pytest.raises(nonstop.ObjectNotInTransaction):
            b.next = stale
        with pytest.raises(nonstop.FieldError, match=r"next takes .*Node \| None, not str"):
            b.next = "stale"  # type: ignore[assignment]
        b.next = t2.get(Node, name="stale")
    with db.transaction() as tx:
        assert tx.get(Node, name="b").next.name == "stale"  # type: ignore[union-attr]


def test_bad_lock_and_isolation_names(db: nonstop.Database) -> None:
    with pytest.raises(nonstop.BadArgument, match="isolation must be"):
        db.transaction("read-uncommitted")
    expected = "lock must be 'none', 'read' or 'write'"
    with db.transaction() as tx, pytest.raises(nonstop.BadArgument, match=expected):
        tx.find(Account, number="x", lock="exclusive")


def test_key_too_long_is_refused_before_anything_is_written(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        with pytest.raises(nonstop.KeyTooLong, match="limit is"):
            tx.create(Account, number="n" * 1000)
        assert tx.count(Account) == 0


def test_unstorable_async_argument(db: nonstop.Database) -> None:
    from tests.bankmodel import Mailbox

    with db.transaction() as tx:
        m = tx.create(Mailbox, name="m")
        with pytest.raises(nonstop.BadArgument, match="cannot be stored"):
            m.deliver(object())


# --------------------------------------------------------------- closed things
def test_using_a_closed_database(store_dir: Path) -> None:
    db = nonstop.open(store_dir)
    open_accounts(db, ["c"])
    open_tx = db.transaction().__enter__()
    a = open_tx.get(Account, number="c")
    db.close()
    with pytest.raises(nonstop.DatabaseClosed, match="is closed"), db.transaction():
        pass
    with pytest.raises(nonstop.DatabaseClosed, match="closed"):
        open_accounts(db, ["d"])
    with pytest.raises(nonstop.DatabaseClosed):
        db.wait_for_async()
    with pytest.raises(nonstop.DatabaseClosed):
        db.dead_letters()
    # a transaction that outlived its database
    with pytest.raises(nonstop.DatabaseClosed, match="was closed"):
        open_tx.find(Account, number="c")
    with pytest.raises(nonstop.DatabaseClosed):
        a.balance = 5
    with pytest.raises(nonstop.DatabaseClosed):
        open_tx.commit()
    assert isinstance(nonstop.DatabaseClosed("x"), nonstop.StoreError)
    with nonstop.open(store_dir) as again, again.transaction() as tx:
        assert tx.get(Account, number="c").balance == 1000


# ------------------------------------------------------------- store directory
def test_a_directory_already_open_in_another_process(store_dir: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys, nonstop
        db = nonstop.open({str(store_dir)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        db.close()
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with pytest.raises(
            nonstop.StoreLocked, match=f"already open in another process \\(pid {child.pid}\\)"
        ):
            nonstop.open(store_dir)
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait(30) == 0
    with nonstop.open(store_dir):  # free again once the other process is gone
        pass


def test_a_directory_of_another_format(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    env = lmdb.open(str(foreign))
    with env.begin(write=True) as txn:
        txn.put(b"user-data", b"precious")
    env.close()
    with pytest.raises(nonstop.IncompatibleStore, match="not a nonstop store"):
        nonstop.open(foreign)
    env = lmdb.open(str(foreign))
    with env.begin() as txn:  # nothing was written into it
        assert list(txn.cursor().iternext()) == [(b"user-data", b"precious")]
    env.close()


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        (["some-other-store", 1], "is a 'some-other-store' store, not a nonstop store"),
        (["nonstop-store", 99], "newer nonstop \\(store format 99"),
    ],
)
def test_a_store_of_another_kind_or_a_newer_format(
    store_dir: Path, marker: list[object], message: str
) -> None:
    nonstop.open(store_dir).close()
    env = lmdb.open(str(store_dir), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"format", pack(marker), db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(nonstop.IncompatibleStore, match=message):
        nonstop.open(store_dir)


def populated(store_dir: Path) -> Path:
    with nonstop.open(store_dir) as db:
        open_accounts(db, account_numbers(2000))
    return store_dir / "data.mdb"


def test_a_corrupt_data_file(store_dir: Path) -> None:
    data = populated(store_dir)
    with open(data, "r+b") as f:  # both meta pages destroyed
        f.write(os.urandom(2 * 4096))
    with pytest.raises(nonstop.CorruptStore, match="not a valid nonstop store"):
        nonstop.open(store_dir)


def test_a_tiny_truncated_data_file(store_dir: Path) -> None:
    data = populated(store_dir)
    os.truncate(data, 100)
    with pytest.raises(nonstop.CorruptStore, match="truncated \\(100 bytes\\)"):
        nonstop.open(store_dir)


def test_a_data_file_truncated_halfway_does_not_crash_the_process(store_dir: Path) -> None:
    data = populated(store_dir)
    os.truncate(data, data.stat().st_size // 2)
    # In a child: before the fix, reading past the end of the file killed it with SIGBUS.
    code = textwrap.dedent(
        f"""
        import nonstop
        from tests.bankmodel import Account
        try:
            db = nonstop.open({str(store_dir)!r})
            with db.transaction() as tx:
                print("opened", tx.count(Account), len(tx.extent(Account)))
        except nonstop.CorruptStore as exc:
            print("CorruptStore:", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.startswith("CorruptStore:") and "truncated" in out.stdout, out.stdout


def test_a_path_that_is_not_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(nonstop.StoreError, match="is not a directory"):
        nonstop.open(f)
    with pytest.raises(nonstop.StoreError, match="cannot create store directory"):
        nonstop.open(f / "below")
