"""The engine seam: what bulk operations and the participant use instead of privates."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from tests.bankmodel import Account

import nonstop
import nonstop.database
from nonstop.model.codec import encode_key
from nonstop.model.managed import registered_type, registered_types, type_info
from nonstop.model.ref import Ref
from nonstop.tx.database import Database
from nonstop.tx.entries import TxState

SRC = Path(nonstop.__file__).parent


@pytest.fixture
def db(tmp_path: Path):
    database = nonstop.open(tmp_path / "store", lock_timeout=0.5)
    yield database
    database.close()


def test_the_old_import_path_is_the_same_database() -> None:
    assert nonstop.database.Database is Database is nonstop.Database
    assert nonstop.database.open is nonstop.open


def test_every_transaction_runs_on_its_databases_engine(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        assert tx.engine is db.engine
        assert tx.state is TxState.ACTIVE
    assert tx.state is TxState.COMMITTED
    db.close()
    with pytest.raises(nonstop.DatabaseClosed):
        db.engine.check_open()


def test_has_changes_follows_writes_raw_writes_and_the_end(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Account, number="A", balance=1)
    bulk = db.engine.store.index_db(b"bulk", unique=True)
    with db.transaction() as tx:
        a = tx.get(Account, number="A")
        assert not tx.has_changes()  # a read changes nothing
        a.balance += 1
        assert tx.has_changes()
        assert [e.ref for e in tx.entries()] == [tx.ref(a).raw]
        assert tx.entry(tx.ref(a).raw) is tx.entry_of(a)
    assert not tx.has_changes()  # committed: nothing left to write
    with db.transaction() as tx:
        tx.write_raw([(True, bulk, b"k", b"v")])
        assert tx.has_changes()


def test_raw_writes_commit_with_the_transaction_or_not_at_all(db: nonstop.Database) -> None:
    bulk = db.engine.store.index_db(b"bulk", unique=True)
    with db.transaction() as tx:
        tx.write_raw([(True, bulk, b"kept", b"1")])
    with db.transaction() as tx:
        tx.write_raw([(True, bulk, b"dropped", b"2")])
        tx.rollback()
    assert db.engine.get_raw(bulk, b"kept") == b"1"
    assert db.engine.get_raw(bulk, b"dropped") is None


def test_a_bulk_create_claims_a_value_seen_free_and_inserts(db: nonstop.Database) -> None:
    info = db.engine.ensure_type(Account)
    key = info.keys["number"]
    with db.transaction() as tx:
        tx.create(Account, number="taken")
    seen_at = db.engine.store.commit_seq
    with db.transaction() as tx:
        # A value committed before the read is not free (the read was stale: re-checked).
        assert tx.drive(tx.g_claim_absent(key, encode_key("taken"), seen_at - 1)) is False
        kb = encode_key("new")
        assert tx.drive(tx.g_claim_absent(key, kb, seen_at)) is True
        state = {"number": "new", "owner": "", "balance": 7}
        e = tx.drive(tx.g_insert(info, state, claimed=(key, kb)))
        assert tx.entry(e.ref) is e and e.handle.balance == 7
        assert tx.drive(tx.g_claim_absent(key, kb, seen_at)) is False  # ours now
        with pytest.raises(nonstop.DuplicateKey):
            tx.create(Account, number="new")
    with db.transaction() as tx:
        assert tx.get(Account, number="new").balance == 7


def test_registered_types_name_the_classes_this_process_defines() -> None:
    name = type_info(Account).name
    assert registered_type(name) is Account
    assert registered_types()[name] is Account
    assert registered_type("no.such.Type") is None
    registered_types().clear()  # a copy: the registry itself is untouched
    assert registered_type(name) is Account


def _private_accesses(path: Path) -> list[str]:
    """``x._name`` with x not self/cls, and ``from nonstop... import _name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if node.attr.startswith("__") and node.attr.endswith("__"):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nonstop"):
            found += [
                f"{path.name}:{node.lineno}: {a.name}" for a in node.names if a.name[0] == "_"
            ]
    return found


def test_bulk_operations_and_the_participant_use_only_public_seams() -> None:
    files = [*sorted((SRC / "bulk").glob("*.py")), SRC / "dataplane" / "participant.py"]
    assert [hit for f in files for hit in _private_accesses(f)] == []


def test_tx_imports_nothing_from_the_root_package_but_errors() -> None:
    # nonstop/__init__ imports nonstop.tx: an import back would be a package cycle.
    for path in sorted((SRC / "tx").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                parts = node.module.split(".")
                if parts[0] == "nonstop":
                    assert len(parts) > 1 and parts[1] in ("tx", "store", "model", "errors"), (
                        f"{path.name} imports {node.module}"
                    )


class Card(nonstop.Managed, name="test_engine_seam.Card"):
    tag: str = nonstop.key(unique=True)
    holder: Account | None = None


def test_a_query_takes_a_reference_as_such_and_tells_its_order(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        a = tx.create(Account, number="A")
        ref = tx.ref(a)
        tx.create(Card, tag="c1", holder=a)
        tx.create(Card, tag="c2")
    with db.transaction() as tx:
        q = tx.query(Card).where_ref(holder=ref)
        assert q.ordering is None
        assert [c.tag for c in q.all()] == ["c1"]
        assert tx.query(Card).where_ref(holder=Ref.parse(str(ref))).count() == 1
        assert tx.query(Account).order_by("owner", descending=True).ordering == ("owner", True)
        with pytest.raises(nonstop.BadArgument):
            tx.query(Card).where_ref(nowhere=ref)
