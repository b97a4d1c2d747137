"""The data-plane machine (``nonstop.dataplane.machine.DataPlane``) driven by events alone.

No asyncio, no store: a tiny in-memory cluster (:class:`Net`) delivers the
machines' ``Send`` actions to each other and answers their ``Exec`` actions
from a fake store of unique keys (:class:`FakeStore`); ``Decide`` actions are
recorded and answered by the test.  Every assertion is on the actions the
machines emit.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from nonstop.dataplane.deadlocks import claimed_age, find_cycles, victim_of, victims_of
from nonstop.dataplane.events import (
    BranchDone,
    ClientGone,
    ClientOp,
    ClientReply,
    ClusterChanged,
    Decide,
    DecisionDone,
    EndBranch,
    Exec,
    LocalWaits,
    ReadWaits,
)
from nonstop.dataplane.holdings import leave_refusal
from nonstop.dataplane.machine import (
    COMMIT_TIMER,
    RPC_TIMER,
    SWEEP_TIMER,
    WAITS_TIMER,
    DataPlane,
    DataPlaneConfig,
)
from nonstop.dataplane.state import ACTIVE
from nonstop.dataplane.steps import Task
from nonstop.model.codec import pack
from nonstop.model.ref import Ref
from nonstop.runtime.interface import (
    CancelTimer,
    Log,
    Received,
    Send,
    SetTimer,
    Started,
    TimerFired,
)

ACC = "t.Account"
LOCATIONS = {"A": 1, "B": 2, "C": 3}


def no_type_check(name: Any, tv: Any) -> None:
    """The machine's type check, without managed types (the fake store has none)."""
    if not isinstance(name, str):
        from nonstop import errors

        raise errors.BadArgument("type must be a type name")


def ref_on(node: str, n: int) -> bytes:
    return Ref.make(LOCATIONS[node], 7, n).raw


def obj(node: str, n: int, number: str) -> list[Any]:
    return [ref_on(node, n), ACC, 1, pack({"number": number})]


def write(o: list[Any], **changes: Any) -> list[Any]:
    return [o[0], o[1], o[2], pack(changes)]


class FakeStore:
    """A node's store: unique keys → objects, request results, the branch ops seen."""

    def __init__(self) -> None:
        self.objects: dict[bytes, list[Any]] = {}
        self.results: dict[tuple[str, int], list[Any]] = {}
        self.execs: list[Exec] = []
        self.fail: dict[str, dict[str, Any]] = {}
        """op → the error reply it gets (once)."""

    def add(self, o: list[Any], key: bytes) -> None:
        self.objects[key] = o

    def run(self, ex: Exec) -> dict[str, Any]:
        self.execs.append(ex)
        if ex.op in self.fail:
            return self.fail.pop(ex.op)
        if ex.op == "branch.get":
            return {"o": self.objects.get(ex.fields.get("key"))}  # type: ignore[arg-type]
        if ex.op in ("branch.count",):
            return {"n": len(self.objects)}
        if ex.op == "branch.holdings":
            return {"types": {ACC: len(self.objects)}}
        if ex.op == "branch.query":
            return {"os": list(self.objects.values())}
        if ex.op in ("branch.commit", "request.record"):
            req = ex.fields.get("req")
            if req is not None:
                key = (req[0], req[1])
                if key in self.results:
                    return {"done": self.results[key]}
                if ex.op == "branch.commit":
                    self.results[key] = [True, None]
            return {}
        if ex.op == "request.abort":
            req = ex.fields["req"]
            self.results.setdefault((req[0], req[1]), [False, [ex.fields["error"], "x"]])
            return {}
        if ex.op == "request.lookup":
            req = ex.fields["req"]
            return {"found": self.results.get((req[0], req[1])), "in_doubt": False}
        if ex.op == "branch.create":
            return {"o": obj("A", 99, "new")}
        return {}


class Net:
    """Machines of a small cluster, their stores, and what they did."""

    def __init__(self, names: str = "AB", **config: Any) -> None:
        self.now = 0.0
        self.machines = {
            n: DataPlane(n, random.Random(i), DataPlaneConfig(check_type=no_type_check, **config))
            for i, n in enumerate(names)
        }
        self.stores = {n: FakeStore() for n in names}
        self.replies: list[ClientReply] = []
        self.sent: list[tuple[str, str, Any]] = []
        self.decides: dict[str, list[Decide]] = {n: [] for n in names}
        self.ended: dict[str, list[str]] = {n: [] for n in names}
        self.timers: dict[str, dict[str, float]] = {n: {} for n in names}
        self.logs: list[Log] = []
        self.corrs = 1000
        self.silent: set[str] = set()
        """Nodes whose messages are lost (in and out)."""
        self.held: list[tuple[str, Exec]] = []
        self.waits: dict[str, list[tuple[str, str]]] = {}
        """Each store's wait-for edges (what ``ReadWaits`` reads)."""
        self.hold: Callable[[Exec], bool] = lambda ex: False
        self.skew: dict[str, float] = {}
        """Node → how far its clock is ahead of the others' (its events' ``now``)."""
        for n in names:
            self.feed(n, Started(now=0.0))
        self.cluster(up=set(names))
        self.sent.clear()  # each node's first view: branch.end_all to its peers (ends.py)

    def cluster(self, up: set[str], quorum: str = "Active", at: str | None = None) -> None:
        """What every node (or only ``at``) sees: ``up`` (and itself) up."""
        locations = {loc: n for n, loc in LOCATIONS.items() if n in self.machines}
        for n in self.machines if at is None else [at]:
            ev = ClusterChanged(
                now=self.now,
                members=tuple(self.machines),
                up=frozenset(up | {n}),
                quorum=quorum,
                locations=locations,
                partitions=self.partitions_seen_by(n),
            )
            self.feed(n, ev)

    def partitions_seen_by(self, node: str) -> dict[str, Any]:
        """The partition table in ``node``'s view (none here; routing by partition's tests)."""
        return {}

    def feed(self, node: str, event: Any) -> None:
        work = [(node, event)]
        while work:
            at, ev = work.pop(0)
            if self.skew.get(at):
                ev = dataclasses.replace(ev, now=ev.now + self.skew[at])
            for action in self.machines[at].handle(ev):
                work.extend(self._carry(at, action))

    def _carry(self, at: str, action: Any) -> list[tuple[str, Any]]:
        if isinstance(action, Exec):
            if self.hold(action):
                self.held.append((at, action))
                return []
            reply = self.stores[at].run(action)
            return [(at, BranchDone(now=self.now, corr=action.corr, reply=reply))]
        if isinstance(action, Send):
            self.sent.append((at, action.to, action.payload))
            if at in self.silent or action.to in self.silent:
                return []
            return [(action.to, Received(now=self.now, sender=at, payload=action.payload))]
        if isinstance(action, ClientReply):
            self.replies.append(action)
        elif isinstance(action, Decide):
            self.decides[at].append(action)
        elif isinstance(action, EndBranch):
            self.ended[at].append(action.bid)
        elif isinstance(action, SetTimer):
            self.timers[at][action.name] = self.now + action.delay
        elif isinstance(action, CancelTimer):
            self.timers[at].pop(action.name, None)
        elif isinstance(action, Log):
            self.logs.append(action)
        elif isinstance(action, ReadWaits):
            return [(at, LocalWaits(now=self.now, edges=tuple(self.waits.get(at, ()))))]
        else:
            raise AssertionError(f"unexpected action {action!r}")
        return []

    def release_held(self) -> None:
        held, self.held = self.held, []
        for at, ex in held:
            reply = self.stores[at].run(ex)
            self.feed(at, BranchDone(now=self.now, corr=ex.corr, reply=reply))

    def fire(self, node: str, prefix: str) -> None:
        """Fire every armed timer of ``node`` whose name starts with ``prefix``."""
        for name in sorted(n for n in self.timers[node] if n.startswith(prefix)):
            self.now = max(self.now, self.timers[node].pop(name))
            self.feed(node, TimerFired(now=self.now, name=name))

    def op(self, node: str, payload: dict[str, Any], conn: int = 1) -> dict[str, Any] | None:
        """One client op; its reply if it came (None: still running)."""
        self.corrs += 1
        corr = self.corrs
        before = len(self.replies)
        self.feed(node, ClientOp(now=self.now, conn=conn, corr=corr, payload=payload))
        mine = [r for r in self.replies[before:] if r.corr == corr]
        assert len(mine) <= 1
        return mine[0].payload if mine else None

    def ok(self, node: str, payload: dict[str, Any], conn: int = 1) -> dict[str, Any]:
        reply = self.op(node, payload, conn)
        assert reply is not None and "error" not in reply, reply
        return reply

    def data_reqs(self, op: str | None = None) -> list[tuple[str, str, Any]]:
        return [
            (a, b, p)
            for a, b, p in self.sent
            if p.get("t") == "data.req" and (op is None or p.get("op") == op)
        ]


def get(key: str, **extra: Any) -> dict[str, Any]:
    return {"op": "tx.get", "type": ACC, "tv": 1, "key": pack({"number": key}), **extra}


def accounts(net: Net, spec: dict[str, str]) -> dict[str, list[Any]]:
    """Put account ``number`` on node ``spec[number]``; their objects."""
    out = {}
    for i, (number, node) in enumerate(spec.items()):
        o = obj(node, i + 1, number)
        net.stores[node].add(o, pack({"number": number}))
        out[number] = o
    return out


# ---------------------------------------------------------------- sessions
def test_local_session_commits_with_one_exec_commit() -> None:
    net = Net("A")
    objs = accounts(net, {"a1": "A"})
    reply = net.ok("A", get("a1", begin="serializable", lock="write"))
    sid = reply["s"]
    assert reply["o"] == objs["a1"]
    # The first Exec of the session opened its branch here (iso), the probe first.
    first = net.stores["A"].execs[0]
    assert first.iso == "serializable" and first.bid == f"A.{sid}" and first.fields["if_found"]
    w = [write(objs["a1"], balance=5)]
    assert net.ok("A", {"op": "tx.commit", "s": sid, "w": w, "req": ["c", 1]}) == {"ok": True}
    commit = net.stores["A"].execs[-1]
    assert commit.op == "branch.commit" and commit.writes == w and commit.iso is None
    assert commit.fields == {"req": ["c", 1]}
    assert net.decides["A"] == [] and net.ended["A"] == []  # committed: nothing to end
    assert net.machines["A"].branches == {} and net.machines["A"].sessions == {}
    # The session is over.
    assert net.op("A", {"op": "tx.count", "s": sid, "type": ACC})["error"] == "TransactionClosed"


def test_writes_on_two_nodes_decide_with_both_branches_and_each_write_once() -> None:
    net = Net("AB")
    objs = accounts(net, {"a": "A", "b": "B"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.ok("A", get("b", s=s, lock="write"))
    w = [write(objs["a"], balance=1), write(objs["b"], balance=2)]
    assert net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["c", 9]}) is None
    (decide,) = net.decides["A"]
    bid = f"A.{s}"
    # B's write travels once, in the decision's branch list (B's branch was open);
    # A's write was applied to A's branch with the request record, not shipped again.
    assert decide.branches == {"A": [["b", bid]], "B": [["b", bid], ["w", *w[1]]]}
    record = net.stores["A"].execs[-1]
    assert record.op == "request.record" and record.writes == [w[0]]
    assert not any("w" in p for _, _, p in net.data_reqs())
    assert net.machines["A"].stats["two_phase"] == 1
    # The participant (the test here) takes both branches over, then decides.
    assert net.machines["A"].take_branch(bid) and net.machines["B"].take_branch(bid)
    assert not net.machines["B"].take_branch(bid)
    before = len(net.replies)
    net.feed("A", DecisionDone(now=0.0, corr=decide.corr, reply={"ok": True}))
    assert net.replies[before].payload == {"ok": True}
    # Committed branches are not ended again (no EndBranch, no branch.end).
    assert net.ended["A"] == [] and net.data_reqs("branch.end") == []
    assert f"{COMMIT_TIMER}{decide.corr}" not in net.timers["A"]
    assert net.ok("A", {"op": "request.result", "req": ["c", 9]})["state"] == "committed"


def test_writes_to_a_node_never_visited_open_its_branch_shipping_them() -> None:
    net = Net("AB")
    objs = accounts(net, {"b": "B"})
    s = net.ok("A", {"op": "tx.begin"})["s"]
    w = [write(objs["b"], balance=3)]
    assert net.op("A", {"op": "tx.commit", "s": s, "w": w}) is None
    ((_, to, msg),) = net.data_reqs()
    assert to == "B" and msg["op"] == "branch.write" and msg["w"] == [w[0]] and msg["new"]
    (decide,) = net.decides["A"]
    assert decide.branches == {"B": [["b", f"A.{s}"]]}  # no request id: A does not take part


def test_writes_here_are_applied_before_an_op_goes_elsewhere() -> None:
    net = Net("AB")
    objs = accounts(net, {"a": "A", "b": "B"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    w = [write(objs["a"], balance=7)]
    net.hold = lambda ex: ex.op == "branch.write"  # the store takes its time
    # An op for B only: A's write is applied first, alone; B is asked after.
    assert net.op("A", {"op": "tx.ref", "s": s, "ref": objs["b"][0], "w": w}) is None
    ((_, first),) = net.held
    assert first.op == "branch.write" and first.writes == w
    assert net.data_reqs() == []
    net.hold = lambda ex: False
    net.release_held()
    assert "error" not in net.replies[-1].payload
    ((_, to, msg),) = net.data_reqs()
    assert to == "B" and msg["op"] == "branch.ref" and "w" not in msg
    # A failed write here: the op fails there, nothing was sent.
    net.sent.clear()
    net.stores["A"].fail["branch.write"] = {"error": "FieldError", "message": "no"}
    count = {"op": "tx.count", "s": s, "type": ACC, "scope": ["B"], "w": w}
    assert net.op("A", count)["error"] == "FieldError"
    assert net.data_reqs() == []
    # An op with a call here carries them on that call (one Exec).
    before = len(net.stores["A"].execs)
    net.ok("A", {"op": "tx.count", "s": s, "type": ACC, "w": w})
    (here,) = net.stores["A"].execs[before:]
    assert here.op == "branch.count" and here.writes == w


def test_a_peer_that_does_not_answer_is_unavailable_and_the_session_ends() -> None:
    net = Net("ABC")
    accounts(net, {"c": "C"})
    s = net.ok("A", get("c", begin="serializable"))["s"]  # branches on A, B and C
    net.silent.add("B")
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC}) is None
    assert any(n.startswith(RPC_TIMER) for n in net.timers["A"])
    net.fire("A", RPC_TIMER)
    reply = net.replies[-1].payload
    assert reply["error"] == "TransactionLost" and "did not answer" in reply["message"]
    # Every branch is released: A's own at once, B's and C's by message (B is told
    # until it answers: the op it did not answer may still reach it, ends.py).
    assert net.ended["A"] == [f"A.{s}"]
    ends = {to for _, to, _ in net.data_reqs("branch.end")}
    assert ends == {"B", "C"}
    assert f"A.{s}" not in net.machines["C"].branches
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC})["error"] == "TransactionClosed"


def test_client_gone_ends_every_branch_but_not_a_commit_in_flight() -> None:
    net = Net("AB")
    objs = accounts(net, {"b": "B"})
    s1 = net.ok("A", get("b", begin="serializable", lock="write"), conn=5)["s"]
    s2 = net.ok("A", get("b", begin="serializable"), conn=5)["s"]
    w = [write(objs["b"], balance=1)]
    assert net.op("A", {"op": "tx.commit", "s": s2, "w": w}, conn=5) is None  # deciding
    net.feed("A", ClientGone(now=0.0, conn=5))
    assert net.ended["A"] == [f"A.{s1}"]
    assert [p["b"] for _, _, p in net.data_reqs("branch.end")] == [f"A.{s1}"]
    assert f"A.{s1}" not in net.machines["B"].branches
    assert f"A.{s2}" in net.machines["B"].branches  # the commit goes on
    assert set(net.machines["A"].sessions) == {s2}


def test_coordinator_seen_down_ends_its_participant_branches() -> None:
    net = Net("AB")
    accounts(net, {"b": "B"})
    s = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    bid = f"A.{s}"
    assert bid in net.machines["B"].branches
    net.cluster(up={"B"}, at="B")  # B sees A down
    net.cluster(up={"A"}, at="A")  # and A sees B down
    assert net.ended["B"] == [bid] and net.machines["B"].stats["orphan_rollbacks"] == 1
    assert bid not in net.machines["B"].branches
    # A late op of that coordinator cannot reopen it, even saying "new".
    late = {"t": "data.req", "id": 1, "op": "branch.get", "b": bid, "new": True}
    net.feed("B", Received(now=0.0, sender="A", payload=late))
    assert net.sent[-1][2]["p"]["error"] == "BranchRolledBack"
    # A's session had a branch on B: it is over, and its next op says why.
    assert net.machines["A"].stats["sessions_broken"] == 1
    reply = net.op("A", {"op": "tx.count", "s": s, "type": ACC})
    # Rolled back, nothing committed: TransactionLost, an Unavailable that @transactional
    # replays (issue 10 H4).
    assert reply["error"] == "TransactionLost" and "node B" in reply["message"]


def test_no_quorum_no_distributed_commit() -> None:
    net = Net("AB")
    objs = accounts(net, {"a": "A", "b": "B"})
    s = net.ok("A", get("b", begin="serializable"))["s"]
    net.cluster(up={"A", "B"}, quorum="Disabled")
    w = [write(objs["b"], balance=1)]
    reply = net.op("A", {"op": "tx.commit", "s": s, "w": w})
    assert reply["error"] == "Unavailable" and "no quorum" in reply["message"]
    assert net.decides["A"] == []
    assert [p["b"] for _, _, p in net.data_reqs("branch.end")] == [f"A.{s}"]


def test_disabled_means_disabled_no_local_commit_either() -> None:
    """D16: a node without quorum acknowledges no commit, not even one it could do alone."""
    net = Net("AB")
    objs = accounts(net, {"a": "A"})
    net.cluster(up={"A"}, quorum="Disabled")
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]  # reads still work
    w = [write(objs["a"], balance=1)]
    reply = net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["d", 1]})
    assert reply is not None and reply["error"] == "Unavailable"
    assert "no quorum" in reply["message"] and "A" in reply["message"]
    # Nothing was written: no store commit, the branch rolled back; the request's
    # outcome is the definite abort (a retry of the same id hears it again).
    assert [ex.op for ex in net.stores["A"].execs if ex.op == "branch.commit"] == []
    assert net.ended["A"] == [f"A.{s}"]
    assert net.stores["A"].results[("d", 1)][0] is False
    # A read-only commit acknowledges nothing and still ends cleanly.
    s = net.ok("A", get("a", begin="serializable"))["s"]
    assert net.ok("A", {"op": "tx.commit", "s": s}) == {"ok": True}
    # The quorum back: the same commit goes through.
    net.cluster(up={"A", "B"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    assert net.ok("A", {"op": "tx.commit", "s": s, "w": w, "req": ["d", 2]}) == {"ok": True}


def test_quorum_lost_during_a_commit_is_not_acknowledged() -> None:
    """The store commit finished after the node lost quorum: Unavailable, outcome recorded."""
    net = Net("AB")
    objs = accounts(net, {"a": "A"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.hold = lambda ex: ex.op == "branch.commit"
    w = [write(objs["a"], balance=1)]
    assert net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["q", 1]}) is None
    net.cluster(up={"A"}, quorum="Disabled")
    net.hold = lambda ex: False
    net.release_held()
    reply = net.replies[-1].payload
    assert reply["error"] == "Unavailable" and "lost its quorum" in reply["message"]
    assert net.ok("A", {"op": "request.result", "req": ["q", 1]})["state"] == "committed"


def test_a_retried_request_gets_the_first_outcome_and_is_not_decided_again() -> None:
    net = Net("AB")
    objs = accounts(net, {"b": "B"})
    s = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    w = [write(objs["b"], balance=1)]
    net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["cl", 4]})
    (decide,) = net.decides["A"]
    # A retry while it runs waits for the first outcome.
    assert net.op("A", {"op": "tx.commit", "s": s, "req": ["cl", 4]}) is None
    assert net.ok("A", {"op": "request.result", "req": ["cl", 4]})["state"] == "running"
    net.stores["A"].results[("cl", 4)] = [True, None]  # what the prepared branch recorded
    net.feed("A", DecisionDone(now=0.0, corr=decide.corr, reply={"ok": True}))
    assert [r.payload for r in net.replies[-2:]] == [{"ok": True}, {"ok": True}]
    # A fresh session with the same request id: the first outcome, nothing decided.
    s2 = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    assert net.ok("A", {"op": "tx.commit", "s": s2, "w": w, "req": ["cl", 4]}) == {"ok": True}
    assert len(net.decides["A"]) == 1
    # After a restart (nothing in memory) the store's record answers.
    net2 = Net("AB")
    net2.stores["A"].results[("cl", 4)] = [True, None]
    assert net2.ok("A", {"op": "tx.commit", "s": 12345, "req": ["cl", 4]}) == {"ok": True}
    s3 = net2.ok("A", {"op": "tx.begin"})["s"]
    assert net2.ok("A", {"op": "tx.commit", "s": s3, "w": w, "req": ["cl", 4]}) == {"ok": True}
    assert net2.decides["A"] == []
    assert net2.stores["A"].execs[-1].op == "request.record"  # found by the claim
    assert net2.ended["A"] == [f"A.{s3}"]  # this attempt rolled back


def test_an_aborted_commit_is_recorded_and_answered_again() -> None:
    net = Net("AB")
    objs = accounts(net, {"b": "B"})
    s = net.ok("A", get("b", begin="serializable"))["s"]
    w = [write(objs["b"], balance=1)]
    net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["ab", 1]})
    (decide,) = net.decides["A"]
    why = {"ok": False, "error": "Aborted", "why": "B voted no: lock timeout"}
    net.feed("A", DecisionDone(now=0.0, corr=decide.corr, reply=why))
    assert net.replies[-1].payload["error"] == "LockTimeout"
    assert net.stores["A"].execs[-1].op == "request.abort"
    assert net.stores["A"].execs[-1].bid is None
    again = net.op("A", {"op": "tx.commit", "s": s, "req": ["ab", 1]})
    assert again["error"] == "LockTimeout"
    result = net.ok("A", {"op": "request.result", "req": ["ab", 1]})
    assert result["state"] == "aborted" and result["result"][0] == "LockTimeout"
    # The read-only participant branch... there is none; B's branch was a writer
    # that did not commit: it is ended.
    assert [p["b"] for _, _, p in net.data_reqs("branch.end")] == [f"A.{s}"]


def test_undecided_commit_answers_unavailable_then_settles_on_the_decision() -> None:
    net = Net("ABC", commit_timeout=5.0)
    objs = accounts(net, {"b": "B", "c": "C"})
    s = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    net.ok("A", get("c", s=s))  # C read only: its branch is ended after the decision
    w = [write(objs["b"], balance=1)]
    net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["u", 1]})
    (decide,) = net.decides["A"]
    net.fire("A", COMMIT_TIMER)
    reply = net.replies[-1].payload
    assert reply["error"] == "Unavailable" and "not known yet" in reply["message"]
    # Nothing released yet: the decision may still commit.
    assert net.data_reqs("branch.end") == [] and net.ended["A"] == []
    assert net.ok("A", {"op": "request.result", "req": ["u", 1]})["state"] == "running"
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC})["error"] == "TransactionClosed"
    count = len(net.replies)
    net.stores["A"].results[("u", 1)] = [True, None]
    net.machines["A"].take_branch(f"A.{s}")
    net.feed("A", DecisionDone(now=net.now, corr=decide.corr, reply={"ok": True}))
    assert len(net.replies) == count  # the client had its answer already
    assert [(to, p["b"]) for _, to, p in net.data_reqs("branch.end")] == [("C", f"A.{s}")]
    assert net.ok("A", {"op": "request.result", "req": ["u", 1]})["state"] == "committed"
    assert net.machines["A"].sessions == {}


def test_a_failed_op_ends_the_session_only_when_it_dooms_it() -> None:
    net = Net("AB")
    accounts(net, {"b": "B"})
    s = net.ok("A", get("b", begin="serializable"))["s"]
    net.stores["A"].fail["branch.create"] = {"error": "DuplicateKey", "message": "dup"}
    st = pack({"number": "x"})
    reply = net.op("A", {"op": "tx.create", "s": s, "type": ACC, "tv": 1, "st": st})
    assert reply["error"] == "DuplicateKey"
    assert net.ok("A", {"op": "tx.count", "s": s, "type": ACC})["n"] == 1 + 0
    net.stores["B"].fail["branch.count"] = {"error": "LockTimeout", "message": "slow"}
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC})["error"] == "LockTimeout"
    # B ended its branch at once (doomed), A ended its own and told nobody else.
    assert f"A.{s}" not in net.machines["B"].branches
    assert net.ended["A"] == [f"A.{s}"] and net.ended["B"] == [f"A.{s}"]


def test_ops_of_a_session_run_one_at_a_time_and_rollback_cancels_the_waiting() -> None:
    net = Net("A")
    accounts(net, {"a": "A"})
    s = net.ok("A", {"op": "tx.begin"})["s"]
    net.hold = lambda ex: True
    assert net.op("A", get("a", s=s)) is None
    assert net.op("A", get("a", s=s)) is None
    assert len(net.held) == 1  # the second waits for the first
    before = len(net.replies)
    assert net.ok("A", {"op": "tx.rollback", "s": s}) == {}
    answers = [r.payload.get("error") for r in net.replies[before:]]
    assert answers == ["TransactionClosed", "TransactionClosed", None]
    assert net.ended["A"] == [f"A.{s}"]
    net.hold = lambda ex: False
    net.release_held()  # the store's late answer is dropped
    assert len(net.replies) == before + 3


def test_a_session_belongs_to_its_connection() -> None:
    net = Net("A")
    s = net.ok("A", {"op": "tx.begin"}, conn=1)["s"]
    reply = net.op("A", {"op": "tx.count", "s": s, "type": ACC}, conn=2)
    assert reply["error"] == "TransactionClosed"
    assert net.ok("A", {"op": "tx.count", "s": s, "type": ACC}, conn=1) == {"n": 0}


def test_idle_participant_branches_roll_back() -> None:
    net = Net("AB", branch_idle=10.0, sweep_every=1.0)
    accounts(net, {"b": "B"})
    s = net.ok("A", get("b", begin="serializable"))["s"]
    bid = f"A.{s}"
    net.now = 5.0
    net.fire("B", SWEEP_TIMER)
    assert bid in net.machines["B"].branches and SWEEP_TIMER in net.timers["B"]
    net.now = 11.0
    net.fire("B", SWEEP_TIMER)
    assert net.ended["B"] == [bid] and net.machines["B"].stats["idle_rollbacks"] == 1
    # The coordinator's own branch never idles out.
    net.fire("A", SWEEP_TIMER)
    assert bid in net.machines["A"].branches


def test_an_idle_transaction_rolls_back_everywhere_coordinator_included() -> None:
    net = Net("AB", tx_idle=20.0, branch_idle=30.0, sweep_every=1.0)
    accounts(net, {"a": "A", "b": "B"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.ok("A", get("b", s=s, lock="write"))
    bid = f"A.{s}"
    net.now = 15.0
    net.fire("A", SWEEP_TIMER)  # 15 s without an op: still open
    assert bid in net.machines["A"].branches and net.ended["A"] == []
    net.ok("A", {"op": "tx.count", "s": s, "type": ACC})  # an op: the clock restarts
    net.now = 34.0
    net.fire("A", SWEEP_TIMER)
    assert bid in net.machines["A"].branches
    net.now = 35.5
    net.fire("A", SWEEP_TIMER)
    # Rolled back here (its locks on A's objects go) and on B (branch.end).
    assert net.ended["A"] == [bid] and net.machines["A"].stats["idle_sessions"] == 1
    assert net.ended["B"] == [bid]
    reply = net.op("A", {"op": "tx.count", "s": s, "type": ACC})
    assert reply is not None and reply["error"] == "TransactionClosed"
    assert "rolled back after 20 s idle" in reply["message"]


def test_a_session_with_an_op_running_is_not_idle() -> None:
    net = Net("A", tx_idle=5.0, sweep_every=1.0)
    accounts(net, {"a": "A"})
    net.hold = lambda ex: ex.op == "branch.get"  # the lookup waits (a lock, say)
    assert net.op("A", get("a", begin="serializable", lock="write")) is None
    net.now = 50.0
    net.fire("A", SWEEP_TIMER)
    assert net.machines["A"].stats["idle_sessions"] == 0 and net.ended["A"] == []
    net.release_held()
    assert net.replies[-1].payload["o"] is not None


def test_begin_folded_into_the_first_op_answers_its_session_even_on_error() -> None:
    net = Net("A")
    reply = net.op("A", {"op": "tx.count", "begin": "read_committed", "type": 5})
    assert reply["error"] == "BadArgument" and isinstance(reply["s"], int)
    reply = net.op("A", {"op": "tx.count", "begin": "chaos", "type": ACC})
    assert reply["error"] == "BadArgument" and "s" not in reply
    reply = net.ok("A", {"op": "tx.count", "begin": "read_committed", "type": ACC})
    assert net.stores["A"].execs[-1].iso == "snapshot" and reply["n"] == 0


def test_cluster_queries_merge_in_order_without_duplicates() -> None:
    from nonstop.dataplane.session_ops import merge_query

    a = [b"a" * 20, ACC, 1, b""]
    b = [b"b" * 20, ACC, 1, b""]
    c = [b"c" * 20, ACC, 1, b""]
    results = [{"os": [a, c], "k": [b"1", b"3"]}, {"os": [b, a], "k": [b"2", b"1"]}]
    assert merge_query(results, True, False, None) == [a, b, c]
    assert merge_query(results, True, False, 2) == [a, b]
    assert merge_query([{"os": [c, a], "k": [b"3", b"1"]}], True, True, None) == [c, a]
    assert merge_query(results, False, False, None) == [a, c, b]


def test_the_hint_asks_the_node_that_answered_last_alone() -> None:
    net = Net("ABC")
    accounts(net, {"c": "C"})
    s = net.ok("A", get("c", begin="serializable"))["s"]
    assert {to for _, to, _ in net.data_reqs("branch.get")} == {"B", "C"}
    net.ok("A", {"op": "tx.rollback", "s": s})
    net.sent.clear()
    net.ok("A", get("c", begin="serializable"))
    assert [to for _, to, _ in net.data_reqs("branch.get")] == ["C"]
    # Its node down: the lookup is Unavailable, never a false "not found".
    net.cluster(up={"A", "B"})
    assert net.op("A", get("c", begin="serializable"))["error"] == "Unavailable"


# ---------------------------------------------------------------- robustness
JUNK: list[Any] = [
    None,
    1,
    "x",
    [],
    {},
    {"op": None},
    {"op": ["tx.get"]},
    {"op": "tx.get"},
    {"op": "tx.get", "s": "1"},
    {"op": "tx.get", "s": True},
    {"op": "tx.get", "begin": ["x"]},
    {"op": "tx.get", "begin": None, "type": ACC, "key": 5},
    {"op": "tx.get", "begin": None, "type": ACC, "key": b"k", "scope": "planet"},
    {"op": "tx.get", "begin": None, "type": ACC, "key": b"k", "audit": ["x"]},
    {"op": "tx.query", "begin": None, "type": ACC, "limit": -1},
    {"op": "tx.ref", "begin": None, "ref": b"short"},
    {"op": "tx.ref", "begin": None, "ref": b"\xff" * 20},
    {"op": "tx.create", "begin": None, "type": ACC, "node": "Z"},
    {"op": "tx.create", "begin": None, "type": ACC, "node": ["A"]},
    {"op": "tx.commit", "begin": None, "w": "x"},
    {"op": "tx.commit", "begin": None, "w": [[1, 2]]},
    {"op": "tx.commit", "begin": None, "req": ["c", -1]},
    {"op": "tx.commit", "s": 77, "req": [1]},
    {"op": "tx.rollback", "begin": None},
    {"op": "tx.rollback", "s": 1},
    {"op": "request.result", "req": None},
    {"op": "request.result", "req": {"a": 1}},
    {"op": "bulk.scan"},
    {"op": "launch"},
]


@pytest.mark.parametrize("payload", JUNK, ids=range(len(JUNK)))
def test_malformed_client_ops_get_an_error_reply(payload: Any) -> None:
    net = Net("AB")
    reply = net.op("A", payload)
    assert reply is not None, payload
    if payload in ({"op": "tx.rollback", "begin": None}, {"op": "tx.rollback", "s": 1}):
        assert "error" not in reply
    else:
        assert "error" in reply, (payload, reply)
    assert not [log for log in net.logs if log.level == "error"], net.logs


def test_malformed_peer_messages_and_events_never_raise() -> None:
    net = Net("AB")
    dp = net.machines["B"]
    for payload in [
        None,
        [],
        {"t": "data.weird"},
        {"t": "data.rep", "id": "x"},
        {"t": "data.rep", "id": 424242, "p": {}},
        {"t": "data.req"},
        {"t": "data.req", "b": "C.1", "op": "branch.get"},
        {"t": "data.req", "b": "A.1", "op": "branch.get"},
        {"t": "data.req", "b": "A.2", "op": 5, "new": True},
        {"t": "data.req", "b": "A.3", "op": "branch.get", "new": True, "iso": "chaos"},
        {"t": "data.req", "b": "A.4", "op": "branch.get", "new": True, "w": "x"},
        {"t": "data.req", "b": "A.5", "op": "branch.end"},
        {"t": "data.req", "b": "A.6", "op": ["branch.get"], "new": True},
        {"t": "data.req", "b": "A.7", "op": "branch.commit", "new": True},
        # (request.record and request.lookup are peer ops since homed requests,
        # docs/design/requests.md; recording an abort stays the coordinator's own)
        {"t": "data.req", "b": "A.8", "op": "request.abort", "new": True, "req": ["x", 1]},
    ]:
        net.sent.clear()
        net.feed("B", Received(now=0.0, sender="A", payload=payload))
        for _, to, msg in net.sent:  # every request gets one answer, an error here
            assert to == "A" and msg["t"] == "data.rep"
            assert payload == {"t": "data.req", "b": "A.5", "op": "branch.end"} or (
                "error" in msg["p"]
            )
    # Nothing of that opened a branch or reached the store.
    assert dp.branches == {} and net.stores["B"].execs == []
    for event in [
        TimerFired(now=0.0, name="dp.rpc.x"),
        TimerFired(now=0.0, name="dp.commit.123"),
        TimerFired(now=0.0, name="other"),
        BranchDone(now=0.0, corr=99999, reply={}),
        DecisionDone(now=0.0, corr=99999, reply={}),
        ClientGone(now=0.0, conn=42),
        object(),
    ]:
        dp.handle(event)  # type: ignore[arg-type]
    # A peer's reply that is not a map fails the call, not the machine.
    net.silent.add("B")
    s = net.ok("A", {"op": "tx.begin"})["s"]
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC}) is None
    (_, _, req) = net.data_reqs("branch.count")[-1]
    net.feed("A", Received(now=0.0, sender="B", payload={"t": "data.rep", "id": req["id"], "p": 7}))
    assert net.replies[-1].payload["error"] == "ProtocolError"


def test_random_event_storms_never_raise_and_leave_nothing_behind() -> None:
    rng = random.Random(7)
    ops = ["tx.get", "tx.count", "tx.commit", "tx.rollback", "tx.query", "request.result"]

    def decide_all(net: Net) -> None:
        for node in "ABC":
            for d in list(net.decides[node]):
                bid = d.branches[min(d.branches)][0][1]
                for participant in d.branches:  # the participants take their branches
                    net.machines[participant].take_branch(bid)
                reply = {"ok": True} if rng.random() < 0.5 else {"error": "Aborted", "why": "x"}
                outcomes["decided"] += 1
                net.feed(node, DecisionDone(now=net.now, corr=d.corr, reply=reply))
            net.decides[node].clear()

    outcomes = collections.Counter[str]()
    for seed in range(30):
        net = Net("ABC")
        accounts(net, {"a": "A", "b": "B", "c": "C"})
        sids: list[int] = []
        asked: dict[int, tuple[str, int]] = {}
        excused: set[int] = set()
        for _ in range(60):
            choice = rng.random()
            if choice < 0.55:
                payload: dict[str, Any] = {"op": rng.choice(ops), "type": ACC, "tv": 1}
                payload["key"] = pack({"number": rng.choice("abc")})
                if sids and rng.random() < 0.7:
                    payload["s"] = rng.choice(sids)
                else:
                    payload["begin"] = "serializable"
                if payload["op"] == "tx.commit" and rng.random() < 0.8:
                    o = net.stores["B"].objects[pack({"number": "b"})]
                    payload["w"] = [write(o, balance=rng.randrange(9))]
                payload["req"] = ["r", rng.randrange(40)] if rng.random() < 0.5 else None
                node, conn = rng.choice("ABC"), rng.randrange(3)
                reply = net.op(node, payload, conn=conn)
                asked[net.corrs] = (node, conn)
                if reply and "s" in reply:
                    sids.append(reply["s"])
            elif choice < 0.62:
                net.cluster(up=set(rng.sample("ABC", rng.randrange(1, 4))))
            elif choice < 0.72:
                for node in "ABC":
                    net.fire(node, rng.choice([RPC_TIMER, SWEEP_TIMER, COMMIT_TIMER]))
            elif choice < 0.85:
                decide_all(net)
            else:
                node, conn = rng.choice("ABC"), rng.randrange(3)
                answered = {r.corr for r in net.replies}
                excused |= {c for c, nc in asked.items() if nc == (node, conn)} - answered
                net.feed(node, ClientGone(now=net.now, conn=conn))
        # The end: every decision made, every client gone, every node up, time passes.
        for node in "ABC":
            net.fire(node, COMMIT_TIMER)
        decide_all(net)
        answered = {r.corr for r in net.replies}
        assert set(asked) - answered <= excused, seed
        for node in "ABC":
            for conn in range(3):
                net.feed(node, ClientGone(now=net.now, conn=conn))
        net.cluster(up=set("ABC"))
        net.now += 100.0
        for node in "ABC":
            net.fire(node, SWEEP_TIMER)
        for node, dp in net.machines.items():
            assert dp.sessions == {} and dp.branches == {}, (seed, node)
            assert dp.running == {}, (seed, node)
        assert not [log for log in net.logs if log.level == "error"], (seed, net.logs)
        outcomes.update(r.payload.get("error", "ok") for r in net.replies)
    # The storm did commit, abort, time out and refuse things.
    assert {"ok", "TransactionClosed", "Unavailable", "Aborted"} <= set(outcomes), outcomes
    assert outcomes["decided"] > 20, outcomes


def _run_until(net: Net, until: float, step: float = 0.5) -> None:
    """Advance time to ``until`` in steps, firing every timer due on every node."""
    while net.now < until:
        net.now = min(until, net.now + step)
        for node in net.machines:
            for name, at in sorted(net.timers[node].items()):
                if at <= net.now and net.timers[node].get(name) == at:
                    del net.timers[node][name]
                    net.feed(node, TimerFired(now=net.now, name=name))


def test_a_long_swap_is_kept_alive_by_its_progress_not_cut_by_rpc_timeout() -> None:
    net = Net("AB", rpc_timeout=2.0, sweep_every=1.0, branch_idle=30.0)
    net.hold = lambda ex: ex.op == "branch.overwrite"
    s = net.ok("A", {"op": "tx.begin"})["s"]
    swap = {"op": "tx.overwrite", "s": s, "type": ACC, "tv": 1, "job": "j", "parts": None}
    assert net.op("A", swap) is None  # A's branch, then B's: both running (held)
    net.release_held()  # A's own branch is done; B's is running now
    _run_until(net, 3.0)
    assert net.held and net.held[0][1].op == "branch.overwrite"  # B still works
    busy = [p for a, b, p in net.sent if a == "B" and b == "A" and p.get("t") == "data.busy"]
    assert busy, "B tells A it still runs the swap"
    _run_until(net, 20.0)  # ten rpc_timeouts: no Unavailable while B reports progress
    assert not [r for r in net.replies if "error" in r.payload], net.replies
    net.release_held()
    done = [r.payload for r in net.replies if "deleted" in r.payload]
    assert done and "error" not in done[-1], net.replies[-3:]


def test_a_long_swap_on_a_peer_that_stops_reporting_times_out() -> None:
    net = Net("AB", rpc_timeout=2.0, sweep_every=1.0, branch_idle=30.0)
    net.hold = lambda ex: ex.op == "branch.overwrite"
    s = net.ok("A", {"op": "tx.begin"})["s"]
    swap = {"op": "tx.overwrite", "s": s, "type": ACC, "tv": 1, "job": "j", "parts": None}
    assert net.op("A", swap) is None
    net.release_held()
    _run_until(net, 4.0)
    net.silent.add("B")  # B's notes (and its answer) are lost from here on
    _run_until(net, 6.5)
    errors = [r.payload for r in net.replies if "error" in r.payload]
    assert errors and errors[-1]["error"] == "TransactionLost", net.replies
    assert "did not answer branch.overwrite" in errors[-1]["message"]


def test_busy_notes_never_extend_an_ordinary_call() -> None:
    net = Net("ABC", rpc_timeout=2.0, sweep_every=1.0, branch_idle=30.0)
    accounts(net, {"c": "C"})
    s = net.ok("A", get("c", begin="serializable"))["s"]
    net.silent.add("B")
    assert net.op("A", {"op": "tx.count", "s": s, "type": ACC}) is None
    # A note from B for every call A waits for: ignored (not a long op).
    _run_until(net, 1.5)
    for name in list(net.timers["A"]):
        if name.startswith(RPC_TIMER):
            note = {"t": "data.busy", "id": int(name[len(RPC_TIMER) :])}
            net.feed("A", Received(now=net.now, sender="B", payload=note))
    _run_until(net, 2.5)
    reply = net.replies[-1].payload
    assert reply["error"] == "TransactionLost" and "did not answer branch.count" in reply["message"]
    assert not [p for _, _, p in net.sent if p.get("t") == "data.busy"]  # no long op ran


# ------------------------------------------------------- distributed deadlocks
def test_find_cycles_lists_each_cycle_once_from_its_smallest_id() -> None:
    edges = [("A.1", "B.2"), ("B.2", "C.3"), ("C.3", "A.1"), ("C.3", "D.4"), ("E.5", "A.1")]
    assert find_cycles(edges) == [("A.1", "B.2", "C.3")]
    assert find_cycles([("A.1", "B.2"), ("B.2", "C.3")]) == []
    assert victim_of(("A.1", "B.2", "C.3")) == "C.3"


def test_victims_of_leave_no_cycle_in_a_dense_graph() -> None:
    # Under heavy contention one strongly connected part holds many cycles: one
    # search must pick victims for all of them, not one per part (issue 14: gaps).
    rng = random.Random(5)
    for _ in range(50):
        ids = [f"{rng.choice('ABC')}.{i}" for i in range(12)]
        edges = {(rng.choice(ids), rng.choice(ids)) for _ in range(30)}
        victims = victims_of(edges)
        left = [(w, h) for w, h in edges if w not in victims and h not in victims]
        assert find_cycles(left) == []
        for victim, cycle in victims.items():
            assert victim in cycle


def test_the_victim_is_the_youngest_by_rank() -> None:
    started = {"A.9": 1.0, "B.2": 3.0, "C.5": 2.0}
    cycle = ("A.9", "B.2", "C.5")
    assert victim_of(cycle, lambda b: (started[b], b)) == "B.2"  # not the greatest id
    assert victims_of(
        [("A.9", "B.2"), ("B.2", "C.5"), ("C.5", "A.9")], lambda b: (started[b], b)
    ) == {"B.2": cycle}


def _crossed(net: Net) -> tuple[int, int]:
    """Session on A waiting on B, session on B waiting on A (ops held at the stores)."""
    accounts(net, {"a": "A", "b": "B"})
    s_a = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    s_b = net.ok("B", get("b", begin="serializable", lock="write"))["s"]
    net.hold = lambda ex: ex.fields.get("t") == "data.req"  # peers' ops wait (for a lock)
    assert net.op("A", get("b", s=s_a, lock="write")) is None  # waits on B
    assert net.op("B", get("a", s=s_b, lock="write")) is None  # waits on A
    return s_a, s_b


def _tick(net: Net, rounds: int) -> None:
    for _ in range(rounds):
        for node in sorted(net.machines):
            net.fire(node, WAITS_TIMER)


def test_a_cycle_across_two_nodes_dooms_one_victim_with_deadlock() -> None:
    net = Net("AB", deadlock_wound="off")  # detection alone (wounds: tests below)
    s_a, s_b = _crossed(net)
    bid_a, bid_b = f"A.{s_a}", f"B.{s_b}"
    net.waits = {"B": [(bid_a, bid_b)], "A": [(bid_b, bid_a)]}
    _tick(net, 1)
    assert net.machines["B"].stats["deadlock_victims"] == 0  # seen once: not yet
    _tick(net, 2)
    victim, survivor = (bid_b, bid_a) if bid_b > bid_a else (bid_a, bid_b)
    coord = victim[0]
    other = survivor[0]
    assert net.machines[coord].stats["deadlock_victims"] == 1
    assert net.machines[other].stats["deadlock_victims"] == 0
    errors_seen = [r.payload.get("error") for r in net.replies if "error" in r.payload]
    assert errors_seen == ["Deadlock"]
    assert victim in net.ended[coord]  # its branch rolled back where it is (its locks go)
    assert any(p.get("op") == "branch.end" and p["b"] == victim for _, _, p in net.sent)
    assert survivor not in net.ended[other]


def test_waits_without_a_cycle_doom_nobody() -> None:
    net = Net("AB", deadlock_wound="off")
    s_a, s_b = _crossed(net)
    # B.s waits for A.s on A; A.s waits for a third transaction on B: a chain.
    net.waits = {"A": [(f"B.{s_b}", f"A.{s_a}")], "B": [(f"A.{s_a}", "C.77")]}
    _tick(net, 10)
    assert all(m.stats["deadlock_victims"] == 0 for m in net.machines.values())
    assert not [r for r in net.replies if "error" in r.payload]
    # Waits are shared with peers only while there are some.
    shared = [p for _, _, p in net.sent if p.get("t") == "data.waits"]
    assert shared and all(p["e"] for p in shared)


def test_an_older_waiter_wounds_the_younger_blocked_holder_at_once() -> None:
    # Wound-wait: no cycle search, no confirmation round; the younger of the two
    # (started later; equal start: the greater id) is doomed at the first tick.
    net = Net("AB")
    s_a, s_b = _crossed(net)
    bid_a, bid_b = f"A.{s_a}", f"B.{s_b}"
    started = {b: net.machines[b[0]].sessions[int(b[2:])].started for b in (bid_a, bid_b)}
    net.waits = {"B": [(bid_a, bid_b)], "A": [(bid_b, bid_a)]}
    _tick(net, 1)
    young = max((bid_a, bid_b), key=lambda b: (started[b], b))
    old = bid_a if young == bid_b else bid_b
    assert net.machines[young[0]].stats["deadlock_wounds"] == 1
    assert net.machines[old[0]].stats["deadlock_wounds"] == 0
    assert [r.payload.get("error") for r in net.replies if "error" in r.payload] == ["Deadlock"]
    assert young in net.ended[young[0]]
    assert old not in net.ended[old[0]]


def test_a_younger_holder_that_is_running_is_not_wounded() -> None:
    # ``"blocked"``: the holder is not waiting for anything, so it will end soon.
    net = Net("AB")
    s_a, s_b = _crossed(net)
    bid_a, bid_b = f"A.{s_a}", f"B.{s_b}"
    old, young = sorted(
        (bid_a, bid_b), key=lambda b: net.machines[b[0]].sessions[int(b[2:])].started
    )
    net.waits = {young[0]: [(old, young)]}  # the only edge: old waits for young
    _tick(net, 5)
    assert all(m.stats["deadlock_victims"] == 0 for m in net.machines.values())
    # With "any" the same edge wounds the younger holder.
    net2 = Net("AB", deadlock_wound="any")
    s_a, s_b = _crossed(net2)
    bid_a, bid_b = f"A.{s_a}", f"B.{s_b}"
    old, young = sorted(
        (bid_a, bid_b), key=lambda b: net2.machines[b[0]].sessions[int(b[2:])].started
    )
    net2.waits = {young[0]: [(old, young)]}
    _tick(net2, 2)
    assert net2.machines[young[0]].stats["deadlock_wounds"] == 1


def test_a_replay_ranks_from_its_first_attempt() -> None:
    # Two sessions begun at the same instant: the greater id (B's) is the younger and
    # is wounded (test above).  B's is a replay whose first attempt began 2 s ago
    # (``age`` on its ``begin``, section 2b): it is the older now, and A's is wounded.
    net = Net("AB", deadlock_age_max=10.0)
    accounts(net, {"a": "A", "b": "B"})
    s_a = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    s_b = net.ok("B", get("b", begin="serializable", lock="write", age=2.0))["s"]
    net.hold = lambda ex: ex.fields.get("t") == "data.req"
    assert net.op("A", get("b", s=s_a, lock="write")) is None
    assert net.op("B", get("a", s=s_b, lock="write")) is None
    bid_a, bid_b = f"A.{s_a}", f"B.{s_b}"
    assert net.machines["B"].sessions[s_b].age == 2.0
    net.waits = {"B": [(bid_a, bid_b)], "A": [(bid_b, bid_a)]}
    _tick(net, 1)
    assert net.machines["A"].stats["deadlock_wounds"] == 1
    assert net.machines["B"].stats["deadlock_wounds"] == 0
    assert bid_a in net.ended["A"]
    assert bid_b not in net.ended["B"]


def test_a_replay_cannot_claim_more_than_the_bound() -> None:
    # Untrusted input: a claimed age is bounded by ``deadlock_age_max``; a wrong one
    # is refused with BadArgument and opens no session.
    net = Net("A", deadlock_age_max=3.0)
    accounts(net, {"a": "A"})
    s = net.ok("A", get("a", begin="serializable", age=1e9))["s"]
    assert net.machines["A"].sessions[s].age == 3.0
    for bad in (-1.0, float("inf"), float("nan"), "old", True, [1]):
        reply = net.op("A", get("a", begin="serializable", age=bad))
        assert reply is not None and reply.get("error") == "BadArgument", (bad, reply)
    assert list(net.machines["A"].sessions) == [s]
    assert claimed_age(None, 3.0) == 0.0
    assert claimed_age(2, 3.0) == 2.0
    assert claimed_age(2.5, 0.0) == 0.0  # 0: every replay ranks anew
    default = Net("A")  # deadlock_age_max 0 by default: the age is checked, then ignored
    accounts(default, {"a": "A"})
    s = default.ok("A", get("a", begin="serializable", age=2.0))["s"]
    assert default.machines["A"].sessions[s].age == 0.0


def test_stamps_agree_when_the_nodes_clocks_do_not() -> None:
    # A's monotonic clock is 1,000 s ahead of B's (other machines, other boots).
    # Started at the same instant, A's session ranked by raw start times would be
    # the younger on B by 1,000 s; B counts A's lead (its ``now`` on the edges) so
    # both stamps are on one clock: a tie, the greater id is the younger as with
    # equal clocks, and B wounds its own session, not A's.
    net = Net("AB")
    net.skew = {"A": 1000.0}
    s_a, s_b = _crossed(net)
    bid_a, bid_b = f"A.{s_a}", f"B.{s_b}"
    net.waits = {"B": [(bid_a, bid_b)], "A": [(bid_b, bid_a)]}
    _tick(net, 1)
    assert net.machines["B"].deadlocks.ahead["A"] == 1000.0
    assert net.machines["B"].stats["deadlock_wounds"] == 1
    assert net.machines["A"].stats["deadlock_victims"] == 0
    assert bid_b in net.ended["B"] and bid_a not in net.ended["A"]


def test_a_waiter_of_unknown_age_wounds_nobody() -> None:
    # C.77 coordinates elsewhere and never sent its age: it ranks as youngest.
    net = Net("AB")
    s_a, _ = _crossed(net)
    net.waits = {"A": [("C.77", f"A.{s_a}"), (f"A.{s_a}", "C.78")]}
    _tick(net, 2)
    assert all(m.stats["deadlock_wounds"] == 0 for m in net.machines.values())


# ------------------------------------------------------------------- sizes
def test_writes_over_the_message_limit_are_too_large_before_any_prepare() -> None:
    from nonstop.dataplane.sizes import MESSAGE_MARGIN

    net = Net("AB", max_message=MESSAGE_MARGIN + 1000)
    objs = accounts(net, {"a": "A", "b": "B"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.ok("A", get("b", s=s, lock="write"))
    big = [objs["b"][0], ACC, 1, pack({"number": "b", "pad": "x" * 2000})]
    reply = net.op("A", {"op": "tx.commit", "s": s, "w": [big], "req": ["c", 9]})
    assert reply is not None and reply["error"] == "TooLarge", reply
    assert "2,0" in reply["message"] and "node B" in reply["message"]
    assert net.decides["A"] == []  # nothing prepared, no vote awaited
    # Writes riding on an op to B are refused the same way (the session goes on).
    s2 = net.ok("A", get("a", begin="serializable"))["s"]
    reply = net.op("A", {"op": "tx.count", "s": s2, "type": ACC, "scope": ["B"], "w": [big]})
    assert reply is not None and reply["error"] == "TooLarge", reply


# ---------------------------------------------------------------- membership
def test_holdings_of_a_node_count_its_objects_by_type_in_a_session_of_their_own() -> None:
    net = Net("AB")
    accounts(net, {"b1": "B", "b2": "B", "a1": "A"})
    reply = net.ok("A", {"op": "member.holdings", "name": "B"})
    assert reply == {"node": "B", "objects": 2, "types": {ACC: 2}}
    assert leave_refusal(reply) == (
        f"B holds 2 objects (2 {ACC}): it cannot leave while it holds objects "
        "(partitions cannot move them off a node yet); delete them first"
    )
    assert net.ok("A", {"op": "member.holdings", "name": "A"})["objects"] == 1
    # The read-only session is over on both nodes: nothing left open.
    assert net.machines["A"].sessions == {} and net.machines["B"].branches == {}
    empty = Net("AB")
    assert leave_refusal(empty.ok("A", {"op": "member.holdings", "name": "B"})) is None
    # A node that cannot be asked is not "empty": Unavailable, and unknown names are refused.
    net.cluster(up={"A"})
    assert net.op("A", {"op": "member.holdings", "name": "B"})["error"] == "Unavailable"
    assert net.op("A", {"op": "member.holdings", "name": "Z"})["error"] == "BadArgument"
    assert net.machines["A"].sessions == {}


def test_a_lookup_asks_the_node_its_hint_names_even_outside_the_members() -> None:
    """A node out of the view but up still holds its objects: never "not found" for them."""
    net = Net("ABC")
    objs = accounts(net, {"c1": "C"})
    s = net.ok("A", get("c1", begin="serializable"))["s"]  # found on C: the hint says C
    net.ok("A", {"op": "tx.rollback", "s": s})
    locations = {loc: n for n, loc in LOCATIONS.items()}
    view = ClusterChanged(
        now=net.now, members=("A", "B"), up=frozenset("ABC"), quorum="Active", locations=locations
    )
    net.feed("A", view)
    reply = net.ok("A", get("c1", begin="serializable"))
    assert reply["o"] == objs["c1"]
    # Which is why nothing is created outside the members (a lookup without a hint
    # asks the members only), and a member that holds objects cannot leave.
    st = pack({"number": "c2"})
    reply = net.op(
        "A",
        {"op": "tx.create", "begin": "serializable", "type": ACC, "tv": 1, "st": st, "node": "C"},
    )
    assert reply is not None and reply["error"] == "BadArgument"
    assert "C is not a member" in reply["message"]


def test_a_homed_request_is_recorded_and_looked_up_on_the_home_object_s_node() -> None:
    """docs/design/requests.md: the record rides with the branch that writes the home
    object (here B's, in two-phase commit coordinated by A); ``request.result`` with the
    home asks B from any node; an abort is not recorded on the coordinator."""
    net = Net("ABC")
    objs = accounts(net, {"a": "A", "b": "B"})
    s = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    net.ok("A", get("b", s=s, lock="write"))
    home = objs["b"][0]
    w = [write(objs["a"], balance=1), write(objs["b"], balance=2)]
    net.op("A", {"op": "tx.commit", "s": s, "w": w, "req": ["h", 1], "home": home})
    assert [ex.op for ex in net.stores["B"].execs].count("request.record") == 1
    assert "request.record" not in [ex.op for ex in net.stores["A"].execs]
    net.stores["B"].results[("h", 1)] = [True, None]  # what B's prepared branch recorded
    (decide,) = net.decides["A"]
    net.feed("A", DecisionDone(now=0.0, corr=decide.corr, reply={"ok": True}))
    assert net.replies[-1].payload == {"ok": True}
    # Any node answers for the home (C never took part), through B's store.
    asked = {"op": "request.result", "req": ["h", 1], "home": home}
    assert net.ok("C", asked)["state"] == "committed"
    assert net.stores["B"].execs[-1].op == "request.lookup"
    assert net.stores["B"].execs[-1].bid is not None  # a branch op, fenced like any
    # The same request run again through C: the first outcome, marked, nothing decided.
    s2 = net.ok("C", get("b", begin="serializable", lock="write"))["s"]
    again = {"op": "tx.commit", "s": s2, "w": [w[1]], "req": ["h", 1], "home": home}
    assert net.ok("C", again) == {"ok": True, "again": True}
    assert net.decides["C"] == []
    # ... and through A, which remembers the first outcome (seed 3300577: answered from
    # memory without the mark, the client took this attempt's writes for committed).
    s4 = net.ok("A", get("b", begin="serializable", lock="write"))["s"]
    again = {"op": "tx.commit", "s": s4, "w": [w[1]], "req": ["h", 1], "home": home}
    assert net.ok("A", again) == {"ok": True, "again": True}
    assert len(net.decides["A"]) == 1, "nothing decided for the retry"
    # A home the commit does not write is refused.
    s3 = net.ok("A", get("a", begin="serializable", lock="write"))["s"]
    bad = {"op": "tx.commit", "s": s3, "w": [w[0]], "req": ["h", 2], "home": home}
    assert net.op("A", bad)["error"] == "BadArgument"
    assert ("h", 2) not in net.stores["A"].results  # (an abort of a homed request: not recorded)
    # ... but remembered by the node that saw it, as long as the home has no record.
    asked = {"op": "request.result", "req": ["h", 2], "home": home}
    assert net.ok("A", asked)["state"] == "aborted"
    assert net.ok("C", asked)["state"] == "unknown"


def test_an_op_closed_from_outside_may_end_its_own_session_in_its_finally() -> None:
    """A homed ``request.result`` ends its own session in a ``finally``; when its
    generator is closed from outside (the garbage collector, when a crashed simulated
    node's machine is dropped) that must not try to close the running generator again
    ("generator already executing", printed by the sim campaign)."""
    dp = DataPlane("A", random.Random(1), DataPlaneConfig(check_type=no_type_check))
    s = dp._begin(conn=1, iso="read_committed")

    def op() -> Any:
        try:
            yield None
        finally:
            dp.end_session(s)

    gen = op()
    next(gen)
    s.task = Task(gen, 1, 7, s)
    gen.close()  # as the collector does: the finally runs inside close()
    assert s.state != ACTIVE
