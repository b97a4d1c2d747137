"""A coordinator ends every branch it may have opened (issue 14, ``dataplane/ends.py``).

The sequence the network-namespace harness found: a session's first op to a
node is sent, that node is cut off before it answers, the coordinator gives
up (the node seen down, or the call's timeout), and the op reaches the node
later -- it was held in a link's backlog or a TCP buffer.  The node opens the
branch then, with its locks, and before the fix nothing ended it until
``branch_idle``.
"""

from __future__ import annotations

from typing import Any

from tests.unit.test_dataplane_machine import ACC, Net, accounts, get

from nonstop.dataplane.calls import RPC_TIMER
from nonstop.dataplane.ends import END_ALL
from nonstop.dataplane.machine import SWEEP_TIMER
from nonstop.runtime.interface import Received


def _first_op_held(net: Net) -> tuple[int, str, dict[str, Any]]:
    """A session on A whose first op to B is sent but held (B hears nothing yet)."""
    accounts(net, {"b": "B"})
    s = net.ok("A", {"op": "tx.begin"})["s"]
    net.silent.add("B")
    assert net.op("A", {**get("b"), "s": s, "lock": "write"}) is None  # waits for B
    ((_, to, held),) = net.data_reqs("branch.get")
    assert to == "B" and held.get("new")
    return s, f"A.{s}", held


def _deliver_late(net: Net, msg: dict[str, Any]) -> None:
    net.silent.discard("B")
    net.feed("B", Received(now=net.now, sender="A", payload=msg))


def test_a_first_op_that_arrives_after_its_node_was_seen_down_is_ended_when_it_is_up() -> None:
    net = Net("AB")
    _, bid, held = _first_op_held(net)
    net.cluster(up=set(), at="A")  # A sees B down: the session is rolled back
    assert net.replies[-1].payload["error"] == "TransactionLost"  # (retryable)
    assert net.data_reqs("branch.end") == []  # B is not up: nothing sent yet
    _deliver_late(net, held)  # the op reaches B after the heal: B opens the branch
    assert bid in net.machines["B"].branches
    net.cluster(up={"B"}, at="A")  # A sees B up again
    assert bid not in net.machines["B"].branches and net.ended["B"] == [bid]
    assert len(net.machines["A"].ends) == 0  # B answered: nothing owed any more


def test_an_end_that_arrives_before_the_late_op_keeps_the_branch_from_opening() -> None:
    net = Net("AB")
    _, bid, held = _first_op_held(net)
    net.cluster(up=set(), at="A")
    net.silent.discard("B")
    net.cluster(up={"B"}, at="A")  # the end reaches B first
    _deliver_late(net, held)
    assert bid not in net.machines["B"].branches and net.ended["B"] == []
    assert net.sent[-1][2]["p"]["error"] == "BranchRolledBack"


def test_an_end_that_was_lost_is_sent_again_until_the_node_answers() -> None:
    net = Net("AB", rpc_timeout=2.0, sweep_every=1.0, branch_idle=90.0)
    _, bid, held = _first_op_held(net)
    net.now = 2.0
    net.fire("A", RPC_TIMER)  # B never seen down: the call times out
    assert net.replies[-1].payload["error"] == "TransactionLost"
    ((_, to, end),) = net.data_reqs("branch.end")  # sent, but B hears nothing
    assert to == "B" and end["b"] == bid
    _deliver_late(net, held)
    assert bid in net.machines["B"].branches
    net.now = 3.0
    net.fire("A", SWEEP_TIMER)  # 1 s after: not yet (rpc_timeout between tries)
    assert len(net.data_reqs("branch.end")) == 1
    net.now = 4.0
    net.fire("A", SWEEP_TIMER)
    assert len(net.data_reqs("branch.end")) == 2
    assert bid not in net.machines["B"].branches and net.ended["B"] == [bid]
    net.now = 10.0
    net.fire("A", SWEEP_TIMER)  # answered: not sent again
    assert len(net.data_reqs("branch.end")) == 2 and len(net.machines["A"].ends) == 0


def test_a_peer_up_again_ends_the_coordinators_orphans_but_not_its_open_sessions() -> None:
    net = Net("ABC")
    accounts(net, {"c": "C"})
    open_s = net.ok("A", get("c", begin="serializable"))["s"]  # branches on B and C
    # B holds a branch of A that A knows nothing of (A's previous incarnation).
    orphan = {"t": "data.req", "id": 7, "op": "branch.count", "b": "A.1", "new": True, "type": ACC}
    net.feed("B", Received(now=0.0, sender="A", payload=orphan))
    assert {"A.1", f"A.{open_s}"} <= set(net.machines["B"].branches)
    net.cluster(up={"C"}, at="A")  # A sees B down, then up again: the session with a
    net.cluster(up={"B", "C"}, at="A")  # branch on B is rolled back, the orphan too
    assert "A.1" not in net.machines["B"].branches
    (end_all,) = [p for _, to, p in net.data_reqs(END_ALL) if to == "B"]
    assert end_all["b"] == "A." and end_all["keep"] == []
    # A session still open on C when C comes back is kept there.
    s2 = net.ok("A", get("c", begin="serializable"))["s"]
    net.silent.add("C")
    net.cluster(up={"B"}, at="A")
    net.silent.discard("C")
    net.cluster(up={"B", "C"}, at="A")
    assert f"A.{s2}" not in net.machines["C"].branches  # doomed when C left Up
    msgs = [p for _, to, p in net.data_reqs(END_ALL) if to == "C"]
    assert msgs and msgs[-1]["keep"] == []


def test_a_committing_session_is_kept_by_end_all() -> None:
    net = Net("AB")
    objs = accounts(net, {"b": "B"})
    s = net.ok("A", get("b", begin="serializable"))["s"]
    assert net.op("A", {"op": "tx.commit", "s": s, "w": [objs["b"]]}) is None  # deciding
    assert net.machines["A"].sessions_on("B") == [s]
    net.cluster(up=set(), at="A")  # B out of A's view and back during the commit
    net.cluster(up={"B"}, at="A")
    (end_all,) = [p for _, to, p in net.data_reqs(END_ALL) if to == "B"]
    assert end_all["keep"] == [s]
    assert f"A.{s}" in net.machines["B"].branches  # for two-phase commit to take
