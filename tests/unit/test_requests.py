"""Exactly-once requests (H1): a retried request returns the first result, never runs twice."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
from tests.bankmodel import Account

import nonstop


@pytest.fixture
def db(tmp_path: Path):
    database = nonstop.open(tmp_path / "store")
    with database.transaction() as tx:
        tx.create(Account, number="A", balance=100)
        tx.create(Account, number="B", balance=0)
    yield database
    database.close()


def transfer(tx: nonstop.Transaction, amount: int) -> dict[str, int]:
    a = tx.get(Account, number="A", lock="write")
    b = tx.get(Account, number="B", lock="write")
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
    return {"A": a.balance, "B": b.balance}


def balances(db: nonstop.Database) -> tuple[int, int]:
    with db.transaction() as tx:
        return tx.get(Account, number="A").balance, tx.get(Account, number="B").balance


def test_retry_returns_first_result_without_running_again(db: nonstop.Database) -> None:
    first = nonstop.run_request(db, "client-1", 1, transfer, 10)
    again = nonstop.run_request(db, "client-1", 1, transfer, 10)
    assert first == again == {"A": 90, "B": 10}
    assert balances(db) == (90, 10)  # applied once
    nonstop.run_request(db, "client-1", 2, transfer, 10)  # a new request runs
    assert balances(db) == (80, 20)
    nonstop.run_request(db, "client-2", 1, transfer, 5)  # same seq, other client: runs
    assert balances(db) == (75, 25)


def test_aborted_request_is_remembered_with_no_effects(db: nonstop.Database) -> None:
    def move_then_abort(tx: nonstop.Transaction) -> None:
        tx.get(Account, number="A", lock="write").balance = 0
        tx.create(Account, number="ghost")
        raise nonstop.Abort("changed my mind")

    with pytest.raises(nonstop.Abort, match="changed my mind"):
        nonstop.run_request(db, "c", 7, move_then_abort)
    assert balances(db) == (100, 0)
    # Funds or state changing later does not turn the recorded abort into a success.
    with pytest.raises(nonstop.Abort, match="changed my mind"):
        nonstop.run_request(db, "c", 7, transfer, 1)
    with db.transaction() as tx:
        assert tx.find(Account, number="ghost") is None
    assert balances(db) == (100, 0)


def test_results_survive_restart(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with nonstop.open(path) as db:
        with db.transaction() as tx:
            tx.create(Account, number="A", balance=100)
            tx.create(Account, number="B", balance=0)
        assert nonstop.run_request(db, "c", 1, transfer, 30) == {"A": 70, "B": 30}
    with nonstop.open(path) as db:
        assert nonstop.run_request(db, "c", 1, transfer, 30) == {"A": 70, "B": 30}
        assert balances(db) == (70, 30)


def test_window_bounds_the_log_and_old_retries_are_refused(db: nonstop.Database) -> None:
    for seq in range(10):
        nonstop.run_request(db, "c", seq, transfer, 1, window=4)
    assert balances(db) == (90, 10)
    # The last 4 (6..9) are still answered from the log ...
    assert nonstop.run_request(db, "c", 6, transfer, 1, window=4) == {"A": 93, "B": 7}
    # ... older ones are refused, never re-executed.
    with pytest.raises(nonstop.RequestExpired, match="older than the 4 results kept"):
        nonstop.run_request(db, "c", 2, transfer, 1, window=4)
    assert balances(db) == (90, 10)
    with db.engine.store.read() as rtxn:  # the log really is bounded
        kept = sum(
            1
            for k in rtxn.cursor(db=db.engine.store.results).iternext(values=False)
            if k.startswith(b"c\x00") and not k.endswith(b"low")
        )
    assert kept == 4


def test_concurrent_retries_run_once(db: nonstop.Database) -> None:
    results: list[object] = []

    def retry() -> None:
        results.append(nonstop.run_request(db, "racer", 1, transfer, 25))

    threads = [threading.Thread(target=retry) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8 and all(r == {"A": 75, "B": 25} for r in results)
    assert balances(db) == (75, 25)


def test_bad_request_ids(db: nonstop.Database) -> None:
    with pytest.raises(nonstop.BadArgument):
        nonstop.run_request(db, "", 1, transfer, 1)
    with pytest.raises(nonstop.BadArgument):
        nonstop.run_request(db, "c", -1, transfer, 1)
    with pytest.raises(nonstop.BadArgument, match="cannot be stored"):
        nonstop.run_request(db, "c", 1, lambda tx: object())
    assert balances(db) == (100, 0)


def test_concurrent_requests_of_one_client_keep_the_window_monotonic(
    db: nonstop.Database,
) -> None:
    def run(seq: int) -> None:
        nonstop.run_request(db, "busy", seq, transfer, 1, window=3)

    threads = [threading.Thread(target=run, args=(seq,)) for seq in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert balances(db) == (76, 24)  # each of the 24 requests ran exactly once
    with db.engine.store.read() as rtxn:
        low = rtxn.get(b"busy\x00low", db=db.engine.store.results)
    assert int.from_bytes(low, "big") == 24 - 3  # the highest window wins
    # 24 requests at once break the client's contract (at most `window` outstanding):
    # a request the window slid past while it still ran records its result after the
    # slide deleted the older ones, so whether seq 0 still has a record depends on
    # the interleaving.  Either way it never runs a second time.
    with contextlib.suppress(nonstop.RequestExpired):
        nonstop.run_request(db, "busy", 0, transfer, 1, window=3)
    assert balances(db) == (76, 24)
    # Within the contract, a request that fell out of the window is expired.
    nonstop.run_request(db, "busy", 30, transfer, 1, window=3)  # the window slides to 28
    assert balances(db) == (75, 25)
    with pytest.raises(nonstop.RequestExpired):
        nonstop.run_request(db, "busy", 22, transfer, 1, window=3)
    assert balances(db) == (75, 25)
