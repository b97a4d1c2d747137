"""Bounded replication steps (replication.md §4a): a large prepared write set goes as
parts of at most ``record_writes`` writes, a ``rep`` message carries at most
``message_writes`` writes, and the caller's record completes only once every part
is durable on the replica -- so no step on either node scales with a transaction.
"""

from __future__ import annotations

from typing import Any

from tests.replication_harness import Node, P, pump, settle, view

from nonstop.replication import Completed, Failed, ReplicationConfig
from nonstop.replication.machine import ACK, REP, TICK
from nonstop.replication.records import (
    COMMIT,
    MORE,
    OUTCOME,
    OUTCOME_COMMIT,
    OUTCOME_PART,
    PREPARE,
)
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


# ---------------------------------------------------------------- steps across events
STEPPED = ReplicationConfig(record_writes=3, message_writes=4, step_writes=3)


def _stepped_pair() -> tuple[Node, Node]:
    a, b = Node("a", STEPPED), Node("b", STEPPED)
    a.table(view(), acting=(P,))
    b.table(view())
    settle(a, b)
    a.of(Completed)
    return a, b


def _watch(a: Node) -> list[tuple[str, str | None, int]]:
    """(kind, extra, writes) of every record ``a`` makes from now on, in order."""
    made: list[tuple[str, str | None, int]] = []
    append = a.machine._append

    def watched(stream: Any, kind: str, also: Any = (), **fields: Any) -> list[Any]:
        made.append((kind, fields.get("extra"), len(fields.get("writes") or {})))
        return append(stream, kind, also, **fields)

    a.machine._append = watched  # type: ignore[method-assign]
    return made


def test_a_large_prepare_is_made_a_step_per_event_and_a_later_commit_waits_behind_it() -> None:
    a, b = _stepped_pair()
    made = _watch(a)
    last = a.machine.streams[P].last
    a.take(a.machine.replicate(0.0, "g", P, 1, WRITES, PREPARE, "tx1"))
    stream = a.machine.streams[P]
    assert stream.last == last + 1, "one part made in the caller's event (3 writes)"
    assert len(stream.deferred) == 3
    # A commit of the same partition in the same event goes behind the parts, not before
    # them (I4); the event's budget is spent: nothing more is made now.
    a.take(a.machine.replicate(0.0, "c", P, 1, {"k00": ["later"]}))
    assert stream.last == last + 1 and len(stream.deferred) == 4
    a.table(view(), acting=(P,))
    assert a.slices() == 1, "the rest on a zero-delay rep.slice timer, a part per event"
    assert stream.last == last + 2 and len(stream.deferred) == 3
    settle(a, b)
    assert not stream.deferred
    assert [c.ref for c in a.of(Completed)] == ["g", "c"]
    kinds = [(k, e) for k, e, _ in made]
    assert kinds == [(PREPARE, MORE)] * 3 + [(PREPARE, None), (COMMIT, None)]
    assert b.machine.data.whole(P, "tx1")
    assert b.machine.data.values(P)["k00"] == ["later"]


def test_an_event_makes_at_most_its_budget_over_all_partitions() -> None:
    q = "Q"
    a, b = Node("a", STEPPED), Node("b", STEPPED)
    both = (view(), view(name=q))
    a.table(*both, acting=(P, q))
    b.table(*both)
    settle(a, b)
    a.of(Completed)
    made = _watch(a)
    a.take(a.machine.replicate(0.0, "p", P, 1, WRITES, PREPARE, "tx1"))
    a.take(a.machine.replicate(0.0, "q", q, 1, WRITES, PREPARE, "tx1"))
    assert len(made) == 1, "the event's 3 writes: one part of P's, none of Q's"
    a.table(*both, acting=(P, q))
    a.slices()
    assert len(made) == 2 and a.machine.streams[q].last == 2, "then Q's turn"
    settle(a, b)
    assert sorted(c.ref for c in a.of(Completed)) == ["p", "q"]
    assert b.machine.data.whole(P, "tx1") and b.machine.data.whole(q, "tx1")


def test_a_large_outcome_goes_in_parts_across_events_and_the_replica_ends_equal() -> None:
    a, b = _stepped_pair()
    a.take(a.machine.replicate(0.0, "g", P, 1, WRITES, PREPARE, "tx1"))
    settle(a, b)
    assert [c.ref for c in a.of(Completed)] == ["g"]
    a.take(a.machine.hold("tx1", [P]))
    last = a.machine.streams[P].last
    made = _watch(a)
    a.take(a.machine.outcome(0.0, None, P, "tx1", OUTCOME_COMMIT))
    stream = a.machine.streams[P]
    assert stream.last == last + 1, "one part of the outcome in the caller's event"
    assert a.machine.data.values(P) == dict(list(WRITES.items())[:3])
    assert a.machine.held("tx1"), "phase two waits for the last outcome record everywhere"
    # Anything else of the partition meanwhile waits behind the outcome's records (I4).
    a.take(a.machine.replicate(0.0, "c", P, 1, {"k09": ["later"]}))
    settle(a, b)
    assert made == [
        (OUTCOME, OUTCOME_PART, 3),
        (OUTCOME, OUTCOME_PART, 3),
        (OUTCOME, OUTCOME_PART, 3),
        (OUTCOME, OUTCOME_COMMIT, 0),
        (COMMIT, None, 1),
    ]
    assert not a.machine.held("tx1")
    expected = {**WRITES, "k09": ["later"]}
    assert a.machine.data.values(P) == expected
    assert b.machine.data.values(P) == expected
    assert not b.machine.data.prepared_of(P) and not a.machine.data.prepared_of(P)
    assert not [k for k in b.disk if k.startswith(b"rep/p/")]


def test_a_replica_restarted_between_outcome_parts_applies_the_rest_alike() -> None:
    a, b = _stepped_pair()
    a.take(a.machine.replicate(0.0, "g", P, 1, WRITES, PREPARE, "tx1"))
    settle(a, b)
    a.take(a.machine.outcome(0.0, None, P, "tx1", OUTCOME_COMMIT))
    _step(a, b)  # the first part reaches b, durably
    assert b.machine.data.values(P) == dict(list(WRITES.items())[:3])
    b.restart()  # its prepared record comes back whole from the disk
    b.table(view())
    assert b.machine.data.prepared_of(P)["tx1"] == WRITES
    a.take(a.machine.handle(TimerFired(1.0, TICK)))
    settle(a, b)
    assert b.machine.data.values(P) == WRITES == a.machine.data.values(P)
    assert not b.machine.data.prepared_of(P)


def test_records_not_made_yet_fail_with_the_stream() -> None:
    a, _ = _stepped_pair()
    a.take(a.machine.replicate(0.0, "g", P, 1, WRITES, PREPARE, "tx1"))
    assert a.machine.streams[P].deferred
    a.table(view(epoch=2, active="b"), acting=())
    failed = a.of(Failed)
    assert [f.ref for f in failed] == ["g"]
    assert P not in a.machine.streams
    assert not a.slices() or P not in a.machine.streams
