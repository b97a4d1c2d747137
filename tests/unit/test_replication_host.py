"""The replication host (replication/host.py): the glue both runtimes share, driven through a
fake ``HostRuntime`` -- all or nothing before a record is made, an unknown outcome after, a
multi-partition one-node commit decided in the log and its proposal sent again."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from nonstop import errors
from nonstop.dtx.decisions import DECIDED, LOOKUP, PROPOSE
from nonstop.net import plain
from nonstop.replication import PartitionView, ReplicationMachine
from nonstop.replication.data import K_PREPARED
from nonstop.replication.host import Refusal, ReplicationHost
from nonstop.replication.machine import SLICE
from nonstop.runtime.interface import Persist, Persisted, TimerFired

ME = "A"
WRITES = {"00" * 20: ["T", 1, {"x": 1}]}


class FakeRuntime:
    def __init__(self) -> None:
        self.persists: list[Persist] = []
        self.asked: list[dict[str, Any]] = []
        self.loaded: list[str] = []

    def persist(self, action: Persist) -> None:
        self.persists.append(action)

    def emit(self, action: Any) -> None:
        pass

    def submit(self, now: float, entry: dict[str, Any]) -> None:
        pass

    def ask_log(self, now: float, request: dict[str, Any]) -> None:
        self.asked.append(request)

    def release(self, now: float, gtid: str) -> None:
        pass

    def tomb(self, gtid: str) -> str | None:
        return None

    def own_prepare(self, gtid: str) -> list[str]:
        return []

    def load_copy(
        self, name: str, stream_id: int, values: Mapping[str, Any], prepared: Mapping[str, Any]
    ) -> None:
        self.loaded.append(name)

    def resolved(
        self, name: str, txid: str, writes: Mapping[str, Any] | None, commit: bool
    ) -> None:
        pass


def view(name: str, active: str = ME) -> PartitionView:
    return PartitionView(name, 2, active, (active,), (), (active,))


def host_acting(*names: str) -> tuple[ReplicationHost, FakeRuntime]:
    runtime = FakeRuntime()
    machine = ReplicationMachine(ME, random.Random(1), {})
    host = ReplicationHost(machine, runtime, first_local_txid=0, propose_again=lambda: 1.0)
    views = {n: view(n) for n in ("P1", "P2")}
    host.settle(0.0, views, names)
    assert runtime.loaded == sorted(names), "a new stream hands the copy to the store"
    runtime.persists.clear()
    return host, runtime


def durable(host: ReplicationHost, runtime: FakeRuntime, now: float) -> None:
    persists, runtime.persists = runtime.persists, []
    for action in persists:
        host.handle(Persisted(now, action.token))
    host.settle(now, host.machine.views, host.machine.acting)


def test_a_partition_not_acted_for_refuses_before_any_record_is_made() -> None:
    host, runtime = host_acting("P1")
    answers: list[Refusal | None] = []
    refusal = host.replicate(0.1, {"P1": WRITES, "P2": WRITES}, None, answers.append)
    assert refusal is not None and isinstance(refusal.error, errors.NotActive)
    assert not refusal.unknown and not answers
    assert not runtime.persists, "a record was made for a commit refused"


def test_a_lapse_of_the_lease_is_waited_out_and_the_commit_goes_on_when_acting_again() -> None:
    # Session 13: a 200,000-row swap by partition started over at every lapse of the
    # node's lease (a renewal late in the log under the swap's load): its prepare was
    # refused although the node was still the partition's active node at its epoch.
    host, runtime = host_acting("P1")
    views = host.machine.views
    host.settle(0.1, views, [])  # the lease lapsed; the table did not move
    answers: list[Refusal | None] = []
    assert host.replicate(0.2, {"P1": WRITES}, None, answers.append) is None
    host.settle(0.5, views, [])
    assert not runtime.persists and not answers, "made or answered while not acting"
    host.settle(0.7, views, ["P1"])  # the renewal applied
    assert runtime.persists, "the waiting commit was not made once acting again"
    durable(host, runtime, 0.8)
    assert answers == [None]


def test_a_lapse_that_lasts_or_a_change_of_hands_refuses_with_nothing_made() -> None:
    host, runtime = host_acting("P1")
    views = host.machine.views
    host.settle(0.1, views, [])
    answers: list[Refusal | None] = []
    assert host.replicate(0.2, {"P1": WRITES}, None, answers.append) is None
    host.settle(0.2 + host.lapse_wait - 0.01, views, [])
    assert not answers
    host.settle(0.2 + host.lapse_wait, views, [])
    (late,) = answers
    assert late is not None and isinstance(late.error, errors.NotActive) and not late.unknown
    # Another node promoted meanwhile: refused at once, not at the end of the wait.
    assert host.replicate(3.0, {"P1": WRITES}, None, answers.append) is None
    host.settle(3.1, {"P1": PartitionView("P1", 3, "B", ("B",), (), ("B",))}, [])
    moved = answers[1]
    assert moved is not None and isinstance(moved.error, errors.NotActive) and not moved.unknown
    assert "changed hands" in str(moved.error)
    assert not runtime.persists, "a record was made for a refused commit"


def test_a_prepare_waiting_out_a_lapse_is_dropped_when_its_outcome_comes_first() -> None:
    host, _ = host_acting("P1")
    views = host.machine.views
    host.settle(0.1, views, [])
    answers: list[Refusal | None] = []
    assert host.replicate(0.2, {"P1": WRITES}, "B.7", answers.append) is None
    host.outcome(0.3, "B.7", False, ["P1"])  # its coordinator gave up and aborted
    (dropped,) = answers
    assert dropped is not None and not dropped.unknown
    host.settle(0.4, views, ["P1"])
    assert not host.machine.prepared_here("P1", "B.7"), "made after its outcome"


def test_without_a_lapse_wait_a_lapse_refuses_at_once() -> None:
    runtime = FakeRuntime()
    machine = ReplicationMachine(ME, random.Random(1), {})
    host = ReplicationHost(
        machine, runtime, first_local_txid=0, propose_again=lambda: 1.0, lapse_wait=0.0
    )
    views = {"P1": view("P1")}
    host.settle(0.0, views, ["P1"])
    host.settle(0.1, views, [])
    refusal = host.replicate(0.2, {"P1": WRITES}, None, lambda r: None)
    assert refusal is not None and isinstance(refusal.error, errors.NotActive)


class OwnPrepareRuntime(FakeRuntime):
    """This node's participant prepared ``own`` (gtid -> partitions) and waits for it."""

    def __init__(self, own: dict[str, list[str]]) -> None:
        super().__init__()
        self.own = own

    def own_prepare(self, gtid: str) -> list[str]:
        return self.own.get(gtid, [])


def lookups_after_a_long_prepare(own: dict[str, list[str]]) -> list[dict[str, Any]]:
    """A prepare of ``B.7`` on P1, durable, then no outcome for 3 s: what the host asks."""
    runtime = OwnPrepareRuntime(own)
    machine = ReplicationMachine(ME, random.Random(1), {})
    host = ReplicationHost(machine, runtime, first_local_txid=0, propose_again=lambda: 1.0)
    views = {"P1": view("P1")}
    host.settle(0.0, views, ["P1"])
    answers: list[Refusal | None] = []
    assert host.replicate(0.1, {"P1": WRITES}, "B.7", answers.append) is None
    durable(host, runtime, 0.2)
    assert answers == [None]  # the yes vote may go
    for step in range(1, 31):
        host.settle(0.2 + step * 0.1, views, ["P1"])
    return [r for r in runtime.asked if r.get("g") == "B.7"]


def test_a_prepare_its_own_participant_waits_on_is_not_resolved_by_the_host() -> None:
    # Session 13: 2 s (resolve_after) into a 200,000-row swap by partition the active node
    # asked the decision log about its own participant's prepared record, found nothing
    # decided (other participants were still preparing) and proposed abort: the swap
    # started over.  The participant's outcome comes from the distributed commit.
    assert lookups_after_a_long_prepare({"B.7": ["P1"]}) == []
    # A prepared record this node's participant does not wait on (taken over, or from
    # before a restart) is still looked up after resolve_after.
    asked = lookups_after_a_long_prepare({})
    assert asked and asked[0]["t"] == LOOKUP


def test_a_commit_completes_once_durable_and_fails_as_unknown_when_the_stream_ends() -> None:
    host, runtime = host_acting("P1", "P2")
    answers: list[Refusal | None] = []
    assert host.replicate(0.1, {"P1": WRITES}, None, answers.append) is None
    assert not answers, "answered before the record was durable"
    durable(host, runtime, 0.2)
    assert answers == [None]
    assert host.replicate(0.3, {"P1": WRITES}, None, answers.append) is None
    host.settle(0.4, {"P1": view("P1", "B"), "P2": view("P2")}, ["P2"])  # P1 moved away
    (failed,) = answers[1:]
    assert failed is not None and failed.unknown, "a record made then failed: outcome unknown"
    assert isinstance(failed.error, errors.Unavailable)


def test_a_commit_over_two_partitions_is_decided_in_the_log_and_proposed_again() -> None:
    host, runtime = host_acting("P1", "P2")
    answers: list[Refusal | None] = []
    assert host.replicate(0.1, {"P1": WRITES, "P2": WRITES}, None, answers.append) is None
    durable(host, runtime, 0.2)
    (proposal,) = runtime.asked
    assert proposal["t"] == PROPOSE and proposal["o"] == "commit" and not answers
    host.settle(1.5, host.machine.views, host.machine.acting)  # the log dropped it
    assert runtime.asked == [proposal, proposal], "an unanswered proposal is sent again"
    host.decision(1.6, {"t": DECIDED, "g": proposal["g"], "o": "commit"})
    assert answers == [None]


class ResolvingRuntime(FakeRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.installed: dict[str, dict[str, Any]] = {}

    def resolved(
        self, name: str, txid: str, writes: Mapping[str, Any] | None, commit: bool
    ) -> None:
        if writes is not None and commit:
            self.installed[txid] = dict(writes)  # (the real node copies it here too)


def test_a_large_prepared_record_resolved_at_promotion_reaches_the_store_whole() -> None:
    # 3,000 writes: its commit outcome goes in parts of 1,000, two made in the event that
    # resolves it -- each takes its writes out of the copy's prepared record (data.py).
    writes = {f"{i:040x}": ["T", 1, {"x": i}] for i in range(3000)}
    disk = {K_PREPARED + b"P1\0g1": plain.pack(writes)}
    runtime = ResolvingRuntime()
    machine = ReplicationMachine(ME, random.Random(1), disk)
    host = ReplicationHost(machine, runtime, first_local_txid=0, propose_again=lambda: 1.0)
    host.settle(0.0, {n: view(n) for n in ("P1", "P2")}, ["P1"])
    assert any(a.get("g") == "g1" for a in runtime.asked), "resolved from the decision log"
    host.decision(0.1, {"t": DECIDED, "g": "g1", "o": "commit"})
    assert machine.making("P1"), "the outcome's last part is still to make"
    assert runtime.installed["g1"] == writes, "every write of the record goes to the store"


class KnownRuntime(ResolvingRuntime):
    """This node's participant applied the commit before a restart (its tombstone)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def tomb(self, gtid: str) -> str | None:
        return "commit"

    def load_copy(
        self, name: str, stream_id: int, values: Mapping[str, Any], prepared: Mapping[str, Any]
    ) -> None:
        super().load_copy(name, stream_id, values, prepared)
        self.copies.append((dict(values), dict(prepared)))


def test_the_store_takes_the_copy_only_once_the_outcomes_resolved_at_the_start_are_made() -> None:
    writes = {f"{i:040x}": ["T", 1, {"x": i}] for i in range(3000)}
    disk = {K_PREPARED + b"P1\0g1": plain.pack(writes)}
    runtime = KnownRuntime()
    machine = ReplicationMachine(ME, random.Random(1), disk)
    host = ReplicationHost(machine, runtime, first_local_txid=0, propose_again=lambda: 1.0)
    host.settle(0.0, {n: view(n) for n in ("P1", "P2")}, ["P1"])
    assert machine.making("P1") and runtime.loaded == [], "not before its outcome is made"
    host.handle(TimerFired(0.0, SLICE))  # the next turn of the loop
    host.settle(0.0, machine.views, machine.acting)
    assert runtime.loaded == ["P1"]
    ((values, prepared),) = runtime.copies
    assert values == writes and prepared == {}, "the copy with the commit applied"


def test_a_record_taken_over_gets_into_the_store_when_this_nodes_own_branch_ends_first() -> None:
    # Seed 3100502: gtid g1 had a branch on this node (another partition) and a prepared
    # record of P1 from the old active node.  Promoted for P1, this node hands the record
    # to the store; its own participant's phase two then gives P1 its outcome before the
    # decision log answers the lookup -- the store must still get P1's writes.
    disk = {K_PREPARED + b"P1\0g1": plain.pack(WRITES)}
    runtime = ResolvingRuntime()
    machine = ReplicationMachine(ME, random.Random(1), disk)
    host = ReplicationHost(machine, runtime, first_local_txid=0, propose_again=lambda: 1.0)
    host.settle(0.0, {n: view(n) for n in ("P1", "P2")}, ["P1"])
    assert runtime.loaded == ["P1"] and any(a.get("g") == "g1" for a in runtime.asked)
    host.outcome(0.1, "g1", True, ["P2"])  # this node's own branch wrote P2 only
    assert runtime.installed.get("g1") == WRITES, "P1's writes never reached the store"
    assert "g1" not in machine.data.prepared_of("P1")
    host.decision(0.2, {"t": DECIDED, "g": "g1", "o": "commit"})  # the late answer
    assert runtime.installed["g1"] == WRITES
