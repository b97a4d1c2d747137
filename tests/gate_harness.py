"""The node's call gate (``node/replicated_calls.py``) outside a node: a fake cluster
machine, an event loop on a thread, a recording replication, and small store helpers
(tests/unit/test_partitioned_calls.py, tests/unit/test_timers.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nonstop
from nonstop.ha.partition_table import partition_location
from nonstop.node.replicated_calls import ReplicatedCallGate
from tests.bankmodel import Mailbox

P0 = partition_location("p0")
P1 = partition_location("p1")


def until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


@dataclass
class Stream:
    stream_id: int


@dataclass
class FakeMachine:
    """What the gate reads of a ``ReplicatedClusterNode``: the partition table, acting,
    ready, the streams."""

    acting_for: set[str] = field(default_factory=set)
    streams_ids: dict[str, int] = field(default_factory=dict)

    @property
    def cluster(self) -> FakeMachine:
        return self

    @property
    def partition_table(self) -> Any:
        return type("T", (), {"partitions": {"p0": None, "p1": None}})()

    @property
    def replication(self) -> Any:
        return type("R", (), {"streams": {n: Stream(i) for n, i in self.streams_ids.items()}})()

    def acting(self, now: float, name: str) -> bool:
        return name in self.acting_for

    def ready(self, name: str) -> bool:
        return name in self.acting_for and name in self.streams_ids


class Loop:
    """An event loop on a thread: the node's loop the gate hands runs to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def mailbox(db: nonstop.Database, location: int, name: str) -> bytes:
    with db.transaction() as tx:
        return tx.ref(tx.create_in(Mailbox, location, 1, name=name)).raw


def log_of(db: nonstop.Database, name: str) -> list[str]:
    with db.transaction() as tx:
        return list(tx.get(Mailbox, name=name).log)


def queued(db: nonstop.Database) -> list[bytes]:
    store = db.engine.store
    with store.read() as rtxn:
        return [bytes(k) for k in rtxn.cursor(db=store.asyncq).iternext(values=False)]


class Replicas:
    """The replication the gate commits through: records every run's records."""

    def __init__(self) -> None:
        self.records: list[list[Any]] = []
        self.answer: Any = None  # None, an exception to raise, or an unknown reply

    async def __call__(self, records: list[list[Any]]) -> dict[str, Any] | None:
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer is None:
            self.records.extend(records)
        return self.answer  # type: ignore[no-any-return]


def gate_for(db: nonstop.Database, machine: FakeMachine, replicas: Replicas, loop: Loop) -> Any:
    gate = ReplicatedCallGate(
        db.engine.dispatcher, lambda: machine, replicas, time.monotonic, loop.loop
    )
    loop.call(gate.refresh)
    db.engine.dispatcher.attach_gate(gate)
    return gate
