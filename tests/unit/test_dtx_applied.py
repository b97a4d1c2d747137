"""A participant whose phase-two acknowledgement is held still tells the coordinator it
applied the outcome (``dtx.applied``): the client's commit reply goes then (read your
writes), while the gtid stays with the coordinator -- and so in the decision log -- until
every real acknowledgement arrived (dtx.md sections 3 and 4, held acknowledgements)."""

from __future__ import annotations

import random
from typing import Any

from tests.unit.test_node_replicated_hold import NoStore

from nonstop.dtx.decisions import COMMIT
from nonstop.dtx.protocol import ACK, APPLIED, CoordTx, DtxNode
from nonstop.runtime.interface import Notify, Received, Reply, Send


def _coordinator() -> tuple[DtxNode, CoordTx]:
    node = DtxNode("A", NoStore(), random.Random(1), {})
    tx = CoordTx("A.1", 1, {"B": [], "C": []}, 7, "finishing", outcome=COMMIT)
    tx.held_reply = {"ok": True, "outcome": COMMIT, "g": "A.1", "reads": {}}
    tx.reply_by = 10.0
    node.coord[tx.gtid] = tx
    return node, tx


def _replies(out: list[Any]) -> list[Reply]:
    return [a for a in out if isinstance(a, Reply)]


def test_the_reply_goes_once_every_participant_applied_but_the_gtid_waits_for_the_acks() -> None:
    node, _ = _coordinator()
    assert not _replies(node.handle(Received(0.1, "B", {"t": APPLIED, "g": "A.1"})))
    out = node.handle(Received(0.2, "C", {"t": ACK, "g": "A.1"}))
    assert [r.payload for r in _replies(out)] == [
        {"ok": True, "outcome": COMMIT, "g": "A.1", "reads": {}}
    ], "applied by B, acknowledged by C: no 'unapplied' named"
    assert "A.1" in node.coord, "forgotten while B still holds its acknowledgement"
    out = node.handle(Received(0.3, "B", {"t": ACK, "g": "A.1"}))
    assert not _replies(out), "one reply only"
    assert "A.1" not in node.coord and Notify("dtx.finished", {"g": "A.1", "o": COMMIT}) in out


def test_applied_from_a_node_that_is_not_a_participant_is_dropped() -> None:
    node, tx = _coordinator()
    node.handle(Received(0.1, "B", {"t": APPLIED, "g": "A.1"}))
    assert not _replies(node.handle(Received(0.2, "D", {"t": APPLIED, "g": "A.1"})))
    assert tx.applied == {"B"}


def test_a_held_participant_says_applied_and_acknowledges_on_release() -> None:
    node = DtxNode("B", NoStore(), random.Random(1), {})
    held = {"A.1"}
    node.hold_ack = held.__contains__
    node.tombs["A.1"] = COMMIT
    node._out = []
    node._ack("A", "A.1")
    assert node._out == [Send("A", {"t": APPLIED, "g": "A.1"})]
    held.clear()
    assert Send("A", {"t": ACK, "g": "A.1"}) in node.released(0.5, "A.1")
