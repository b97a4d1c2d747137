"""Restarts (A1, A2, A4, A6): everything committed survives a close/reopen and a SIGKILL."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from tests.bankmodel import SLOW_STARTED, Account, Mailbox
from tests.e2e.test_crash import Child

import nonstop

N = 300


def check_populated(db: nonstop.Database, n: int = N) -> None:
    with db.transaction() as tx:
        # extents and counts
        assert tx.count(Account) == n == len(tx.extent(Account))
        # unique index
        for i in (0, n // 2, n - 1):
            assert tx.get(Account, number=f"P{i:04d}").balance == i
        assert tx.find(Account, number=f"P{n:04d}") is None
        # non-unique index
        o3 = tx.query(Account).where(owner="o3").all()
        assert sorted(a.balance for a in o3) == [i for i in range(n) if i % 7 == 3]
        assert tx.query(Account).where(owner="o3").count() == len(o3)
        # ordered range, both directions
        up = tx.query(Account).range("owner", "o2", "o4").all()
        assert {a.owner for a in up} == {"o2", "o3"}
        assert [a.owner for a in up] == sorted(a.owner for a in up)
        down = tx.query(Account).range("owner", "o2", "o4", inclusive=(False, True))
        owners = [a.owner for a in down.order_by("owner", descending=True).all()]
        assert owners[0] == "o4" and owners[-1] == "o3" and owners == sorted(owners, reverse=True)
        assert len(owners) == sum(1 for i in range(n) if i % 7 in (3, 4))


def populate(db: nonstop.Database, n: int = N) -> None:
    with db.transaction() as tx:
        for i in range(n):
            tx.create(Account, number=f"P{i:04d}", owner=f"o{i % 7}", balance=i)


def test_objects_indexes_and_counts_survive_close_and_reopen(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db:
        populate(db)
        location = db.location
        with db.transaction() as tx:
            ref = tx.ref(tx.get(Account, number="P0005"))
            tx.get(Account, number="P0006").owner = "moved"  # mutable key change
            tx.delete(tx.get(Account, number="P0007"))
        with db.transaction() as tx:
            tx.create(Account, number="P0007", owner=f"o{7 % 7}", balance=7)
            tx.get(Account, number="P0006").owner = f"o{6 % 7}"
    for _ in range(2):
        with nonstop.open(store_dir) as db:
            assert db.location == location
            check_populated(db)
            with db.transaction() as tx:
                assert tx.by_ref(ref).number == "P0005"  # type: ignore[union-attr]
                assert tx.query(Account).where(owner="moved").all() == []


def test_objects_indexes_and_counts_survive_sigkill(store_dir: Path) -> None:
    child = Child(str(store_dir), "populate", str(N))
    child.wait_for("done")
    child.kill()
    with nonstop.open(store_dir) as db:
        check_populated(db)
        with db.transaction() as tx:  # and the store keeps working
            tx.create(Account, number="after-crash")
        with db.transaction() as tx:
            assert tx.count(Account) == N + 1


def test_pending_async_calls_resume_after_close(store_dir: Path) -> None:
    n = 12
    SLOW_STARTED.clear()
    with nonstop.open(store_dir) as db:
        with db.transaction() as tx:
            box = tx.create(Mailbox, name="slow")
            box.slow_deliver("call-0", 0.3)
        assert SLOW_STARTED.wait(10)  # call-0 is running (its batch is fixed now)
        for i in range(1, n):
            with db.transaction() as tx:
                tx.get(Mailbox, name="slow", lock="none").slow_deliver(f"call-{i}", 0.01)
        # close now: it lets the running batch finish; the others stay queued
    with nonstop.open(store_dir, async_workers=1) as db:
        with db.engine.store.read() as rtxn:
            pending = rtxn.stat(db.engine.store.asyncq)["entries"]
        with db.transaction(isolation="snapshot") as tx:
            ran_before_close = len(tx.get(Mailbox, name="slow").log)
        assert ran_before_close == 1  # only call-0 was running when close began
        assert pending == n - 1  # the rest survived the close
        assert db.wait_for_async(30)
        with db.transaction() as tx:
            box = tx.get(Mailbox, name="slow")
            assert box.log == [f"call-{i}" for i in range(n)]  # each once, in send order
            assert box.runs == n
        assert db.stats()["async_executed"] == pending


@pytest.mark.timeout(90)
def test_pending_async_calls_resume_after_sigkill(tmp_path: Path) -> None:
    rng = random.Random(7)
    for attempt in range(3):
        store = tmp_path / f"s{attempt}"
        n = 20
        child = Child(str(store), "async", str(n))
        child.wait_for("committed")
        time.sleep(rng.uniform(0.0, 0.4))  # slow_deliver takes 20 ms: some ran, some not
        child.kill()
        with nonstop.open(store) as db:
            assert db.wait_for_async(30)
            with db.transaction() as tx:
                box = tx.get(Mailbox, name="slow")
                assert box.log == [f"call-{i}" for i in range(n)]  # exactly once, in order
                assert box.runs == n
            with db.engine.store.read() as rtxn:
                assert rtxn.stat(db.engine.store.asyncq)["entries"] == 0
        with nonstop.open(store) as db:  # nothing runs a second time after another restart
            assert db.wait_for_async(10)
            assert db.stats()["async_executed"] == 0


def test_pending_calls_wait_for_their_type_to_be_imported(store_dir: Path) -> None:
    """A process that opens the store before importing a type's module must not lose its calls."""
    import subprocess
    import sys
    import textwrap

    from tests.conftest import ROOT, child_env

    with nonstop.open(store_dir) as db:
        blocker = db.transaction().__enter__()
        with db.transaction() as tx:
            tx.create(Mailbox, name="late")
        blocker.get(Mailbox, name="late", lock="write")  # keep the calls pending
        with db.transaction() as tx:
            for i in range(3):
                tx.get(Mailbox, name="late", lock="none").deliver(f"call-{i}")
        blocker.rollback()
        db.engine.dispatcher.close()  # stop before they run (simulates a stop right after commit)
    code = textwrap.dedent(
        f"""
        import time, nonstop
        db = nonstop.open({str(store_dir)!r})  # bank.Mailbox is not imported here
        time.sleep(0.5)
        print(db.stats()["async_failed"], len(db.dead_letters()))
        db.close()
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
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "0"], out.stdout
    with nonstop.open(store_dir) as db:
        assert db.wait_for_async(10)
        assert db.dead_letters() == []
        with db.transaction() as tx:
            assert tx.get(Mailbox, name="late").log == ["call-0", "call-1", "call-2"]


def test_dead_letters_survive_restarts_and_are_never_overwritten(store_dir: Path) -> None:
    for i in range(3):
        with nonstop.open(store_dir) as db:
            with db.transaction() as tx:
                box, _ = tx.get_or_create(Mailbox, name="m")
                box.explode(f"boom-{i}")
            assert db.wait_for_async(10)
            errors = [d["error"] for d in db.dead_letters()]
            assert errors == [f"ValueError: boom-{j}" for j in range(i + 1)]
