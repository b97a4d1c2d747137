"""The real node's composition holds a participant's phase-two acknowledgement while a
copy of the partition may hold the prepared record without its outcome (replication.md
§10c, §10d: the machine's durable holds, hosted by ``replication/host.py``).

The case the demo found: the participant prepared a gtid as the partition's active node,
then lost its stream (a handover) before phase two.  Its copy still holds the prepared
record; so does the new active node, which resolves it from the decision log.  The
acknowledgement (the durable end of the participant's tombstone) must wait -- else the
coordinator lets the log forget the gtid and the new active resolves it as abort.
"""

from __future__ import annotations

import functools
import random
from typing import Any

from tests.dtx_store_harness import NoStore

from nonstop.cluster.node import ClusterConfig
from nonstop.dtx.protocol import K_TOMB
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.net import plain
from nonstop.node.replicated import WAKE, ReplicatedClusterNode, StoreSide
from nonstop.replication.data import K_PREPARED
from nonstop.replication.holds import K_HOLD
from nonstop.replication.machine import RELEASED
from nonstop.runtime.interface import Notify, Persist, Persisted, Received

P = "default.7"
GTID = "A.186"


async def _nothing(name: str, values: Any) -> None:
    return None


def _node() -> ReplicatedClusterNode:
    prepared = {K_PREPARED + P.encode() + b"\0" + GTID.encode(): plain.pack({"ab": None})}
    config = ClusterConfig(name="C", address="127.0.0.1:1", store_timestamp=1, members=("C",))
    return ReplicatedClusterNode(
        config,
        NoStore(),  # type: ignore[arg-type]
        random.Random(1),
        prepared,
        cluster_factory=functools.partial(HaClusterNode, layout=[]),
        store=StoreSide(),
        load=_nothing,
        install=_nothing,
    )


def test_phase_two_without_a_stream_holds_the_ack_until_the_copy_settles() -> None:
    node = _node()
    assert P not in node.replication.streams  # not active: no stream
    node._out = []
    node.outcome(GTID, True)
    assert node.dtx.hold_ack(GTID), "acknowledged while a copy may hold it without its outcome"
    holds = [a for a in node._out if isinstance(a, Persist)]
    assert len(holds) == 1 and holds[0].token % 2 == 1, "the hold is the machine's write"
    assert any(key.startswith(K_HOLD) for key, _ in holds[0].writes)
    # The dtx machine's tombstone write waits until the hold is durable (two disks).
    tomb = Persist(5, ((K_TOMB + GTID.encode(), b"commit"),))
    node._inner(0.0, [tomb])
    assert Persist(10, tomb.writes) not in node._out, "tombstone written before the hold"
    out = node.handle(Persisted(0.0, holds[0].token))
    assert Persist(10, tomb.writes) in out, "the tombstone goes once the hold is durable"
    assert node.dtx.hold_ack(GTID), "the copy still holds it prepared"
    # The new active's outcome record (or a reset without it) arrives here: set directly,
    # so no event touched P; the machine's periodic sweep (`sweep`, 50 ms) looks again.
    node.replication.data.prepared[P].pop(GTID)
    node.replication.data.heads[P] = (77, 5)  # record 5 of C's stream 77 carried it
    out = node.handle(Received(1.0, "C", {"t": WAKE}))
    assert node.dtx.hold_ack(GTID), "released before the active node's copies completed it"
    node.replication._told[P] = (77, 4)
    node.handle(Received(1.1, "C", {"t": WAKE}))
    assert node.dtx.hold_ack(GTID), "record 5 is not completed on the active node yet"
    # The active node tells (with its next records, or at its resend tick) that its copies
    # completed record 5: the outcome is durable wherever it may be promoted (seed 3300015).
    node.replication._told[P] = (77, 5)
    out = node.handle(Received(1.2, "C", {"t": WAKE}))
    assert not node.dtx.hold_ack(GTID)
    assert Notify(RELEASED, {"g": GTID}) in out


def test_a_gtid_this_copy_does_not_hold_is_not_held() -> None:
    node = _node()
    node._out = []
    node.outcome("B.9", True)
    assert not node.dtx.hold_ack("B.9")
    tomb = Persist(6, ((K_TOMB + b"B.9", b"commit"),))
    node._inner(0.0, [tomb])
    assert Persist(12, tomb.writes) in node._out, "nothing held: the tombstone goes at once"


def test_a_group_commit_of_tokens_is_one_event_with_each_token_delivered() -> None:
    node = _node()
    node._out = []
    node.outcome(GTID, True)
    hold = next(a for a in node._out if isinstance(a, Persist))
    tomb = Persist(5, ((K_TOMB + GTID.encode(), b"commit"),))
    node._inner(0.0, [tomb])
    # The hold's token and a token of the DtxClusterNode (even: 2t) durable together.
    out = node.handle_persisted(0.0, [hold.token, 2 * 77])
    assert Persist(10, tomb.writes) in out, "the hold's token reached the machine in the batch"
    assert not node._holds_writing, "the hold is known durable"
