"""Promotion and restore on the replication machine (replication.md sections 5-6).

A node that starts acting for a partition asks the layer above to resolve
each of its prepared records from the decision log (and again for one still
there after ``resolve_after``); the outcome it is given is replicated like any
record.  A copying node gets a ``reset`` and the objects in batches of
``batch``, each acknowledged before the next, while new records flow to it;
:meth:`copy_done` turns true only when it holds everything.
"""

from __future__ import annotations

from tests.replication_harness import Node, P, pump, settle, view

from nonstop.replication import Completed, ReplicationConfig, Resolve
from nonstop.replication.machine import REP


def _prepared_pair() -> tuple[Node, Node]:
    a, b = Node("a"), Node("b")
    v = view()
    a.table(v, acting=(P,))
    b.table(v)
    a.take(a.machine.replicate(0.0, "p1", P, 1, {"x": [1]}, kind="prepare", txid="c.1"))
    a.take(a.machine.replicate(0.0, "p2", P, 1, {"y": [2]}, kind="prepare", txid="c.2"))
    a.table(v, acting=(P,))
    settle(a, b)
    assert {c.ref for c in a.of(Completed)} == {"p1", "p2"}
    return a, b


def test_promoted_replica_resolves_its_prepared_records_from_the_log() -> None:
    _a, b = _prepared_pair()
    assert b.machine.data.prepared_of(P).keys() == {"c.1", "c.2"}
    promoted = view(epoch=2, active="b", current=("b",))
    b.table(promoted)
    assert not b.of(Resolve), "active in the table but not acting yet: nothing"
    b.table(promoted, acting=(P,))
    assert sorted(r.txid for r in b.of(Resolve)) == ["c.1", "c.2"]
    # The layer above found commit for c.1 and abort for c.2 in the decision log.
    b.take(b.machine.outcome(1.0, "o1", P, "c.1", "commit"))
    b.take(b.machine.outcome(1.0, "o2", P, "c.2", "abort"))
    b.table(promoted, acting=(P,))
    b.sync()
    b.table(promoted, acting=(P,))
    assert {c.ref for c in b.of(Completed)} == {"o1", "o2"}
    assert b.machine.data.values(P) == {"x": [1]}
    assert b.machine.data.prepared_of(P) == {}


def test_a_prepared_record_left_without_outcome_is_resolved_again() -> None:
    cfg = ReplicationConfig(resolve_after=1.0)
    a = Node("a", cfg)
    v = view(current=("a",))
    a.table(v, acting=(P,))
    a.take(a.machine.replicate(0.0, "p", P, 1, {"x": [1]}, kind="prepare", txid="c.1"))
    a.table(v, acting=(P,))
    assert not a.of(Resolve)
    a.now = 0.5
    a.table(v, acting=(P,))
    assert not a.of(Resolve)
    a.now = 1.6
    a.table(v, acting=(P,))
    assert [r.txid for r in a.of(Resolve)] == ["c.1"]


def test_ignore_prepared_mutant_loses_them() -> None:
    """The broken variant the simulator must catch really is broken."""
    cfg = ReplicationConfig(mutant="ignore_prepared")
    b = Node("b", cfg)
    a = Node("a")
    v = view()
    a.table(v, acting=(P,))
    b.table(v)
    a.take(a.machine.replicate(0.0, "p", P, 1, {"x": [1]}, kind="prepare", txid="c.1"))
    a.table(v, acting=(P,))
    settle(a, b)
    b.table(view(epoch=2, active="b", current=("b",)), acting=(P,))
    assert not b.of(Resolve) and b.machine.data.prepared_of(P) == {}


def test_restore_copy_in_batches_with_new_records_flowing_meanwhile() -> None:
    cfg = ReplicationConfig(batch=2)
    a, c = Node("a", cfg), Node("c", cfg)
    alone = view(current=("a",))
    a.table(alone, acting=(P,))
    for i in range(5):
        a.take(a.machine.replicate(0.0, i, P, 1, {f"k{i}": [i]}))
    a.take(a.machine.replicate(0.0, "p", P, 1, {"z": [0]}, kind="prepare", txid="c.7"))
    a.table(alone, acting=(P,))
    a.sync()
    a.table(alone, acting=(P,))
    assert len(a.of(Completed)) == 6, "no replica: the local disk is enough"
    c.machine.data.objects[P] = {"garbage": [666]}  # what c held before it was dropped
    copying = view(epoch=2, current=("a", "c"), copying=("c",))
    a.table(copying, acting=(P,))
    c.table(copying)
    (first,) = a.sends("c", REP)
    assert [r[1] for r in first.payload["parts"][0][4]] == ["reset"]
    c.deliver("a", first.payload)
    a.sync()
    c.sync()
    pump(c, a)
    a.table(copying, acting=(P,))
    (second,) = a.sends("c", REP)
    records = second.payload["parts"][0][4]
    assert [r[1] for r in records] == ["copy"], "one batch in flight at a time"
    assert records[0][3] == {"k0": [0], "k1": [1]}
    c.deliver("a", second.payload)
    # A new write while the copy runs: it flows to c as to a sync replica.
    a.take(a.machine.replicate(0.0, "new", P, 2, {"k0": [0, 100]}))
    a.table(copying, acting=(P,))
    assert not a.machine.copy_done(P, "c")
    for _ in range(10):
        a.sync()
        c.sync()
        pump(a, c)
        pump(c, a)
        a.table(copying, acting=(P,))
    assert a.machine.copy_done(P, "c")
    assert c.machine.data.values(P) == a.machine.data.values(P)
    assert c.machine.data.values(P)["k0"] == [0, 100]
    assert "garbage" not in c.machine.data.values(P)
    assert c.machine.data.prepared_of(P) == {"c.7": {"z": [0]}}
    copies = a.machine.stats["copies"]
    assert copies == 1


def test_copy_done_needs_every_record_not_only_the_batches() -> None:
    a, c = Node("a"), Node("c")
    copying = view(epoch=2, current=("a", "c"), copying=("c",))
    a.table(copying, acting=(P,))
    c.table(copying)
    settle(a, c)
    assert a.machine.copy_done(P, "c")
    a.take(a.machine.replicate(0.0, "w", P, 2, {"x": [1]}))
    a.table(copying, acting=(P,))
    a.sync()
    a.table(copying, acting=(P,))
    assert not a.machine.copy_done(P, "c"), "c lacks the newest record"
    assert not a.of(Completed), "a finished copy is waited for like an in-sync replica"
    settle(a, c)
    assert a.machine.copy_done(P, "c")
    assert [x.ref for x in a.of(Completed)] == ["w"]


def test_async_copying_node_needs_no_copy() -> None:
    a = Node("a")
    v = view(epoch=2, current=("a", "d"), copying=("d",), sync=("a",))
    a.table(v, acting=(P,))
    assert a.machine.copy_done(P, "d")
    assert not a.machine.copy_done(P, "zz")
