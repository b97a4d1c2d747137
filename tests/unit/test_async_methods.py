"""Asynchronous methods (A6): after commit, exactly once, FIFO, self-sends first, drop, replay."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from tests.bankmodel import Mailbox
from tests.conftest import run_threads

import nonstop
from nonstop import Managed, asynchronous, key

ATTEMPTS: list[str] = []
GATE = threading.Barrier(2)
PASSED: list[str] = []


class Chain(Managed, name="test_async_methods.Chain"):
    name: str = key(unique=True)
    log: list = nonstop.field(default_factory=list)
    partner: Chain | None = None
    count: int = 0

    @asynchronous
    def step(self, item: str, self_sends: int = 0) -> None:
        self.log = [*self.log, item]
        for i in range(self_sends):
            self.step(f"{item}.self{i}")  # a self-send: runs before other queued calls

    @asynchronous
    def link(self, other: Chain) -> None:
        self.partner = other

    @asynchronous
    def bump_both(self) -> None:
        ATTEMPTS.append(self.name)
        self.count += 1  # write lock on self
        if not PASSED:  # first attempts: both hold their own lock before either goes on
            GATE.wait(5)
            PASSED.append(self.name)
        assert self.partner is not None
        self.partner.count += 1  # then the partner: a lock cycle between the two workers


def log_of(db: nonstop.Database, name: str) -> list[Any]:
    with db.transaction() as tx:
        return list(tx.get(Chain, name=name).log)


def queue_size(db: nonstop.Database) -> int:
    with db.engine.store.read() as rtxn:
        return int(rtxn.stat(db.engine.store.asyncq)["entries"])


def test_runs_after_commit_and_never_after_rollback(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Chain, name="c")
    with db.transaction() as tx:
        c = tx.get(Chain, name="c", lock="none")
        c.step("committed")
        time.sleep(0.1)
        assert db.stats()["async_pending"] == 0  # not scheduled before commit
        assert queue_size(db) == 0  # not even durable
    with pytest.raises(nonstop.Abort), db.transaction() as tx:
        tx.get(Chain, name="c", lock="none").step("rolled back")
        raise nonstop.Abort
    assert db.wait_for_async(10)
    assert log_of(db, "c") == ["committed"]
    assert queue_size(db) == 0
    assert db.stats()["async_executed"] == 1


def test_exactly_once_in_send_order_per_sender(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Chain, name="c")
    n_senders, per_sender = 4, 25

    def send(i: int) -> None:
        for j in range(per_sender):
            with db.transaction() as tx:
                tx.get(Chain, name="c", lock="none").step(f"{i}:{j}")

    run_threads(n_senders, send)
    with db.transaction() as tx:  # several calls from one transaction keep their order
        c = tx.get(Chain, name="c", lock="none")
        for j in range(10):
            c.step(f"batch:{j}")
    assert db.wait_for_async(30)
    log = log_of(db, "c")
    assert len(log) == len(set(log)) == n_senders * per_sender + 10
    for sender in [*map(str, range(n_senders)), "batch"]:
        mine = [int(x.split(":")[1]) for x in log if x.split(":")[0] == sender]
        assert mine == sorted(mine) and len(mine) == (10 if sender == "batch" else per_sender)
    assert queue_size(db) == 0


def test_one_call_at_a_time_per_target_but_targets_in_parallel(tmp_path: Any) -> None:
    db = nonstop.open(tmp_path / "s", async_workers=4)
    try:
        with db.transaction() as tx:
            for n in "ab":
                m = tx.create(Mailbox, name=n)
                for i in range(30):
                    m.deliver(f"{n}{i}")
        assert db.wait_for_async(30)
        with db.transaction() as tx:
            for n in "ab":
                m = tx.get(Mailbox, name=n)
                # read-modify-write of the whole list: a concurrent second call would lose one
                assert m.log == [f"{n}{i}" for i in range(30)]
                assert m.runs == 30
    finally:
        db.close()


def test_self_sends_run_before_other_queued_calls(db: nonstop.Database) -> None:
    holder = db.transaction().__enter__()
    holder.create(Chain, name="c")
    holder.commit()
    blocker = db.transaction().__enter__()
    blocker.get(Chain, name="c", lock="write")  # nothing runs until we let go
    with db.transaction() as tx:
        c = tx.get(Chain, name="c", lock="none")
        c.step("a", self_sends=2)
        c.step("b")
        c.step("c", self_sends=1)
    blocker.commit()
    assert db.wait_for_async(10)
    assert log_of(db, "c") == ["a", "a.self0", "a.self1", "b", "c", "c.self0"]


def test_managed_arguments_travel_as_references(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        a = tx.create(Chain, name="a")
        b = tx.create(Chain, name="b")
        a.link(b)
    assert db.wait_for_async(10)
    with db.transaction() as tx:
        assert tx.get(Chain, name="a").partner == tx.get(Chain, name="b")


def test_dropped_when_the_target_was_deleted(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Chain, name="gone")
        tx.create(Chain, name="later")
    blocker = db.transaction().__enter__()
    target = blocker.get(Chain, name="gone", lock="write")
    with db.transaction() as tx:
        tx.get(Chain, name="gone", lock="none").step("never runs")
    with db.transaction() as tx:  # sent and deleted in one transaction
        later = tx.get(Chain, name="later")
        later.step("never either")
        tx.delete(later)
        with pytest.raises(nonstop.Deleted, match="deleted in this transaction"):
            later.step("refused")
    blocker.delete(target)
    blocker.commit()
    assert db.wait_for_async(10)
    assert db.stats()["async_dropped"] == 2
    assert db.stats()["async_executed"] == 0
    assert queue_size(db) == 0
    assert db.dead_letters() == []


def test_replayed_on_deadlock(tmp_path: Any) -> None:
    db = nonstop.open(tmp_path / "s", async_workers=2)
    try:
        with db.transaction() as tx:
            a = tx.create(Chain, name="a")
            b = tx.create(Chain, name="b", partner=a)
            a.partner = b
        ATTEMPTS.clear()
        rounds = 3
        for _ in range(rounds):
            PASSED.clear()
            GATE.reset()
            with db.transaction() as tx:
                tx.get(Chain, name="a", lock="none").bump_both()
                tx.get(Chain, name="b", lock="none").bump_both()
            assert db.wait_for_async(30)
        with db.transaction() as tx:
            assert tx.get(Chain, name="a").count == 2 * rounds
            assert tx.get(Chain, name="b").count == 2 * rounds
        assert len(ATTEMPTS) > 2 * rounds  # deadlock victims ran again
        assert db.stats()["async_executed"] == 2 * rounds
        assert db.dead_letters() == []
    finally:
        db.close()


def test_a_failing_call_is_dead_lettered_and_the_queue_goes_on(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        m = tx.create(Mailbox, name="m")
        m.deliver("before")
        m.explode("boom")
        m.deliver("after")
    assert db.wait_for_async(10)
    with db.transaction() as tx:
        assert tx.get(Mailbox, name="m").log == ["before", "after"]
    (dead,) = db.dead_letters()
    assert dead["method"] == "explode" and dead["args"] == ["boom"]
    assert dead["error"] == "ValueError: boom"
    assert isinstance(dead["target"], nonstop.Ref)
    assert db.stats()["async_failed"] == 1
    assert queue_size(db) == 0


async def test_sent_from_an_asyncio_transaction(db: nonstop.Database) -> None:
    import asyncio

    async with db.transaction() as tx:
        c = await tx.create(Chain, name="c")
        c.step("from a task")
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, db.wait_for_async, 10)
    async with db.transaction() as tx:
        assert (await tx.get(Chain, name="c")).log == ["from a task"]


def test_calls_from_many_threads_to_many_targets(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        for i in range(5):
            tx.create(Mailbox, name=f"m{i}")
    gate = threading.Barrier(4)

    def send(w: int) -> None:
        gate.wait()
        for j in range(20):
            with db.transaction() as tx:
                tx.get(Mailbox, name=f"m{j % 5}", lock="none").deliver(f"{w}-{j}")

    run_threads(4, send)
    assert db.wait_for_async(30)
    with db.transaction() as tx:
        logs = [tx.get(Mailbox, name=f"m{i}").log for i in range(5)]
    everything = [x for log in logs for x in log]
    assert sorted(everything) == sorted(f"{w}-{j}" for w in range(4) for j in range(20))
