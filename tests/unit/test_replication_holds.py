"""Holds on a participant's phase-two acknowledgement (replication/holds.py, replication.md §6).

A two-phase-commit participant acknowledges phase two only once every copy of
its partitions that may be promoted holds the outcome; else the decision log
may forget the txid while a copy still holds the prepared record (it then
resolves "forgotten" as abort: an acknowledged commit lost).  The simulator
found both gaps these tests pin: a participant that had handed its partition
over (no stream) acknowledged at once (dataplane seed 285), and a hold kept
in memory only was lost by a restart (replication.md §10b, item 4).
"""

from __future__ import annotations

from tests.replication_harness import Node, P, settle, view

from nonstop.replication import Completed, Resolve
from nonstop.replication.machine import ACK, RELEASED, REP, TICK
from nonstop.runtime.interface import Notify, TimerFired

TX = "c.1"


def _prepared_pair() -> tuple[Node, Node]:
    """a active, b its sync replica; TX prepared on both."""
    a, b = Node("a"), Node("b", seed=2)  # streams of their own (random ids)
    v = view()
    a.table(v, acting=(P,))
    b.table(v)
    a.take(a.machine.replicate(0.0, "p", P, 1, {"x": [1]}, kind="prepare", txid=TX))
    a.table(v, acting=(P,))
    settle(a, b)
    assert [c.ref for c in a.of(Completed)] == ["p"]
    assert TX in b.machine.data.prepared_of(P)
    return a, b


def _released(node: Node) -> list[str]:
    return [n.data["g"] for n in node.of(Notify) if n.kind == RELEASED]


def test_active_participant_is_released_once_the_outcome_is_on_the_replica() -> None:
    a, b = _prepared_pair()
    v = view()
    a.take(a.machine.hold(TX, [P]))
    a.take(a.machine.outcome(1.0, None, P, TX, "commit"))
    a.table(v, acting=(P,))
    a.sync()
    a.table(v, acting=(P,))
    assert a.machine.held(TX), "durable here, not yet on the replica"
    settle(a, b)
    assert TX not in b.machine.data.prepared_of(P)
    assert not a.machine.held(TX)
    assert _released(a) == [TX]


def test_participant_without_a_stream_waits_for_the_active_nodes_outcome() -> None:
    """Seed 285: P was handed over to b before the outcome reached a, the participant."""
    a, b = _prepared_pair()
    handed = view(epoch=2, active="b", current=("b", "a"))
    a.table(handed)
    b.table(handed, acting=(P,))
    assert [r.txid for r in b.of(Resolve)] == [TX]
    a.take(a.machine.hold(TX, [P]))
    a.table(handed)
    assert a.machine.held(TX), "a's copy still holds TX prepared: b must resolve it first"
    settle(a, b)
    assert a.machine.held(TX), "b has not resolved TX yet (the log still must hold it)"
    b.take(b.machine.outcome(2.0, "o", P, TX, "commit"))
    b.table(handed, acting=(P,))
    settle(a, b)
    assert TX not in a.machine.data.prepared_of(P)
    # a holds the outcome; b may not yet (seed 3300015: b crashed before its own write of
    # the record and resolved TX again from a log that had forgotten it -- abort).
    assert a.machine.held(TX), "released before b said its copies completed the outcome"
    b.take(b.machine.handle(TimerFired(b.now, TICK)))  # b's resend tick tells completion
    b.table(handed, acting=(P,))
    settle(a, b)
    assert not a.machine.held(TX)


def test_a_participant_restarted_while_held_asks_the_active_node_again() -> None:
    """Seed 53: a restarted while its hold waited for b's word on ``completed``; b (idle,
    a's last ack said a knew) would never tell it again: a asks, unasked acks every
    ``resend``, until b tells it."""
    a, b = _prepared_pair()
    handed = view(epoch=2, active="b", current=("b", "a"))
    a.table(handed)
    b.table(handed, acting=(P,))
    a.take(a.machine.hold(TX, [P]))
    b.take(b.machine.outcome(2.0, "o", P, TX, "commit"))
    b.table(handed, acting=(P,))
    settle(a, b)
    a.restart()  # before any word of b's completion reached a (its memory of it is gone)
    a.table(handed)
    assert a.machine.held(TX), "the hold is durable"
    asks = a.sends("b", ACK)
    assert asks, "a waits for b's word and asks for it"
    for ask in asks:
        b.deliver("a", ask.payload)
    b.take(b.machine.handle(TimerFired(b.now, TICK)))
    b.table(handed, acting=(P,))
    settle(a, b)
    assert not a.machine.held(TX)


def test_hold_survives_a_restart_of_a_participant_whose_outcome_missed_the_replica() -> None:
    """§10b item 4: the outcome is durable on the participant (it acknowledges from its
    tombstone after a restart), the replica never got it, the replica is promoted."""
    a, b = _prepared_pair()
    a.take(a.machine.hold(TX, [P]))
    a.take(a.machine.outcome(1.0, None, P, TX, "commit"))
    a.table(view(), acting=(P,))
    a.sync()
    assert a.sends(kind=REP), "the outcome record left for b ... and is lost"
    a.restart()
    assert a.machine.held(TX), "the hold is durable"
    promoted = view(epoch=2, active="b", current=("b", "a"))
    a.table(promoted)
    b.table(promoted, acting=(P,))
    settle(a, b)
    assert TX not in a.machine.data.prepared_of(P)
    assert a.machine.held(TX), "a's last record is its own: b may still hold TX prepared"
    assert [r.txid for r in b.of(Resolve)] == [TX]
    b.take(b.machine.outcome(2.0, "o", P, TX, "commit"))
    # a's copy diverged (it holds a record b never had): b restores it by copy.
    copying = view(epoch=3, active="b", current=("b", "a"), copying=("a",))
    a.table(copying)
    b.table(copying, acting=(P,))
    settle(a, b)
    assert b.machine.data.prepared_of(P) == {}
    assert a.machine.data.head(P)[0] == b.machine.streams[P].stream_id
    assert not a.machine.held(TX)


def test_a_node_with_a_stream_waits_for_its_last_record_to_complete() -> None:
    """Restarted and active again: the outcome is in the new stream's base, so the hold goes
    once a record of the new stream completed (the replica accepted the base)."""
    a, b = _prepared_pair()
    a.take(a.machine.hold(TX, [P]))
    a.take(a.machine.outcome(1.0, None, P, TX, "commit"))
    a.table(view(), acting=(P,))
    settle(a, b)
    assert not a.machine.held(TX)
    a.take(a.machine.hold("c.2", [P]))  # nothing of c.2 here: released once settled
    a.sync()
    a.restart()
    again = view(epoch=2)
    a.table(again, acting=(P,))
    b.table(again)
    assert a.machine.held("c.2")
    settle(a, b)
    assert not a.machine.held("c.2")
