"""The active node drains before a handover by priority (replication.md §10e).

When a node that outranks the active node finished its restore copy, ``restored``
makes it active (D9).  Before: the old active node kept taking commits up to the
moment the entry applied, and every record then in flight failed with an unknown
outcome (``Unavailable`` to the client; the record might be on the new active).
Now, from the moment that copy is finished, the active node refuses new commits
and prepares with ``NotActive`` (nothing made: retryable) and ``copy_done`` turns
true only once its records completed and every replica holds them, so nothing is
in flight when the entry applies.  Outcome records still go (a prepared record
needs its outcome); past ``handover_drain`` without the entry it takes commits
again.
"""

from __future__ import annotations

from dataclasses import replace

from tests.replication_harness import Node, P, pump, view

from nonstop.replication import Completed, Failed, ReplicationConfig
from nonstop.replication.actions import NOT_ACTIVE

CFG = ReplicationConfig(handover_drain=1.0)
EPOCH = 2


def _restoring(outranks: bool = True) -> tuple[Node, Node, Node, object]:
    """a active, c in sync, b copying (before a in the priority list when ``outranks``)."""
    a, b, c = Node("a", CFG), Node("b", CFG), Node("c", CFG, seed=3)
    v = view(epoch=EPOCH, current=("a", "c", "b"), copying=("b",))
    if outranks:
        v = replace(v, outranking=("b",))
    a.table(v, acting=(P,))
    b.table(v)
    c.table(v)
    return a, b, c, v


def _pump_all(v: object, *nodes: Node) -> None:
    for _ in range(10):
        for n in nodes:
            n.sync()
        for src in nodes:
            for dst in nodes:
                if src is not dst:
                    pump(src, dst)
        nodes[0].table(v, acting=(P,))  # type: ignore[arg-type]
        for n in nodes[1:]:
            n.table(v)  # type: ignore[arg-type]


def test_after_the_copy_of_an_outranking_node_new_commits_are_refused_not_made() -> None:
    a, b, c, v = _restoring()
    _pump_all(v, a, b, c)
    assert a.machine.copy_done(P, "b"), "drained: nothing of a's in flight"
    last = a.machine.streams[P].last
    (failed,) = a.take(a.machine.replicate(0.1, "w", P, EPOCH, {"x": [1]}))
    assert isinstance(failed, Failed) and failed.error == NOT_ACTIVE and failed.active == "b"
    assert a.machine.streams[P].last == last, "nothing made: the retry cannot apply twice"
    assert a.machine.handing_over(P) == "b"
    # An outcome still goes into the stream (its prepared record needs it).
    assert not [x for x in a.machine.outcome(0.1, None, P, "t.1", "abort") if isinstance(x, Failed)]


def test_a_record_in_flight_when_the_copy_finishes_completes_before_copy_done() -> None:
    a, b, c, v = _restoring()
    a.take(a.machine.replicate(0.0, "w", P, EPOCH, {"x": [1]}))
    a.table(v, acting=(P,))  # type: ignore[arg-type]
    # The copy to b runs and b acknowledges w too; c holds its acknowledgement back.
    for _ in range(10):
        a.sync()
        b.sync()
        pump(a, b)
        pump(b, a)
        a.table(v, acting=(P,))  # type: ignore[arg-type]
    assert a.machine.streams[P].peers["b"].copy_finished()
    assert not a.machine.copy_done(P, "b"), "w is in flight: no handover yet"
    assert a.machine.handing_over(P) == "b", "and nothing new is taken meanwhile"
    _pump_all(v, a, b, c)
    assert [x.ref for x in a.of(Completed)] == ["w"], "acknowledged, not failed at the handover"
    assert a.machine.copy_done(P, "b")


def test_the_drain_is_bounded_and_absent_without_a_handover() -> None:
    a, b, c, v = _restoring()
    _pump_all(v, a, b, c)
    assert a.machine.handing_over(P) == "b"
    a.now = 1.5  # past handover_drain and the entry never applied: take commits again
    a.table(v, acting=(P,))  # type: ignore[arg-type]
    assert a.machine.handing_over(P) is None
    acts = a.take(a.machine.replicate(1.5, "late", P, EPOCH, {"x": [2]}))
    assert not [x for x in acts if isinstance(x, Failed)]
    # A copying node that does not outrank the active one: no drain at all.
    a2, b2, c2, v2 = _restoring(outranks=False)
    _pump_all(v2, a2, b2, c2)
    assert a2.machine.copy_done(P, "b") and a2.machine.handing_over(P) is None
    acts = a2.take(a2.machine.replicate(0.1, "w", P, EPOCH, {"x": [1]}))
    assert not [x for x in acts if isinstance(x, Failed)]


def test_view_of_names_the_copying_nodes_that_outrank_the_active_one() -> None:
    from nonstop.ha.partition_table import Partition
    from nonstop.replication.view import view_of

    part = Partition(
        "p",
        "default",
        [["b", "sync"], ["a", "sync"], ["c", "sync"]],
        current=["a", "c", "b"],
        copying=["b"],
        active="a",
        epoch=3,
    )
    assert view_of(part).outranking == ("b",)
    part.copying = ["c"]
    assert view_of(part).outranking == ()
    part.active = None
    assert view_of(part).outranking == ()


def test_a_copy_still_running_to_another_node_does_not_hold_the_handover() -> None:
    a, b, c = Node("a", CFG), Node("b", CFG), Node("c", CFG, seed=3)
    v = view(epoch=EPOCH, current=("a", "b", "c"), copying=("b", "c"))
    v = replace(v, outranking=("b",))
    for n in (a, b, c):
        n.table(v, acting=(P,) if n is a else ())
    a.machine.data.objects.setdefault(P, {})  # nothing to copy: both copies are one reset
    for _ in range(10):  # b acknowledges, c hears nothing (its copy is still running)
        a.sync()
        b.sync()
        pump(a, b)
        pump(b, a)
        a.table(v, acting=(P,))
    assert a.machine.streams[P].peers["b"].copy_finished()
    assert not a.machine.streams[P].peers["c"].copy_finished()
    assert a.machine.copy_done(P, "b"), "c is copied again by b once b is active"
