"""Timers (D20): ``obj.method.after(seconds, ...)`` runs the asynchronous method once, at
or after its due time -- with the transaction or never, across a restart, without
holding back the calls queued after it, and (on a replicating node) only where the
partition is acted for, once after a failover even if it fell due during it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.bankmodel import Mailbox
from tests.gate_harness import P0, FakeMachine, Loop, Replicas, gate_for, mailbox, queued, until

import nonstop
from nonstop import Managed, asynchronous, key
from nonstop.tx.asyncmethods import MAX_DELAY


class Alarm(Managed, name="test_timers.Alarm"):
    name: str = key(unique=True)
    fired: list = nonstop.field(default_factory=list)

    @asynchronous
    def ring(self, label: str) -> None:
        self.fired = [*self.fired, [label, time.time()]]


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def fired(db: nonstop.Database, name: str) -> list[tuple[str, float]]:
    with db.transaction() as tx:
        return [(str(label), float(at)) for label, at in tx.get(Alarm, name=name).fired]


def labels(db: nonstop.Database, name: str) -> list[str]:
    return [label for label, _ in fired(db, name)]


def test_a_timer_fires_once_at_or_after_its_due_time(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Alarm, name="a").ring.after(0.3, "late")
        started = time.time()
    assert until(lambda: labels(db, "a") == ["late"], 5)
    ((_, at),) = fired(db, "a")
    assert at >= started + 0.3 - 0.01  # (the due time is taken inside the transaction)
    assert db.wait_for_async(5)
    assert labels(db, "a") == ["late"]  # once
    assert queued(db) == []


def test_a_timer_does_not_hold_back_the_calls_queued_after_it(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        alarm = tx.create(Alarm, name="a")
        alarm.ring.after(3600, "in an hour")
        alarm.ring("now")
    assert until(lambda: labels(db, "a") == ["now"], 5)
    assert len(queued(db)) == 1  # the timer waits in the store
    assert db.stats()["async_pending"] == 1


def test_a_timer_of_a_rolled_back_transaction_never_fires(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        tx.create(Alarm, name="a")
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.get(Alarm, name="a").ring.after(0.0, "never")
        raise RuntimeError("roll back")
    assert db.wait_for_async(5)
    assert labels(db, "a") == [] and queued(db) == []


def test_a_pending_timer_survives_a_restart_and_fires_once(tmp_path: Path) -> None:
    with nonstop.open(tmp_path / "s") as db:
        with db.transaction() as tx:
            tx.create(Alarm, name="a").ring.after(1.0, "t")
        assert len(queued(db)) == 1
    with nonstop.open(tmp_path / "s") as db:  # closed before it was due
        assert until(lambda: labels(db, "a") == ["t"], 5)
        assert db.wait_for_async(5)
        assert labels(db, "a") == ["t"]


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, MAX_DELAY + 1, True, "1"])
def test_a_delay_is_a_finite_number_of_seconds(db: nonstop.Database, delay: object) -> None:
    with db.transaction() as tx:
        alarm = tx.create(Alarm, name="a")
        with pytest.raises(nonstop.BadArgument):
            alarm.ring.after(delay, "x")


def test_a_timer_due_while_no_node_runs_its_partition_fires_once_after_promotion(
    tmp_path: Path,
    loop: Loop,
) -> None:
    with nonstop.open(tmp_path / "store", hold_async=True) as db:
        mailbox(db, P0, "m")
        with db.transaction() as tx:
            tx.get(Mailbox, name="m").deliver.after(0.05, "t")
        machine, replicas = FakeMachine(), Replicas()
        gate = gate_for(db, machine, replicas, loop)
        # Due, but P0 is not acted for here: parked.
        assert until(lambda: bool(db.engine.dispatcher.parked()))
        assert len(queued(db)) == 1
        machine.acting_for.add("p0")
        machine.streams_ids["p0"] = 1
        assert loop.call(gate.refresh)  # promoted
        assert db.engine.dispatcher.resume() == 1
        assert until(lambda: queued(db) == [])
        with db.transaction() as tx:
            assert tx.get(Mailbox, name="m").log == ["t"]
        # The run went through replication: the timer's deletion with its effect.
        assert [r[2] for r in replicas.records if r[0] == "q"] == [None]
