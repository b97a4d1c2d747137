"""Routing by partition in the data-plane machine (ha.md "Routing by partition (as built)").

The machines of ``test_dataplane_machine`` (the in-memory :class:`Net`), with a
partition table in their view and a placement: references, unique keys and
creates go to the partition's active node, queries ask each partition once, and
a node refuses (``NotActive``, retryable) an op or a vote for a partition it does
not act for at that epoch.
"""

from __future__ import annotations

from typing import Any

from tests.unit.test_dataplane_machine import ACC, LOCATIONS, Net, get

from nonstop import errors
from nonstop.dataplane.calls import PROBE, PROBED
from nonstop.dataplane.ends import END_ALL
from nonstop.dataplane.events import PartitionView
from nonstop.dataplane.lapse_waits import LAPSE_TIMER
from nonstop.dataplane.placement import routing_key
from nonstop.model.codec import pack, unpack
from nonstop.model.ref import Ref
from nonstop.runtime.interface import Received

P_LOC = {"P0": 100, "P1": 101}


class KeyPlacement:
    """Account numbers starting with "a" live in P0, the others in P1; no key: P0."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, bytes | None]] = []

    def partition_for(self, type_name: str, key: bytes | None) -> str:
        self.asked.append((type_name, key))
        if key is None or str(unpack(key)).startswith("a"):
            return "P0"
        return "P1"

    def unique_field(self, type_name: str) -> str | None:
        return "number"


class PNet(Net):
    """Two nodes, P0 active on A, P1 active on B (epochs 3 and 5)."""

    def __init__(self, names: str = "AB", **config: Any) -> None:
        self.placement = KeyPlacement()
        self.acting_now: dict[str, set[str]] = {}
        self.table = {"P0": ("A", 3), "P1": ("B", 5)}
        super().__init__(names, placement=self.placement, **config)
        for n, m in self.machines.items():
            m.config.acting = self._acting_of(n)

    def _acting_of(self, node: str) -> Any:
        def acting(now: float, partition: str) -> bool:
            allowed = self.acting_now.get(node)
            active = self.table[partition][0] == node
            return active and (allowed is None or partition in allowed)

        return acting

    def partitions_seen_by(self, node: str) -> dict[str, Any]:
        return {
            name: PartitionView(
                name, P_LOC[name], active, epoch, ((active, "sync"),), active == node
            )
            for name, (active, epoch) in self.table.items()
        }


def pref(partition: str, n: int) -> bytes:
    return Ref.make(P_LOC[partition], 3, n).raw


def pobj(partition: str, n: int, number: str) -> list[Any]:
    return [pref(partition, n), ACC, 1, pack({"number": number})]


def put(net: PNet, node: str, o: list[Any], number: str) -> None:
    net.stores[node].add(o, pack({"number": number}))


def test_unique_lookup_asks_only_the_keys_partition_active_node() -> None:
    net = PNet()
    b = pobj("P1", 1, "b")
    put(net, "B", b, "b")
    reply = net.ok("A", get("b", begin="serializable", lock="write"))
    assert reply["o"] == b
    # No probe on A, no fan-out: one data.req, to B, for P1 only, fenced at epoch 5.
    assert net.stores["A"].execs == []
    ((_, to, msg),) = net.data_reqs()
    assert to == "B" and msg["op"] == "branch.get"
    assert msg["locs"] == [P_LOC["P1"]] and msg["pe"] == [["P1", 5]]


def test_lookup_of_a_partition_without_active_node_up_is_unavailable_never_not_found() -> None:
    net = PNet()
    net.cluster(up={"A"})  # B (P1's only holder) is down
    reply = net.op("A", get("b", begin="serializable"))
    assert reply is not None and reply["error"] == "Unavailable"
    assert "partition P1" in reply["message"]
    # A key of P0 (active here) still works.
    put(net, "A", pobj("P0", 1, "a"), "a")
    assert net.ok("A", get("a", begin="serializable"))["o"] is not None
    # The holder returns: back.
    net.cluster(up={"A", "B"})
    put(net, "B", pobj("P1", 1, "b"), "b")
    assert net.ok("A", get("b", begin="serializable"))["o"] is not None


def test_ref_delete_and_call_route_by_the_partition_the_location_names() -> None:
    net = PNet()
    s = net.ok("A", {"op": "tx.begin"})["s"]
    net.ok("A", {"op": "tx.ref", "s": s, "ref": pref("P1", 4)})
    ((_, to, msg),) = net.data_reqs()
    assert to == "B" and msg["op"] == "branch.ref" and msg["pe"] == [["P1", 5]]
    net.cluster(up={"A"})
    s = net.ok("A", {"op": "tx.begin"})["s"]
    reply = net.op("A", {"op": "tx.delete", "s": s, "ref": pref("P1", 4)})
    assert reply is not None and reply["error"] == "Unavailable" and "P1" in reply["message"]
    # A legacy reference (a node's own store location) still routes to that node.
    s = net.ok("A", {"op": "tx.begin"})["s"]
    legacy = Ref.make(LOCATIONS["A"], 7, 1).raw
    net.ok("A", {"op": "tx.ref", "s": s, "ref": legacy})
    assert net.stores["A"].execs[-1].op == "branch.ref"


def test_create_goes_to_the_mapped_partition_named_by_its_location_and_epoch() -> None:
    net = PNet()
    st = pack({"number": "b", "balance": 0})
    net.ok("A", {"op": "tx.create", "type": ACC, "tv": 1, "st": st, "begin": "serializable"})
    ((_, to, msg),) = net.data_reqs()
    assert to == "B" and msg["op"] == "branch.create"
    assert msg["pl"] == [P_LOC["P1"], 5] and msg["pe"] == [["P1", 5]]
    assert net.placement.asked[-1] == (ACC, routing_key("b"))
    # The key's partition decides, not the coordinator nor a "node" argument.
    net.sent.clear()
    st = pack({"number": "a", "balance": 0})
    op = {"op": "tx.create", "type": ACC, "st": st, "node": "B", "begin": "serializable"}
    net.ok("A", op)
    assert net.data_reqs() == []
    assert net.stores["A"].execs[-1].fields["pl"] == [P_LOC["P0"], 3]


def test_count_and_query_ask_each_partition_once_on_its_active_node() -> None:
    net = PNet()
    count = {"op": "tx.count", "type": ACC, "begin": "serializable"}
    net.ok("A", count)
    here = net.stores["A"].execs[-1]
    assert here.op == "branch.count" and here.fields["locs"] == [P_LOC["P0"]]
    ((_, to, msg),) = net.data_reqs("branch.count")
    assert to == "B" and msg["locs"] == [P_LOC["P1"]]
    # P1's holder down: skip_down leaves it out, fail_if_down refuses naming it.
    net.cluster(up={"A"})
    net.sent.clear()
    net.ok("A", count)
    assert net.data_reqs() == []
    reply = net.op("A", {**count, "audit": "fail_if_down"})
    assert reply is not None and reply["error"] == "Unavailable" and "P1" in reply["message"]
    query = {"op": "tx.query", "type": ACC, "begin": "serializable", "audit": "fail_if_down"}
    assert net.op("A", query)["error"] == "Unavailable"


def test_a_node_not_acting_for_the_partition_refuses_with_not_active() -> None:
    net = PNet()
    put(net, "B", pobj("P1", 1, "b"), "b")
    # B lost its lease for P1 (by time alone: its applied table still names epoch 5).
    # The op waits it out (lapse_waits.py) and runs nothing meanwhile ...
    net.acting_now["B"] = set()
    assert net.op("A", get("b", begin="serializable", lock="write")) is None
    assert net.stores["B"].execs == [] and net.machines["B"].stats["lapse_waits"] == 1
    # ... its coordinator's probe hears that B still has it ...
    ((_, _, req),) = net.data_reqs("branch.get")
    net.feed("B", Received(now=net.now, sender="A", payload={"t": PROBE, "id": req["id"]}))
    assert net.sent[-1][2] == {"t": PROBED, "id": req["id"], "r": True}
    # ... and it is refused once the wait is over without the lease back.
    net.fire("B", LAPSE_TIMER)
    reply = net.replies[-1].payload
    assert reply["error"] == "NotActive"
    assert issubclass(errors.NotActive, errors.Retryable)
    assert net.machines["B"].stats["fenced_ops"] == 1
    assert net.machines["B"].stats["lapse_refusals"] == 1
    assert net.stores["B"].execs == []
    assert net.machines["B"].branches == {}  # nothing left held there


def test_an_op_that_meets_a_lapse_of_the_lease_goes_on_when_the_lease_is_back() -> None:
    net = PNet()
    b = pobj("P1", 1, "b")
    put(net, "B", b, "b")
    net.acting_now["B"] = set()
    assert net.op("A", get("b", begin="serializable")) is None
    # The next renewal is accepted: any event of B's (here a table notice) lets it run.
    net.acting_now.pop("B")
    net.cluster(up={"A", "B"})
    assert net.replies[-1].payload["o"] == b
    assert net.machines["B"].stats["lapses_waited_out"] == 1
    assert net.machines["B"].stats["fenced_ops"] == 0


def test_a_waiting_op_of_a_coordinator_that_ended_its_branches_never_opens_one() -> None:
    # Simulator seed 437: A's op waited out B's lapse; A restarted and told B to end all
    # it held of A's (end_all) -- the waiting op's branch did not exist yet, and once B
    # acted again the op opened it: a branch that outlived its session.
    net = PNet()
    put(net, "B", pobj("P1", 1, "b"), "b")
    net.acting_now["B"] = set()
    assert net.op("A", get("b", begin="serializable")) is None
    assert len(net.data_reqs("branch.get")) == 1  # sent to B, waiting there
    end_all = {"t": "data.req", "id": 999, "op": END_ALL, "b": "A.", "keep": []}
    net.feed("B", Received(now=net.now, sender="A", payload=end_all))
    net.acting_now.pop("B")
    net.cluster(up={"A", "B"})
    assert net.machines["B"].branches == {}
    assert net.stores["B"].execs == []  # the op never ran
    assert net.replies[-1].payload["error"] == "BranchRolledBack"


def test_a_lapse_ended_by_the_partition_changing_hands_is_refused_at_once() -> None:
    net = PNet()
    put(net, "B", pobj("P1", 1, "b"), "b")
    net.acting_now["B"] = set()
    assert net.op("A", get("b", begin="serializable")) is None
    # A failover moved P1 on (epoch 6): nothing waits for a lease that cannot come back.
    net.table["P1"] = ("A", 6)
    net.cluster(up={"A", "B"})
    reply = net.replies[-1].payload
    assert reply["error"] == "NotActive" and "epoch 5" in reply["message"]
    assert net.stores["B"].execs == []


def test_a_stale_epoch_is_refused_and_the_answer_is_checked_when_acknowledging() -> None:
    net = PNet()
    put(net, "B", pobj("P1", 1, "b"), "b")
    # A still routes at epoch 5; B applied epoch 6 (a failover and back, say).
    net.table["P1"] = ("B", 6)
    net.cluster(up={"A", "B"}, at="B")
    reply = net.op("A", get("b", begin="serializable"))
    assert reply is not None and reply["error"] == "NotActive" and "epoch 5" in reply["message"]
    # The lease lapses while the store op runs: the answer is refused, not sent as ok.
    net.table["P1"] = ("B", 5)
    net.cluster(up={"A", "B"})
    net.hold = lambda ex: ex.op == "branch.get"
    assert net.op("A", get("b", begin="serializable")) is None
    net.acting_now["B"] = set()
    net.hold = lambda ex: False
    n = len(net.replies)
    net.release_held()
    assert len(net.replies) == n  # the answer waits out the lapse (lapse_waits.py) ...
    net.fire("B", LAPSE_TIMER)
    assert net.replies[-1].payload["error"] == "NotActive"  # ... and is refused after it
    # The same answer with the lease back before the wait is over: delivered.
    net.acting_now.pop("B")
    net.hold = lambda ex: ex.op == "branch.get"
    assert net.op("A", get("b", begin="serializable")) is None
    net.acting_now["B"] = set()
    net.hold = lambda ex: False
    net.release_held()
    net.acting_now.pop("B")
    net.cluster(up={"A", "B"})
    assert net.replies[-1].payload["o"] is not None


def test_the_answer_is_fenced_by_the_applied_table_not_by_a_lagging_view() -> None:
    # Seeds 1767 and 2293 (replication.md §10b): in one step B applies a table entry that
    # moves P1 to epoch 6 and answers an op of epoch 5 (a commit's phase two released the
    # lock it waited on) before the new view reaches its data plane.
    net = PNet()
    applied = {"P1": 5}
    net.machines["B"].config.applied_epoch = applied.get
    put(net, "B", pobj("P1", 1, "b"), "b")
    net.hold = lambda ex: ex.op == "branch.get"
    assert net.op("A", get("b", begin="serializable")) is None
    applied["P1"] = 6  # applied here; the data plane's view still says epoch 5
    net.hold = lambda ex: False
    net.release_held()
    reply = net.replies[-1].payload
    assert reply["error"] == "NotActive" and "at epoch 6" in reply["message"]
    # Unknown in the applied table: refused too.
    del applied["P1"]
    reply = net.op("A", get("b", begin="serializable"))
    assert reply is not None and reply["error"] == "NotActive"


def test_the_vote_is_fenced_like_the_ops() -> None:
    net = PNet()
    b = pobj("P1", 1, "b")
    put(net, "B", b, "b")
    s = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    bid = f"A.{s}"
    assert net.machines["B"].branches[bid].fence == {"P1": 5}
    net.acting_now["B"] = set()
    assert not net.machines["B"].take_branch(bid)  # not now ...
    assert net.machines["B"].vote_lapsed(bid)  # ... a lapse alone: the prepare asks again
    net.table["P1"] = ("A", 6)
    net.cluster(up={"A", "B"})
    assert not net.machines["B"].vote_lapsed(bid)  # moved on: votes no, "branch gone"
    net.table["P1"] = ("B", 5)
    net.cluster(up={"A", "B"})
    net.acting_now.pop("B")
    assert not net.machines["B"].vote_lapsed(bid)
    assert net.machines["B"].take_branch(bid)
    assert not net.machines["B"].vote_lapsed(bid)  # taken: not the data plane's any more


def test_the_vote_is_fenced_at_the_time_it_is_asked_not_at_the_last_event() -> None:
    # The participant asks from outside the machine's events: a lease that ran out since
    # the last event must not look held (the machine's time moves on to the call's).
    net = PNet()
    put(net, "B", pobj("P1", 1, "b"), "b")
    s = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    bid = f"A.{s}"
    machine = net.machines["B"]
    machine.config.acting = lambda now, partition: now < net.now + 1.0  # lease until then
    assert not machine.take_branch(bid, net.now + 2.0)
    assert machine.vote_lapsed(bid, net.now + 2.0)
    assert machine.now >= net.now + 2.0


def test_the_coordinators_own_partition_is_fenced_at_its_local_commit() -> None:
    net = PNet()
    a = pobj("P0", 1, "a")
    put(net, "A", a, "a")
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.acting_now["A"] = set()
    w = [[a[0], a[1], a[2], pack({"balance": 1})]]
    assert net.op("A", {"op": "tx.commit", "s": s, "w": w}) is None  # waits out the lapse
    assert all(ex.op != "branch.commit" for ex in net.stores["A"].execs)
    net.fire("A", LAPSE_TIMER)
    assert net.replies[-1].payload["error"] == "NotActive"
    assert all(ex.op != "branch.commit" for ex in net.stores["A"].execs)
    # The lease back within the wait: the commit runs then.
    net.acting_now.pop("A")
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.acting_now["A"] = set()
    assert net.op("A", {"op": "tx.commit", "s": s, "w": w}) is None
    net.acting_now.pop("A")
    net.cluster(up={"A", "B"})
    assert net.replies[-1].payload == {"ok": True}
    assert net.stores["A"].execs[-1].op == "branch.commit"


def test_a_local_commit_that_ran_is_never_refused_afterwards() -> None:
    net = PNet()
    a = pobj("P0", 1, "a")
    put(net, "A", a, "a")
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.hold = lambda ex: ex.op == "branch.commit"
    w = [[a[0], a[1], a[2], pack({"balance": 1})]]
    assert net.op("A", {"op": "tx.commit", "s": s, "w": w}) is None
    # The lease lapses while the store commits: the commit happened, so it is ok.
    net.acting_now["A"] = set()
    net.hold = lambda ex: False
    net.release_held()
    assert net.replies[-1].payload == {"ok": True}


def test_without_a_placement_the_table_in_the_view_changes_nothing() -> None:
    net = PNet()
    for m in net.machines.values():
        m.config.placement = None  # ha.data = "nodes" (the default)
    net.cluster(up={"A", "B"})  # the view still carries the table
    assert net.machines["A"].view.partitions and not net.machines["A"].view.by_location
    net.ok("A", get("b", begin="serializable"))
    # Node routing: a probe here, then every other node; no parts, no fence.
    assert net.stores["A"].execs[0].fields.get("if_found")
    ((_, to, msg),) = net.data_reqs("branch.get")[:1]
    assert to == "B" and "locs" not in msg and "pe" not in msg
    s = net.ok("A", {"op": "tx.begin"})["s"]
    reply = net.op("A", {"op": "tx.ref", "s": s, "ref": pref("P1", 4)})
    assert reply is not None and reply["error"] == "BadArgument"


def test_a_snapshot_view_opened_before_the_node_acted_for_a_partition_does_not_read_it() -> None:
    # Seed 3300132 (replication.md §10b): B takes P1 over after its snapshot view opened;
    # the view holds B's older copy of P1, so a read of P1 through it could miss commits
    # acknowledged before -- refused (Conflict: the snapshot is replayed).
    net = PNet()
    put(net, "B", pobj("P1", 1, "b"), "b")
    net.acting_now["B"] = set()  # P1 not acted for on B yet (a handover waiting)
    net.hold = lambda ex: ex.op == "branch.cut_unsure"  # the views are open by now
    assert net.op("A", get("b", begin="snapshot")) is None
    net.acting_now["B"] = {"P1"}  # B acts for P1 from here on
    net.hold = lambda ex: False
    net.release_held()
    reply = net.replies[-1].payload
    assert reply["error"] == "Conflict" and "partition P1" in reply["message"]
    assert issubclass(errors.Conflict, errors.Retryable)
    # A snapshot whose views open while B acts for P1 reads it.
    reply = net.op("A", get("b", begin="snapshot"))
    assert reply is not None and "error" not in reply, reply
