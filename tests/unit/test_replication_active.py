"""The active side of the replication machine (replication.md sections 2-4).

Completion only after the local disk *and* every in-sync sync replica hold a
record (I3), one ``rep`` message per replica per flush, epoch checks on the
caller's request, D12 (a silent or diverged replica is dropped through the
partition table before anything more completes), failing waiting records
with ``NotActive`` when the node stops being active, and resending.
"""

from __future__ import annotations

from tests.replication_harness import Node, P, pump, settle, view

from nonstop.replication import Completed, Failed, ReplicationConfig, Submit
from nonstop.replication.actions import BAD_REQUEST, NOT_ACTIVE, STALE_EPOCH
from nonstop.replication.machine import ACK, REP, TICK
from nonstop.runtime.interface import TimerFired


def _pair(**config: float) -> tuple[Node, Node]:
    cfg = ReplicationConfig(**config)  # type: ignore[arg-type]
    a, b = Node("a", cfg), Node("b", cfg)
    v = view()
    a.table(v, acting=(P,))
    b.table(v)
    settle(a, b)
    a.of(Completed)
    return a, b


def test_completes_only_after_local_disk_and_replica_persisted() -> None:
    a, b = _pair()
    a.take(a.machine.replicate(0.0, "r1", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    assert not a.of(Completed)
    a.sync()
    assert not a.of(Completed), "local disk alone is not enough (I3)"
    pump(a, b)
    assert not pump(b, a), "the replica answers only after its own Persisted"
    b.sync()
    assert pump(b, a, ACK) == 1
    a.table(view(), acting=(P,))
    done = a.of(Completed)
    assert [(c.ref, c.partition, c.epoch) for c in done] == [("r1", P, 1)]
    assert b.machine.data.values(P) == {"x": [1]}


def test_replica_ack_without_local_disk_is_not_enough() -> None:
    a, b = _pair()
    a.take(a.machine.replicate(0.0, "r1", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    pump(a, b)
    b.sync()
    pump(b, a)
    a.table(view(), acting=(P,))
    assert not a.of(Completed)
    a.sync()
    assert not a.of(Completed), "completions wait for on_table: acting is known only then"
    a.table(view(), acting=(P,))
    assert [c.ref for c in a.of(Completed)] == ["r1"]


def test_one_message_per_replica_per_flush_carries_every_record() -> None:
    a, _b = _pair()
    for i in range(5):
        a.take(a.machine.replicate(0.0, i, P, 1, {f"k{i}": [i]}))
    a.table(view(), acting=(P,))
    messages = a.sends("b", REP)
    assert len(messages) == 1
    (part,) = messages[0].payload["parts"]
    assert [r[0] for r in part[4]] == [2, 3, 4, 5, 6]  # seq 1 is the stream's opening noop


def test_every_in_sync_sync_replica_must_answer_but_not_async_or_copying_ones() -> None:
    nodes = {n: Node(n) for n in "abcd"}
    v = view(current=("a", "b", "c", "d"), sync=("a", "b", "c"), copying=("c",))
    nodes["a"].table(v, acting=(P,))
    for n in "bcd":
        nodes[n].table(v)
    a = nodes["a"]
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(v, acting=(P,))
    a.sync()
    assert not a.sends("d"), "async replicas get nothing (D11 is later)"
    assert a.sends("c"), "a copying sync node gets new records"
    a.table(v, acting=(P,))
    assert not a.of(Completed)
    pump(a, nodes["b"])
    nodes["b"].sync()
    pump(nodes["b"], a)
    a.table(v, acting=(P,))
    assert [c.ref for c in a.of(Completed)] == ["r"], "the copying node is not waited for"


def test_caller_errors_stale_epoch_not_active_unknown_partition_bad_kind() -> None:
    a, b = _pair()
    m = a.machine
    (stale,) = m.replicate(0.0, 1, P, 0, {"x": [1]})
    assert isinstance(stale, Failed) and stale.error == STALE_EPOCH and stale.active == "a"
    (unknown,) = m.replicate(0.0, 2, "nope", 1, {"x": [1]})
    assert isinstance(unknown, Failed) and unknown.error == BAD_REQUEST
    (kind,) = m.replicate(0.0, 3, P, 1, {"x": [1]}, kind="delete-everything")
    assert isinstance(kind, Failed) and kind.error == BAD_REQUEST
    (keys,) = m.replicate(0.0, 4, P, 1, {7: [1]})  # type: ignore[dict-item]
    assert isinstance(keys, Failed) and keys.error == BAD_REQUEST
    (no_txid,) = m.replicate(0.0, 5, P, 1, {"x": [1]}, kind="prepare")
    assert isinstance(no_txid, Failed) and no_txid.error == BAD_REQUEST
    (outcome,) = m.outcome(0.0, 6, P, "t.1", "maybe")
    assert isinstance(outcome, Failed) and outcome.error == BAD_REQUEST
    (not_acting,) = b.machine.replicate(0.0, 7, P, 1, {"x": [1]})
    assert isinstance(not_acting, Failed) and not_acting.error == NOT_ACTIVE
    assert not_acting.active == "a"
    a.table(view(), acting=())  # still active in the table, but not acting (lease, quorum)
    (lapsed,) = a.machine.replicate(0.0, 8, P, 1, {"x": [1]})
    assert isinstance(lapsed, Failed) and lapsed.error == NOT_ACTIVE


def test_not_acting_holds_completion_back() -> None:
    a, b = _pair()
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    a.sync()
    pump(a, b)
    b.sync()
    a.table(view(), acting=())  # the lease lapsed (or quorum went) before the answer came
    pump(b, a)
    assert not a.of(Completed), "a node that does not act acknowledges nothing"
    a.table(view(), acting=(P,))
    assert [c.ref for c in a.of(Completed)] == ["r"]


def test_epoch_moving_away_fails_waiting_records_with_not_active() -> None:
    a, _b = _pair()
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    a.table(view(epoch=2, active="b", current=("b",)))
    (failed,) = a.of(Failed)
    assert failed.ref == "r" and failed.error == NOT_ACTIVE and failed.active == "b"
    assert not a.machine.streams


def test_silent_replica_is_dropped_through_the_table_before_completion() -> None:
    a, _b = _pair(replica_timeout=0.5)
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    a.sync()
    a.sends()  # b never hears of it
    a.now = 0.4
    a.table(view(), acting=(P,))
    assert not a.of(Submit)
    a.now = 0.6
    a.table(view(), acting=(P,))
    (submit,) = a.of(Submit)
    assert submit.entry == {"pt": "drop", "p": P, "e": 1, "node": "b"}
    assert not a.of(Completed), "never acknowledged with a replica silently missing"
    a.now = 0.7
    a.table(view(), acting=(P,))
    assert not a.of(Submit), "the proposal is not repeated faster than replica_timeout"
    a.table(view(epoch=2, current=("a",)), acting=(P,))  # the drop is applied here
    (done,) = a.of(Completed)
    assert done.ref == "r" and done.epoch == 2


def test_replica_that_diverged_is_dropped() -> None:
    a, b = _pair()
    # b holds a record a never had: its place is not a's new stream's base.
    b.machine.data.heads[P] = (99, 3)
    a.table(view(epoch=2), acting=())
    a.table(view(epoch=3), acting=(P,))
    a.machine.streams.clear()  # a restarted: a new stream
    a.table(view(epoch=3), acting=(P,))
    b.table(view(epoch=3))
    pump(a, b)
    b.sync()
    pump(b, a)
    a.table(view(epoch=3), acting=(P,))
    (submit,) = a.of(Submit)
    assert submit.entry["pt"] == "drop" and submit.entry["node"] == "b"


def test_unacknowledged_records_are_sent_again_on_the_tick() -> None:
    a, _b = _pair()
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    assert a.sends("b", REP)  # lost
    a.table(view(), acting=(P,))
    assert not a.sends("b", REP), "not resent before the tick"
    a.take(a.machine.handle(TimerFired(0.1, TICK)))
    (again,) = a.sends("b", REP)
    assert [r[0] for r in again.payload["parts"][0][4]] == [2]


def test_another_nodes_record_applied_here_ends_the_stream() -> None:
    """If this node's copy of P moved to another stream (a restore copy from another active
    node between two looks at the table), its own waiting records may be gone: fail them."""
    a, _b = _pair()
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    a.machine.data.heads[P] = (12345, 7)
    a.table(view(), acting=(P,))
    (failed,) = a.of(Failed)
    assert failed.ref == "r" and failed.error == NOT_ACTIVE
    assert a.machine.streams[P].base == (12345, 7), "a new stream from where the data is"


def test_a_replica_that_still_answers_is_dropped_only_after_the_busy_grace() -> None:
    # Session 13: in a 200,000-row swap's phase two the replicas' disks fell over a second
    # behind while their nodes answered everything else; D12 dropped them (then a copy of
    # each partition, and a moved epoch that fenced the next swap).  A replica that answers
    # -- its acknowledgements come, its durable seq does not move -- is busy, not silent.
    a, _b = _pair(replica_timeout=0.5)
    stream = a.machine.streams[P]
    held = stream.peers["b"].acked
    a.take(a.machine.replicate(0.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    a.sync()
    a.sends()

    def busy_ack(at: float) -> None:
        a.now = at
        a.deliver("b", {"t": ACK, "parts": [[P, 1, stream.stream_id, held, "ok"]]})
        a.table(view(), acting=(P,))

    for at in (0.3, 0.6, 0.9, 1.2, 1.5, 1.8, 2.1, 2.4):
        busy_ack(at)
        assert not a.of(Submit), f"a replica still answering was dropped at {at}"
    assert not a.of(Completed)
    busy_ack(2.6)  # over busy_grace (5) x replica_timeout without progress
    (submit,) = a.of(Submit)
    assert submit.entry == {"pt": "drop", "p": P, "e": 1, "node": "b"}
