"""D12 silence measured from the first record a replica has not acknowledged
(``ReplicationConfig.silence_from_write``, which real nodes set).

A replica that acknowledged everything and then had nothing to acknowledge
(an idle partition) is not silent: the first write after ``replica_timeout``
of idleness must not drop it (found on real nodes, replication.md §10c).
"""

from __future__ import annotations

from tests.replication_harness import Node, P, pump, settle, view

from nonstop.replication import Completed, ReplicationConfig, Submit


def test_a_write_after_idleness_does_not_drop_a_caught_up_replica() -> None:
    cfg = ReplicationConfig(replica_timeout=0.5, silence_from_write=True)
    a, b = Node("a", cfg), Node("b", cfg)
    a.table(view(), acting=(P,))
    b.table(view())
    settle(a, b)
    a.of(Completed)
    for node in (a, b):
        node.now = 5.0  # idle for ten replica timeouts
    a.take(a.machine.replicate(5.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    assert not a.of(Submit), "a caught-up replica is not silent"
    a.sync()
    pump(a, b)
    b.sync()
    pump(b, a)
    a.table(view(), acting=(P,))
    assert [c.ref for c in a.of(Completed)] == ["r"]


def test_a_replica_silent_after_the_write_is_still_dropped() -> None:
    cfg = ReplicationConfig(replica_timeout=0.5, silence_from_write=True)
    a, b = Node("a", cfg), Node("b", cfg)
    a.table(view(), acting=(P,))
    b.table(view())
    settle(a, b)
    a.now = 5.0
    a.take(a.machine.replicate(5.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    a.sends()  # b never hears of it
    a.now = 5.6
    a.table(view(), acting=(P,))
    (submit,) = a.of(Submit)
    assert submit.entry == {"pt": "drop", "p": P, "e": 1, "node": "b"}


def test_without_the_setting_an_idle_partition_drops_its_replica_at_the_next_write() -> None:
    """The simulator's behaviour (the default), kept until its seeds are checked with it."""
    cfg = ReplicationConfig(replica_timeout=0.5)
    a, b = Node("a", cfg), Node("b", cfg)
    a.table(view(), acting=(P,))
    b.table(view())
    settle(a, b)
    a.now = 5.0
    a.take(a.machine.replicate(5.0, "r", P, 1, {"x": [1]}))
    a.table(view(), acting=(P,))
    assert a.of(Submit)
