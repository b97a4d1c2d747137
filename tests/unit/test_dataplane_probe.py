"""A data request lost with a peer connection fails at the next probe, not at
``rpc_timeout`` (``dataplane/calls.py``, data-path.md §4).

Found on real nodes (replication.md §10e): at a takeover the promoted node's loop
stalled loading its copy, the peer connection A–C dropped and came back, and the
``branch.get`` requests in flight on it were never answered: seven transfers each
waited the full ``rpc_timeout`` (15 s) and failed ``Unavailable``.  Now a call
unanswered for ``probe_after`` is probed; a peer that does not run it makes it fail
at once with a retryable error (``Unavailable`` for a committing op: its outcome is
unknown).
"""

from __future__ import annotations

from typing import Any

from tests.unit.test_dataplane_machine import ACC, Net, accounts, get

from nonstop.dataplane.calls import PROBE, PROBED
from nonstop.dataplane.machine import SWEEP_TIMER


def _lost_count(net: Net) -> dict[str, Any] | None:
    """A session on A with branches on A, B, C whose next op's request to B is lost."""
    accounts(net, {"c": "C"})
    s = net.ok("A", get("c", begin="serializable"))["s"]
    net.silent.add("B")
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC}) is None
    net.silent.discard("B")  # the connection is back; what it carried is gone
    return {"s": s}


def test_a_lost_request_fails_retryably_at_the_first_probe() -> None:
    net = Net("ABC", probe_after=2.0, sweep_every=1.0)
    _lost_count(net)
    net.now = 1.0
    net.fire("A", SWEEP_TIMER)
    assert not [p for _, to, p in net.sent if p.get("t") == PROBE], "not before probe_after"
    net.now = 2.5
    net.fire("A", SWEEP_TIMER)
    probes = [(a, to) for a, to, p in net.sent if p.get("t") == PROBE]
    assert probes == [("A", "B")]
    answers = [p for a, _, p in net.sent if p.get("t") == PROBED]
    assert answers and answers[0]["r"] is False
    reply = net.replies[-1].payload
    assert reply["error"] == "BranchRolledBack" and "lost branch.count" in reply["message"], reply
    assert net.machines["A"].stats["calls_lost"] == 1


def test_a_request_still_running_on_the_peer_is_waited_for() -> None:
    net = Net("ABC", probe_after=2.0, sweep_every=1.0)
    accounts(net, {"c": "C"})
    s = net.ok("A", get("c", begin="serializable"))["s"]
    net.hold = lambda ex: ex.op == "branch.count"  # slow stores: the op runs on
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC}) is None
    net.now = 2.5
    net.fire("A", SWEEP_TIMER)
    answers = [p for _, _, p in net.sent if p.get("t") == PROBED]
    assert answers and all(p["r"] is True for p in answers)
    net.hold = lambda ex: False
    net.release_held()
    reply = net.replies[-1].payload
    assert "error" not in reply, reply
    assert net.machines["A"].stats["calls_lost"] == 0
