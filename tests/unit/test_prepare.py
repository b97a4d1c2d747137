"""Two-phase commit on one participant (B6/B9 groundwork): prepare, phase two, recovery.

A prepared transaction has voted yes: its write set is durable but not applied,
and it keeps its write locks until the outcome arrives — across a crash too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.bankmodel import Account

import nonstop


def _balances(db: nonstop.Database) -> dict[str, int]:
    with db.transaction(isolation="snapshot") as tx:
        return {a.number: a.balance for a in tx.query(Account).all()}


@pytest.fixture
def db(tmp_path: Path):
    database = nonstop.open(tmp_path / "store", lock_timeout=0.2)
    with database.transaction() as tx:
        tx.create(Account, number="A", balance=100)
        tx.create(Account, number="B", balance=0)
    yield database
    database.close()


def _prepare_transfer(db: nonstop.Database, gtid: bytes) -> nonstop.Transaction:
    tx = db.transaction().__enter__()
    a = tx.get(Account, number="A", lock="write")
    b = tx.get(Account, number="B", lock="write")
    a.balance -= 30
    b.balance += 30
    assert tx.prepare(gtid) is True
    return tx


def test_prepared_writes_are_invisible_and_locked_until_commit(db: nonstop.Database) -> None:
    tx = _prepare_transfer(db, b"g1")
    assert db.in_doubt() == [b"g1"]
    assert _balances(db) == {"A": 100, "B": 0}  # durable but not applied
    with pytest.raises(nonstop.LockTimeout), db.transaction() as other:
        other.get(Account, number="A", lock="write")
    tx.commit_prepared()
    assert _balances(db) == {"A": 70, "B": 30}
    assert db.in_doubt() == []
    with db.transaction() as other:  # locks released
        other.get(Account, number="A", lock="write").balance += 1


def test_abort_prepared_leaves_nothing(db: nonstop.Database) -> None:
    _prepare_transfer(db, b"g2")
    assert db.resolve(b"g2", commit=False) is True
    assert db.resolve(b"g2", commit=False) is False  # idempotent
    assert db.resolve(b"g2", commit=True) is False  # an outcome never flips
    assert _balances(db) == {"A": 100, "B": 0}
    with db.transaction() as other:
        other.get(Account, number="B", lock="write").balance += 5
    assert _balances(db) == {"A": 100, "B": 5}


def test_read_only_participant_needs_no_phase_two(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        assert tx.get(Account, number="A").balance == 100
        assert tx.prepare(b"ro") is False
        assert not tx.active
    assert db.in_doubt() == []


def test_prepare_failure_in_notifier_rolls_back(db: nonstop.Database) -> None:
    def veto() -> None:
        raise nonstop.Abort("external resource said no")

    with pytest.raises(nonstop.Abort), db.transaction() as tx:
        tx.get(Account, number="A", lock="write").balance = 1
        tx.on_prepare(veto)
        tx.prepare(b"veto")
    assert db.in_doubt() == []
    assert _balances(db)["A"] == 100


def test_exception_after_prepare_aborts(db: nonstop.Database) -> None:
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.get(Account, number="A", lock="write").balance = 1
        tx.prepare(b"boom")
        raise RuntimeError("coordinator decided to abort")
    assert db.in_doubt() == []
    assert _balances(db)["A"] == 100


def test_async_prepare_and_commit(db: nonstop.Database) -> None:
    async def run() -> None:
        async with db.transaction() as tx:
            a = await tx.get(Account, number="A", lock="write")
            a.balance = 7
            assert await tx.prepare(b"ga") is True
        assert db.in_doubt() == [b"ga"]
        await tx.commit_prepared()

    asyncio.run(run())
    assert _balances(db)["A"] == 7
    assert db.in_doubt() == []


CHILD = textwrap.dedent(
    """
    import os, sys
    import nonstop
    from tests.bankmodel import Account
    db = nonstop.open(sys.argv[1])
    tx = db.transaction().__enter__()
    a = tx.get(Account, number="A", lock="write")
    a.balance -= 40
    tx.create(Account, number="C", balance=40)
    tx.prepare(b"crash-1")
    print("prepared", flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


@pytest.mark.parametrize("outcome", [True, False])
@pytest.mark.timeout(60)
def test_prepared_transaction_survives_sigkill(tmp_path: Path, outcome: bool) -> None:
    path = tmp_path / "store"
    with nonstop.open(path) as db, db.transaction() as tx:
        tx.create(Account, number="A", balance=100)
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"prepared"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
    db = nonstop.open(path, lock_timeout=0.2)
    try:
        assert db.in_doubt() == [b"crash-1"]
        assert _balances(db) == {"A": 100}  # in doubt: not applied ...
        with pytest.raises(nonstop.LockTimeout), db.transaction() as tx:
            tx.get(Account, number="A", lock="write")  # ... and still locked
        with pytest.raises(nonstop.LockTimeout), db.transaction() as tx:
            tx.create(Account, number="C")  # the unique key it claimed too
        assert db.resolve(b"crash-1", commit=outcome) is True
        expected = {"A": 60, "C": 40} if outcome else {"A": 100}
        assert _balances(db) == expected
        with db.transaction() as tx:
            assert tx.count(Account) == len(expected)
            tx.get(Account, number="A", lock="write").balance += 0  # unlocked now
    finally:
        db.close()
    with nonstop.open(path) as db:  # the outcome is durable, nothing left in doubt
        assert db.in_doubt() == []
        assert _balances(db) == expected
