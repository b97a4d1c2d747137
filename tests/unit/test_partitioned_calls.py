"""Queued calls move with their partition (A6 under ``ha.data = "partitions"``).

A call queued on an object of partition P rides P's replicated write set; a
promoted store takes P's pending calls with P's copy; the node's call gate
(``node/replicated_calls.py``) runs a call only where P is acted for and ready,
commits the run (effects + the queue entry's deletion) through replication, and
fences it by P's stream: a run begun under one stream never commits under another,
a refused run is parked and comes back when the gate admits P again, and a run of
unknown outcome never runs again under the token it ran under.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bankmodel import Mailbox
from tests.gate_harness import (
    P0,
    P1,
    FakeMachine,
    Loop,
    Replicas,
    gate_for,
    log_of,
    mailbox,
    queued,
    until,
)

import nonstop
from nonstop import Managed, asynchronous, errors, key
from nonstop.node.replica_store import QUEUE_KEY, load_copy, partition_write_sets, replicated_commit
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.entries import Isolation


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


@pytest.fixture
def db(tmp_path: Path) -> Iterator[nonstop.Database]:
    with nonstop.open(tmp_path / "store", hold_async=True) as d:
        yield d


def test_a_queued_call_rides_its_partition_write_set_and_moves_with_the_copy(
    db: nonstop.Database, tmp_path: Path
) -> None:
    ref = mailbox(db, P0, "m")
    seen: list[list[Any]] = []

    async def queue() -> None:
        async def accepted(records: list[list[Any]]) -> None:
            seen.extend(records)

        tx = AsyncTransaction(db, Isolation.SERIALIZABLE, 5.0)
        box = await tx.get(Mailbox, name="m")
        box.deliver("x")
        await replicated_commit(tx, accepted)

    asyncio.run(queue())
    (call,) = [r for r in seen if r[0] == "q"]
    assert call[1][:20] == ref and call[2] is not None
    sets = partition_write_sets(seen, {ref: "p0"}.get)
    assert sets == {"p0": {QUEUE_KEY + call[1].hex(): call[2]}}
    assert queued(db) == [call[1]]  # durable here too (held: nothing ran)
    # The promoted store takes P0's copy: the call is queued there; a stale entry of P0
    # the copy lacks (a call that ran on the dead node) is dropped, P1's is kept.
    with nonstop.open(tmp_path / "replica", hold_async=True) as replica:
        stale, other = ref + b"\x01" + (9).to_bytes(8, "big"), b"\x00" * 28 + b"\x01"
        other = P1.to_bytes(8, "big") + other[8:]
        with replica.transaction() as tx:
            tx.write_raw([(True, replica.engine.store.asyncq, k, b"x") for k in (stale, other)])
        asyncio.run(load_copy(replica, P0, sets["p0"]))
        assert sorted(queued(replica)) == sorted([call[1], other])


def test_the_gate_runs_a_partition_call_only_where_it_is_acted_for(
    db: nonstop.Database, loop: Loop
) -> None:
    mailbox(db, P0, "m")
    with db.transaction() as tx:
        tx.get(Mailbox, name="m").deliver("a")
    machine, replicas = FakeMachine(), Replicas()
    gate = gate_for(db, machine, replicas, loop)
    assert until(lambda: bool(db.engine.dispatcher.parked()))  # P0 is not acted for here: parked
    assert log_of(db, "m") == [] and len(queued(db)) == 1
    machine.acting_for.add("p0")
    machine.streams_ids["p0"] = 1
    assert loop.call(gate.refresh)  # this node became active for P0
    assert db.engine.dispatcher.resume() == 1
    assert until(lambda: log_of(db, "m") == ["a"])
    assert until(lambda: queued(db) == [])
    # The run was replicated: its effects and its queue entry's deletion, one record set.
    kinds = sorted(r[0] for r in replicas.records)
    assert kinds == ["q", "u"] and next(r for r in replicas.records if r[0] == "q")[2] is None
    assert db.wait_for_async(5)
    assert log_of(db, "m") == ["a"]  # exactly once


def test_a_refused_run_is_parked_and_an_unknown_one_never_reruns_under_its_token(
    db: nonstop.Database, loop: Loop
) -> None:
    mailbox(db, P0, "m")
    machine, replicas = FakeMachine({"p0"}, {"p0": 1}), Replicas()
    gate = gate_for(db, machine, replicas, loop)
    replicas.answer = errors.NotActive("a handover")  # nothing made
    with db.transaction() as tx:
        tx.get(Mailbox, name="m").deliver("a")
    assert until(lambda: bool(db.engine.dispatcher.parked()))
    assert log_of(db, "m") == [] and len(queued(db)) == 1
    # The outcome of the next run is not known here: parked under ("p0", 1).
    replicas.answer = {"error": "Unavailable", "message": "outcome unknown"}
    assert db.engine.dispatcher.resume() == 1
    dispatcher = db.engine.dispatcher
    assert until(lambda: bool(dispatcher.parked()) and dispatcher.pending() == 0)
    replicas.answer = None
    assert db.engine.dispatcher.resume() == 0  # same token: it may have run elsewhere
    assert log_of(db, "m") == []
    # A later stream of P0 (this node promoted again, its store reloaded from the copy).
    machine.streams_ids["p0"] = 2
    assert loop.call(gate.refresh)
    assert db.engine.dispatcher.resume() == 1
    assert until(lambda: log_of(db, "m") == ["a"] and queued(db) == [])


def test_a_run_begun_under_one_stream_does_not_commit_under_another(
    db: nonstop.Database, loop: Loop
) -> None:
    """The fence is checked on the loop at commit: the node lost P0 while the call ran."""
    mailbox(db, P0, "m")
    machine, replicas = FakeMachine({"p0"}, {"p0": 1}), Replicas()
    gate = gate_for(db, machine, replicas, loop)
    assert gate.admit(mailbox(db, P0, "n")) == ("p0", 1)
    machine.streams_ids["p0"] = 2  # not refreshed yet: the gate still admits ("p0", 1)
    with db.transaction() as tx:
        tx.get(Mailbox, name="m").deliver("a")
    assert until(lambda: bool(db.engine.dispatcher.parked()))
    assert replicas.records == [] and log_of(db, "m") == [] and len(queued(db)) == 1
    assert loop.call(gate.refresh)
    assert db.engine.dispatcher.resume() == 1
    assert until(lambda: log_of(db, "m") == ["a"] and queued(db) == [])


def test_a_node_local_target_runs_here_and_a_held_store_runs_nothing(
    db: nonstop.Database, loop: Loop
) -> None:
    local = 0x5555_0000_0000_0005  # the location of no partition: a node's own objects
    mailbox(db, local, "m")
    with db.transaction() as tx:
        tx.get(Mailbox, name="m").deliver("a")
    time.sleep(0.05)
    assert log_of(db, "m") == []  # held until the gate is attached
    gate_for(db, FakeMachine(), Replicas(), loop)
    assert until(lambda: log_of(db, "m") == ["a"])


class Relay(Managed, name="test_partitioned_calls.Relay"):
    name: str = key(unique=True)
    hits: int = 0
    peer: Relay | None = None

    @asynchronous
    def relay(self) -> None:
        assert self.peer is not None
        self.peer.hits += 1  # an object of another partition


def test_a_run_that_touches_another_partition_is_dead_lettered(
    db: nonstop.Database, loop: Loop
) -> None:
    """One partition per run, whatever the placement: here this node acts for both."""
    with db.transaction() as tx:
        a = tx.create_in(Relay, P0, 1, name="a")
        a.peer = tx.create_in(Relay, P1, 1, name="b")
        a.relay()
    machine, replicas = FakeMachine({"p0", "p1"}, {"p0": 1, "p1": 1}), Replicas()
    gate_for(db, machine, replicas, loop)
    assert until(lambda: len(db.dead_letters()) == 1)
    (dead,) = db.dead_letters()
    assert dead["method"] == "relay" and "partition p1" in dead["error"]
    with db.transaction() as tx:
        assert tx.get(Relay, name="b").hits == 0
    assert queued(db) == []
    # Its removal from the queue was replicated (the dead letter itself stays here).
    assert [r[0] for r in replicas.records] == ["q"]
