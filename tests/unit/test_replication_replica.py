"""The replica side of the replication machine (replication.md section 3).

Fencing (I2): a lower epoch is refused ``stale``, a higher one ``retry``, a
sender that is not the epoch's active node ``stale``.  Order (I4): records
apply in the stream's order, early ones are buffered, duplicates skipped.
The answer goes out only after ``Persisted``.  Prepared records are kept until
their outcome.  A restore copy's ``reset`` replaces what the node held.  Bad
input never raises.
"""

from __future__ import annotations

from typing import Any

from tests.replication_harness import Node, P, view

from nonstop.replication.data import K_HEAD, K_PREPARED
from nonstop.replication.machine import ACK, REP
from nonstop.runtime.interface import Log, Persist, Received

STREAM = 77


def _rep(epoch: int, records: list[list[Any]], base: list[int] | None = None) -> dict[str, Any]:
    return {"t": REP, "parts": [[P, epoch, STREAM, base or [0, 0], records]]}


def _commit(seq: int, key: str, value: Any) -> list[Any]:
    return [seq, "commit", None, {key: value}, None]


def _replica(epoch: int = 3) -> Node:
    b = Node("b")
    b.table(view(epoch=epoch))
    return b


def _acks(node: Node) -> list[list[Any]]:
    """The ack parts sent to a, without the echo of ``completed`` (its own test below)."""
    return [part[:5] for m in node.sends("a", ACK) for part in m.payload["parts"]]


def _acks_whole(node: Node) -> list[list[Any]]:
    return [part for m in node.sends("a", ACK) for part in m.payload["parts"]]


def test_applies_at_its_epoch_and_answers_only_after_persisted() -> None:
    b = _replica()
    b.deliver("a", _rep(3, [_commit(1, "x", [1])]))
    assert not _acks(b), "no answer before the record is durable"
    assert b.of(Persist)[0].writes[-1][0] == K_HEAD + b"P"
    b.out.clear()
    b.deliver("a", _rep(3, [_commit(2, "x", [1, 2])]))
    # The first record is not durable yet: the replica answers at once with what it holds
    # durably (nothing), so that its active node hears it (busy, not silent: busy_grace).
    assert _acks(b) == [[P, 3, STREAM, 0, "ok"]]
    b.sync()
    assert _acks(b) == [[P, 3, STREAM, 2, "ok"]]
    assert b.machine.data.values(P) == {"x": [1, 2]}


def test_a_busy_replica_answers_at_once_at_most_every_quarter_of_the_timeout() -> None:
    b = _replica()
    b.deliver("a", _rep(3, [_commit(1, "x", [1])]))
    assert not _acks(b)
    b.deliver("a", _rep(3, [_commit(2, "x", [1, 2])]))
    assert len(_acks(b)) == 1
    b.out.clear()
    b.deliver("a", _rep(3, [_commit(3, "x", [1, 2, 3])]))
    assert not _acks(b), "answered again within a quarter of replica_timeout"
    b.now += b.machine.config.replica_timeout / 4
    b.deliver("a", _rep(3, [_commit(4, "x", [4])]))
    assert _acks(b) == [[P, 3, STREAM, 0, "ok"]]


def test_lower_epoch_is_refused_stale_and_changes_nothing() -> None:
    b = _replica(epoch=3)
    b.deliver("a", _rep(2, [_commit(1, "x", [1])]))
    assert _acks(b) == [[P, 2, STREAM, 0, "stale"]]
    assert not b.of(Persist) and b.machine.data.values(P) == {}


def test_higher_epoch_waits_for_the_log_retry() -> None:
    b = _replica(epoch=3)
    b.deliver("a", _rep(4, [_commit(1, "x", [1])]))
    assert _acks(b) == [[P, 4, STREAM, 0, "retry"]]
    assert not b.of(Persist)
    b.table(view(epoch=4))  # the log caught up
    b.deliver("a", _rep(4, [_commit(1, "x", [1])]))
    b.sync()
    assert _acks(b) == [[P, 4, STREAM, 1, "ok"]]


def test_a_sender_that_is_not_the_active_node_is_refused() -> None:
    b = _replica()
    b.deliver("c", _rep(3, [_commit(1, "x", [1])]))
    assert [p[4] for m in b.sends("c", ACK) for p in m.payload["parts"]] == ["stale"]
    b2 = Node("b")
    b2.table(view(epoch=3, current=("a", "c")))  # b2 is not in the list
    b2.deliver("a", _rep(3, [_commit(1, "x", [1])]))
    assert [p[4] for p in _acks(b2)] == ["stale"]


def test_out_of_order_records_are_buffered_and_applied_in_order() -> None:
    b = _replica()
    b.deliver("a", _rep(3, [_commit(3, "x", [1, 2, 3]), _commit(2, "x", [1, 2])]))
    assert not b.of(Persist)
    assert _acks(b) == [[P, 3, STREAM, 0, "ok"]]
    b.deliver("a", _rep(3, [_commit(1, "x", [1])]))
    b.sync()
    assert _acks(b) == [[P, 3, STREAM, 3, "ok"]]
    assert b.machine.data.values(P) == {"x": [1, 2, 3]}
    assert b.machine.data.head(P) == (STREAM, 3)


def test_duplicates_are_idempotent() -> None:
    b = _replica()
    message = _rep(3, [_commit(1, "x", [1]), _commit(2, "y", [2])])
    b.deliver("a", message)
    b.sync()
    assert _acks(b) == [[P, 3, STREAM, 2, "ok"]]
    b.deliver("a", message)
    assert not b.of(Persist), "nothing applied twice"
    assert _acks(b) == [[P, 3, STREAM, 2, "ok"]], "answered at once with what is durable"
    assert b.machine.data.values(P) == {"x": [1], "y": [2]}


def test_a_place_that_is_not_the_stream_base_is_diverged() -> None:
    b = _replica()
    b.machine.data.heads[P] = (5, 9)
    b.deliver("a", _rep(3, [_commit(1, "x", [1])], base=[5, 8]))
    assert _acks(b) == [[P, 3, STREAM, 0, "diverged"]]
    assert b.machine.data.values(P) == {}
    b.deliver("a", {"t": REP, "parts": [[P, 3, STREAM + 1, [5, 9], [_commit(1, "x", [1])]]]})
    b.sync()
    assert _acks(b) == [[P, 3, STREAM + 1, 1, "ok"]], "from exactly the base it applies"


def test_prepared_record_is_kept_until_its_outcome() -> None:
    b = _replica()
    prepare = [1, "prepare", "c.1", {"x": [1]}, None]
    b.deliver("a", _rep(3, [prepare, [2, "prepare", "c.2", {"y": [2]}, None]]))
    b.sync()
    assert b.machine.data.prepared_of(P) == {"c.1": {"x": [1]}, "c.2": {"y": [2]}}
    assert b.machine.data.values(P) == {}, "prepared is not applied"
    assert K_PREPARED + b"P\0c.1" in b.disk
    b.deliver(
        "a", _rep(3, [[3, "outcome", "c.1", {}, "commit"], [4, "outcome", "c.2", {}, "abort"]])
    )
    b.sync()
    assert b.machine.data.values(P) == {"x": [1]}
    assert b.machine.data.prepared_of(P) == {}
    assert not any(k.startswith(K_PREPARED) for k in b.disk)
    b.deliver("a", _rep(3, [[5, "outcome", "c.1", {}, "commit"]]))
    b.sync()
    assert b.machine.data.values(P) == {"x": [1]}, "an outcome without a record is a no-op"


def test_reset_replaces_what_the_node_held_then_copy_batches_fill_it() -> None:
    b = _replica()
    b.machine.data.heads[P] = (5, 9)
    b.machine.data.objects[P] = {"stale": [0]}
    records = [
        [4, "reset", None, {"c.9": {"z": [9]}}, "b"],
        [5, "copy", None, {"x": [1], "y": [2]}, "b"],
        [6, "copy", None, {"q": [3]}, "someone-else"],
    ]
    b.deliver("a", _rep(3, records, base=[1, 1]))
    b.sync()
    assert b.machine.data.values(P) == {"x": [1], "y": [2]}
    assert b.machine.data.prepared_of(P) == {"c.9": {"z": [9]}}
    assert _acks(b) == [[P, 3, STREAM, 6, "ok"]]


def test_bad_input_is_dropped_and_logged_never_raised() -> None:
    b = _replica()
    bad: list[Any] = [
        {"t": REP},
        {"t": REP, "parts": "nope"},
        {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [[-1, "commit", None, {}, None]]]]},
        {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [[0, "commit", None, {}, None]]]]},
        {"t": REP, "parts": [[P, "3", STREAM, [0, 0], []]]},
        {"t": REP, "parts": [[P, 3, -5, [0, 0], []]]},
        {"t": REP, "parts": [[P, 3, STREAM, "base", []]]},
        {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [[1, "explode", None, {}, None]]]]},
        {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [[1, "commit", None, {1: 2}, None]]]]},
        {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [[1, "outcome", "g", {}, "perhaps"]]]]},
        {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [[1, "prepare", None, {}, None]]]]},
        {"t": "rep.unknown"},
        {"t": ACK, "parts": [["x", 1, 2, 3]]},
        {"t": ACK, "parts": "x"},
        [1, 2, 3],
    ]
    for payload in bad:
        b.take(b.machine.handle(Received(0.0, "a", payload)))
    assert not b.of(Persist)
    assert b.machine.data.values(P) == {}
    assert len(b.of(Log)) >= 12
    b.deliver("a", {"t": REP, "parts": [["unknown-partition", 3, STREAM, [0, 0], []]]})
    assert [p[4] for p in _acks(b)] == ["unknown"]


def test_state_survives_a_restart_from_the_disk() -> None:
    b = _replica()
    b.deliver("a", _rep(3, [_commit(1, "x", [1]), [2, "prepare", "c.1", {"y": [1]}, None]]))
    b.sync()
    b.restart()
    assert b.machine.data.values(P) == {"x": [1]}
    assert b.machine.data.prepared_of(P) == {"c.1": {"y": [1]}}
    assert b.machine.data.head(P) == (STREAM, 2)
    b.table(view(epoch=3))
    b.deliver("a", _rep(3, [_commit(2, "x", [9]), _commit(3, "x", [1, 3])]))
    b.sync()
    assert b.machine.data.values(P) == {"x": [1, 3]}, "seq 2 was a duplicate"


def test_the_active_nodes_completed_seq_is_kept_and_echoed_in_the_acks() -> None:
    # replication.md §6, holds: a part carries the stream's ``completed``; the replica keeps
    # it (a hold on a partition it has no stream for waits for it) and echoes it, so the
    # active node tells it again when a message is lost.  A part may carry no record.
    b = _replica()
    part = [P, 3, STREAM, [0, 0], [_commit(1, "x", [1])], 0]
    b.deliver("a", {"t": REP, "parts": [part]})
    b.sync()
    assert _acks_whole(b) == [[P, 3, STREAM, 1, "ok", 0]]
    b.out.clear()
    b.deliver("a", {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [], 1]]})
    assert _acks_whole(b) == [[P, 3, STREAM, 1, "ok", 1]], "nothing new, answered at once"
    assert b.machine._told[P] == (STREAM, 1)
    b.out.clear()
    b.deliver("a", {"t": REP, "parts": [[P, 3, STREAM, [0, 0], [], -1]]})
    assert not _acks(b), "a malformed completed seq: the part is dropped"
    # A stale sender's word is not kept (fencing).
    b.deliver("c", {"t": REP, "parts": [[P, 3, STREAM + 5, [0, 0], [], 9]]})
    assert b.machine._told[P] == (STREAM, 1)
