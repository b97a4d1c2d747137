"""Exactly once across a crash at any run, with the real dispatcher, gate and copy load
(A6, D20; docs/design/ha.md §10a, invariant Q3).

A model of one partition P0 with an active node and its sync replica's copy (the
write sets the replication would hold, ``partition_write_sets`` applied to a dict):
the active node queues calls and timers on several inboxes (replicated with the
transaction), its dispatcher runs them through the gate, and at a seeded run it
"dies" -- either before that run's record reached the replica, or after (the record
made, the local commit never done).  A second store then takes the replica's copy
(``load_copy``, as at promotion) and runs what is left.  For every seed and crash
point, each call ran exactly once and each timer fired once: nothing is lost and
nothing runs twice.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bankmodel import Mailbox
from tests.gate_harness import P0, FakeMachine, Loop, gate_for, queued, until

import nonstop
from nonstop import errors
from nonstop.model.ref import Ref
from nonstop.node.replica_store import load_copy, partition_write_sets, replicated_commit
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.entries import Isolation
from nonstop.tx.replica import copy_batch

BOXES = 4
CALLS = 3


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


def partition_of(ref: bytes) -> str | None:
    return "p0" if Ref(ref).location == P0 else None


class Replica:
    """P0's copy on its sync replica; the active node dies at run ``crash_at``."""

    def __init__(self, crash_at: int, made: bool) -> None:
        self.copy: dict[str, Any] = {}
        self.runs = 0
        self.crash_at = crash_at
        self.made = made  # the fatal run's record reached the replica
        self.dead = False

    def apply(self, records: list[list[Any]]) -> None:
        for values in partition_write_sets(records, partition_of).values():
            for key, value in values.items():
                if value is None:
                    self.copy.pop(key, None)
                else:
                    self.copy[key] = value

    async def __call__(self, records: list[list[Any]]) -> dict[str, Any] | None:
        if self.dead:
            raise errors.NotActive("this node is dead")
        self.runs += 1
        if self.runs == self.crash_at:
            self.dead = True
            if self.made:
                self.apply(records)
            return {"error": "Unavailable", "message": "the node died"}
        self.apply(records)
        return None


def run_case(tmp: Path, loop: Loop, crash_at: int, made: bool) -> None:
    replica = Replica(crash_at, made)
    names = [f"m{i}" for i in range(BOXES)]
    with nonstop.open(tmp / "active", hold_async=True, durability="none") as active:
        with active.transaction() as tx:
            for name in names:
                tx.create_in(Mailbox, P0, 1, name=name)
        (created, _) = copy_batch(active.engine, P0)
        replica.apply(created)  # (the creates' records)

        async def queue() -> None:
            tx = AsyncTransaction(active, Isolation.SERIALIZABLE, 5.0)
            for name in names:
                box = await tx.get(Mailbox, name=name)
                box.deliver.after(0.01, f"{name}:t")
                for k in range(CALLS):
                    box.deliver(f"{name}:{k}")
            await replicated_commit(tx, replica)

        asyncio.run(queue())
        gate_for(active, FakeMachine({"p0"}, {"p0": 1}), replica, loop)  # type: ignore[arg-type]
        # Runs until it dies (or everything ran before the crash point).
        assert until(lambda: replica.dead or not queued(active), 20)
        assert until(lambda: replica.dead or active.engine.dispatcher.pending() == 0, 20)
    # Promotion: another store takes the replica's copy and runs what is left.
    after = Replica(0, False)
    after.copy = dict(replica.copy)
    with nonstop.open(tmp / "promoted", hold_async=True, durability="none") as promoted:
        asyncio.run(load_copy(promoted, P0, after.copy))
        gate_for(promoted, FakeMachine({"p0"}, {"p0": 2}), after, loop)  # type: ignore[arg-type]
        promoted.engine.dispatcher.resume()  # (the node's refresh task does it when ready)
        assert until(lambda: not queued(promoted), 20)
        assert promoted.wait_for_async(20)
        with promoted.transaction() as tx:
            for name in names:
                log = list(tx.get(Mailbox, name=name).log)
                calls = [item for item in log if not item.endswith(":t")]
                assert calls == [f"{name}:{k}" for k in range(CALLS)], (crash_at, made, log)
                assert log.count(f"{name}:t") == 1, (crash_at, made, log)


@pytest.mark.parametrize("seed", range(6))
def test_every_call_runs_once_whatever_run_the_active_node_dies_at(
    tmp_path: Path, loop: Loop, seed: int
) -> None:
    rng = random.Random(seed)
    crash_at, made = rng.randint(1, BOXES + 2), rng.random() < 0.5
    run_case(tmp_path, loop, crash_at, made)
