"""Bounded replication steps (replication.md §4a): a large prepared write set goes as
parts of at most ``record_writes`` writes, a ``rep`` message carries at most
``message_writes`` writes, and the caller's record completes only once every part
is durable on the replica -- so no step on either node scales with a transaction.
"""

from __future__ import annotations

from typing import Any

from tests.replication_harness import Node, P, pump, settle, view

from nonstop.replication import Completed, ReplicationConfig
from nonstop.replication.machine import ACK, REP, TICK
from nonstop.replication.records import MORE, OUTCOME_COMMIT, PREPARE
from nonstop.runtime.interface import TimerFired

WRITES = {f"k{i:02}": [i] for i in range(10)}
CONFIG = ReplicationConfig(record_writes=3, message_writes=4)


def _pair() -> tuple[Node, Node]:
    a, b = Node("a", CONFIG), Node("b", CONFIG)
    a.table(view(), acting=(P,))
    b.table(view())
    settle(a, b)
    a.of(Completed)
    return a, b


def _step(a: Node, b: Node) -> list[list[Any]]:
    """One round: a's disk, a's messages to b (their records returned), b's disk and acks."""
    a.sync()
    a.table(view(), acting=(P,))
    records: list[list[Any]] = []
    for message in a.sends("b", REP):
        part_records = [r for part in message.payload["parts"] for r in part[4]]
        assert sum(len(r[3]) for r in part_records) <= CONFIG.message_writes
        records += part_records
        b.deliver("a", message.payload)
    b.sync()
    pump(b, a, ACK)
    a.table(view(), acting=(P,))
    return records


def test_a_large_prepare_goes_in_bounded_parts_and_completes_after_the_last() -> None:
    a, b = _pair()
    a.take(a.machine.replicate(0.0, "g", P, 1, WRITES, PREPARE, "tx1"))
    sent: list[list[Any]] = []
    for _ in range(10):
        assert not a.of(Completed), "the vote waits for every part on the replica"
        sent += _step(a, b)
        if len(sent) == 4:
            break
    assert [len(r[3]) for r in sent] == [3, 3, 3, 1]
    assert [r[4] for r in sent] == [MORE, MORE, MORE, None]
    assert [c.ref for c in a.of(Completed)] == ["g"]
    assert b.machine.data.whole(P, "tx1")
    assert b.machine.data.prepared_of(P)["tx1"] == WRITES
    a.take(a.machine.outcome(0.0, None, P, "tx1", OUTCOME_COMMIT))
    settle(a, b)
    assert b.machine.data.values(P) == WRITES
    assert not [k for k in b.disk if k.startswith(b"rep/p/")], "every part is forgotten"


def test_a_copy_with_some_parts_knows_it_is_not_whole_across_a_restart() -> None:
    a, b = _pair()
    a.take(a.machine.replicate(0.0, "g", P, 1, WRITES, PREPARE, "tx1"))
    a.table(view(), acting=(P,))
    first = a.sends("b", REP)[0]  # the first part only (the message has room for one)
    a.sends("b", REP)  # the rest is lost
    b.deliver("a", first.payload)
    b.sync()
    b.restart()
    b.table(view())
    assert "tx1" in b.machine.data.prepared_of(P)
    assert not b.machine.data.whole(P, "tx1"), "no yes vote can have been given on it"
    a.sync()
    a.table(view(), acting=(P,))
    a.out = []
    a.take(a.machine.handle(TimerFired(1.0, TICK)))  # resend what is not acknowledged
    settle(a, b)
    assert [c.ref for c in a.of(Completed)] == ["g"]
    b.restart()
    assert b.machine.data.whole(P, "tx1")
    assert b.machine.data.prepared_of(P)["tx1"] == WRITES


def test_a_backlog_of_commits_goes_in_messages_of_bounded_writes() -> None:
    a, b = _pair()
    for i in range(6):
        a.take(a.machine.replicate(0.0, i, P, 1, {f"x{i}": [i], f"y{i}": [i]}))
    sent = _step(a, b)  # every event flushes: the backlog goes at once, cut in messages
    assert len(sent) == 6 and [c.ref for c in a.of(Completed)] == list(range(6))
    assert b.machine.data.values(P) == {
        **{f"x{i}": [i] for i in range(6)},
        **{f"y{i}": [i] for i in range(6)},
    }
