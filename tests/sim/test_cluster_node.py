"""ClusterNode on the simulator: election, quorum (D16), admin requests, discovery (C2).

Each test builds a small cluster by hand and drives one situation; the random
campaign (test_campaign.py) covers the combinations.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from nonstop.cluster.failure import location_code
from nonstop.cluster.node import ClusterNode
from nonstop.runtime.interface import ClientRequest, Log, Persist, Received, Reply, Started
from nonstop.sim.checker import ClusterChecker
from nonstop.sim.core import Simulation

pytestmark = pytest.mark.timeout(60)


def build(
    sim_cluster: Any,
    names: list[str],
    seed: int = 1,
    *,
    members: list[str] | None = None,
    **kw: Any,
) -> tuple[Simulation, ClusterChecker]:
    sim = Simulation(seed)
    checker = ClusterChecker().attach(sim)
    sim_cluster.add(sim, names, ClusterNode, members=members, **kw)
    return sim, checker


def node(sim: Simulation, name: str) -> ClusterNode:
    m = sim.machine(name)
    assert isinstance(m, ClusterNode)
    return m


def ask(sim: Simulation, name: str, payload: dict[str, Any], wait: float = 1.0) -> Any:
    rid = sim.request(name, payload)
    deadline = sim.now + wait
    while sim.requests[rid].reply is None and sim.now < deadline:
        sim.run_for(0.01)
    return sim.requests[rid].reply


def leader(sim: Simulation, names: list[str]) -> str:
    leaders = {node(sim, n).raft.leader for n in names}
    assert len(leaders) == 1 and None not in leaders, leaders
    return leaders.pop()


def states(status: dict[str, Any]) -> dict[str, str]:
    return {n["name"]: n["state"] for n in status["nodes"]}


def test_three_nodes_elect_a_leader_and_report_status(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim, checker = build(sim_cluster, names)
    sim.run_until(3.0)
    lead = leader(sim, names)
    for name in names:
        status = ask(sim, name, {"op": "status"})
        assert set(status) >= {"name", "view", "quorum", "leader", "term", "nodes", "warnings"}
        assert status["name"] == name
        assert status["quorum"] == "Active"
        assert status["leader"] == lead
        assert status["view"] == 1
        assert status["members"] == names
        assert states(status) == {n: ("Self" if n == name else "Up") for n in names}
        assert all(set(n) >= {"name", "address", "state"} for n in status["nodes"])
        assert status["warnings"] == []
    reply = ask(sim, lead, {"op": "propose", "value": "hello"})
    assert reply["ok"] is True
    follower = next(n for n in names if n != lead)
    assert ask(sim, follower, {"op": "propose", "value": "x"}) == {
        "error": "NotLeader",
        "leader": lead,
        "message": f"the leader is {lead}",
    }
    assert checker.violations == []


def test_minority_side_is_disabled_refuses_work_and_is_seen_down(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim, checker = build(sim_cluster, names, seed=2)
    sim.run_until(2.0)
    sim.partition(["n3"])
    sim.run_until(4.0)
    alone = ask(sim, "n3", {"op": "status"})  # status is answered while Disabled
    assert alone["quorum"] == "Disabled"
    refused = ask(sim, "n3", {"op": "propose", "value": 1})
    assert refused["error"] == "QuorumLost"
    assert ask(sim, "n3", {"op": "join", "name": "n9", "address": "x"})["error"] == "QuorumLost"
    majority = ask(sim, "n1", {"op": "status"})
    assert majority["quorum"] == "Partial"
    assert states(majority)["n3"] == "Down"
    lead = leader(sim, ["n1", "n2"])
    assert ask(sim, lead, {"op": "propose", "value": 2})["ok"] is True
    sim.heal()
    sim.run_until(7.0)
    assert {node(sim, n).quorum_state for n in names} == {"Active"}
    assert leader(sim, names) in names
    assert checker.violations == []
    assert checker.refused_while_disabled == 2


def test_node_that_cannot_hear_the_others_is_disabled_and_seen_down(sim_cluster):
    """One-way partition: n3's messages go out, nothing comes in."""
    names = ["n1", "n2", "n3"]
    sim, checker = build(sim_cluster, names, seed=3)
    sim.run_until(2.0)
    sim.block("n1", "n3")
    sim.block("n2", "n3")
    sim.run_until(4.0)
    assert node(sim, "n3").quorum_state == "Disabled"
    # n3 still talks, but a Disabled node's messages are not liveness: it is Down to the rest
    for name in ("n1", "n2"):
        assert states(ask(sim, name, {"op": "status"}))["n3"] == "Down"
        assert node(sim, name).quorum_state == "Partial"
    sim.heal()
    sim.run_until(6.0)
    assert {node(sim, n).quorum_state for n in names} == {"Active"}
    assert checker.violations == []


def test_join_through_a_follower_is_forwarded_to_the_leader_and_leave_works(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim, checker = build(sim_cluster, [*names, "n4"], seed=4, members=names)
    # n4 knows nobody's address by configuration in this test: it waits to be added
    sim.crash("n4")
    bare = sim_cluster.config("n4", [])
    sim.nodes["n4"].factory = lambda rng, rec: ClusterNode(bare, rng, rec)
    sim.restart("n4")
    sim.run_until(2.0)
    lead = leader(sim, names)
    follower = next(n for n in names if n != lead)
    reply = ask(sim, follower, {"op": "join", "name": "n4", "address": "sim://n4"}, wait=3.0)
    assert reply["ok"] is True
    assert "n4" in reply["members"]
    sim.run_until(sim.now + 2.0)
    everyone = [*names, "n4"]
    assert leader(sim, everyone) == lead
    # Liveness views may follow the join's view; every node is at the same one, which has
    # every node live.
    (final,) = {node(sim, n).view for n in everyone}
    assert final >= reply["view"]
    assert {tuple(node(sim, n).view_live) for n in everyone} == {tuple(everyone)}
    assert len({str(node(sim, n).views) for n in everyone}) == 1
    assert {node(sim, n).quorum_state for n in everyone} == {"Active"}  # n4 learned addresses
    reply = ask(sim, lead, {"op": "leave", "name": "n2" if lead != "n2" else "n1"}, wait=3.0)
    assert reply["ok"] is True
    assert len(reply["members"]) == 3
    assert checker.violations == []


def test_discovery_announcements_add_peers_but_static_addresses_win(sim_cluster):
    names = ["n1", "n2"]
    sim, _ = build(sim_cluster, names, seed=5)
    sim.run_until(0.5)
    n1 = node(sim, "n1")
    n1.handle(Received(sim.now, "n7", {"k": "disc", "name": "n7", "address": "10.0.0.7:1"}))
    n1.handle(Received(sim.now, "n2", {"k": "disc", "name": "n2", "address": "evil:1"}))
    n1.handle(Received(sim.now, "n2", {"k": "disc", "name": 5}))  # malformed: ignored
    status = n1.handle(ClientRequest(sim.now, 1, {"op": "status"}))[0].payload
    by_name = {n["name"]: n for n in status["nodes"]}
    assert by_name["n7"]["state"] == "Discovered"
    assert by_name["n7"]["address"] == "10.0.0.7:1"
    assert by_name["n7"]["member"] is False
    assert by_name["n2"]["address"] == "sim://n2"


def test_duplicate_location_shows_up_in_status_warnings(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim = Simulation(6)
    for name in names:
        extra = {"location": location_code("n1")} if name == "n3" else {}
        cfg = sim_cluster.config(name, names, names, **extra)
        sim.add_node(name, lambda rng, rec, cfg=cfg: ClusterNode(cfg, rng, rec))
    sim.run_until(2.0)
    status = ask(sim, "n1", {"op": "status"})
    assert states(status)["n3"] == "DuplicateLocation"
    assert any("n3" in w and "location code" in w for w in status["warnings"])
    assert status["quorum"] == "Partial"  # n3 does not count
    # and nothing but detector traffic flows between n3 and the others
    raft_traffic = []
    sim.observers.append(
        lambda s, n, e, actions: raft_traffic.extend(
            (n, a.to) for a in actions if getattr(a, "to", None) and a.payload.get("k") != "fd"
        )
    )
    sim.run_until(3.0)
    assert raft_traffic, "the healthy nodes keep talking"
    assert not [(n, to) for n, to in raft_traffic if "n3" in (n, to) and n != "n3"]
    assert not [(n, to) for n, to in raft_traffic if n == "n3" and to == "n1"]


def test_unknown_and_malformed_requests_get_bad_request(sim_cluster):
    sim, _ = build(sim_cluster, ["n1"], seed=7)
    sim.run_until(1.0)
    assert ask(sim, "n1", {"op": "dance"})["error"] == "BadRequest"
    assert ask(sim, "n1", "not a dict")["error"] == "BadRequest"
    assert ask(sim, "n1", {"op": "propose", "value": 1})["ok"] is True  # a cluster of one


def test_committed_entries_survive_a_full_cluster_restart(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim, checker = build(sim_cluster, names, seed=8)
    sim.run_until(2.0)
    lead = leader(sim, names)
    acked = [ask(sim, lead, {"op": "propose", "value": f"v{i}"})["index"] for i in range(5)]
    for name in names:
        sim.crash(name)
    for name in names:
        sim.restart(name)
    sim.run_until(sim.now + 3.0)
    lead = leader(sim, names)
    final = ask(sim, lead, {"op": "propose", "value": "after"})
    assert final["ok"] is True and final["index"] > max(acked)
    sim.run_until(sim.now + 1.0)
    digests = {node(sim, n).applied_digest for n in names}
    assert len(digests) == 1
    for index in acked:
        assert checker.values[index]["v"] == f"v{acked.index(index)}"
    assert checker.violations == []


def test_quorum_off_never_disables_and_warns(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim, _ = build(sim_cluster, names, seed=9, quorum={"mode": "off"})
    sim.run_until(2.0)
    sim.partition(["n3"])
    sim.run_until(4.0)
    status = ask(sim, "n3", {"op": "status"})
    assert status["quorum"] == "Partial"
    assert any("split brain" in w for w in status["warnings"])


def test_quorum_state_follows_the_policy_in_the_log_not_the_config_file(sim_cluster):
    """The D16 policy is cluster state: a node configured "majority" whose log says "off"
    evaluates "off" (a lone node stays enabled), and vice versa."""
    import msgpack

    from nonstop.cluster.quorum import QuorumPolicy
    from nonstop.cluster.raft import log_key
    from nonstop.runtime.interface import Started

    entry = {"voters": ["n1", "n2", "n3"], "old": None, "policy": QuorumPolicy.off().to_config()}
    rec = {log_key(1): msgpack.packb([0, "m", entry], use_bin_type=True)}
    lone = ClusterNode(
        sim_cluster.config("n1", ["n1", "n2", "n3"], ["n2", "n3"]), random.Random(1), rec
    )
    lone.handle(Started(0.0))
    assert lone.raft.policy.mode == "off"
    assert lone.quorum_state != "Disabled"  # majority (the file) would say Disabled
    assert any("split brain" in w for w in lone.status()["warnings"])


def test_snapshot_reset_to_the_initial_state_is_applied(sim_cluster):
    """A snapshot entry with state None (quorum-off reset to index 0) resets the applied state."""
    from nonstop.cluster.raft import Entry

    sim, _ = build(sim_cluster, ["n1", "n2", "n3"])
    sim.run_until(2.0)
    n1 = node(sim, "n1")
    assert n1.applied_index > 0
    n1._apply([Entry(0, 0, "snapshot", {"state": None, "members": [], "view_id": 0})])
    assert n1.applied_index == 0 and n1.applied_digest == b""


# ------------------------------------------------------------ tables of the log
class Tally:
    """A toy log table: the values added through the log, in log order."""

    name = "tally"

    def __init__(self) -> None:
        self.values: list[int] = []

    def apply(self, index: int, entry: dict[str, Any]) -> list[Any]:
        self.values.append(entry["v"])
        return []

    def snapshot(self) -> Any:
        return {"values": list(self.values)}

    def restore(self, state: Any) -> None:
        self.values = list((state or {}).get("values", []))

    def forwarded(self, sender: str, entry: dict[str, Any]) -> dict[str, Any] | None:
        v = entry.get("v")
        return {"tally": "add", "v": v} if isinstance(v, int) else None

    def request_key(self, entry: dict[str, Any]) -> Any:
        return entry["v"]


class TallyNode(ClusterNode):
    """A ClusterNode with the toy table; client ``{"op": "add", "v": int}`` submits to it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.tally = Tally()
        self.register_table(self.tally)

    def handle(self, event: Any) -> list[Any]:
        payload = getattr(event, "payload", None)
        if (
            isinstance(event, ClientRequest)
            and isinstance(payload, dict)
            and payload.get("op") == "add"
        ):
            entry = {"tally": "add", "v": payload["v"]}
            return [Reply(event.request_id, {"ok": True}), *self.submit(event.now, "tally", entry)]
        return super().handle(event)


def test_a_registered_table_is_applied_everywhere_kept_in_snapshots_and_restored(sim_cluster):
    names = ["n1", "n2", "n3"]
    sim = Simulation(21)
    checker = ClusterChecker().attach(sim)
    for name in names:
        cfg = sim_cluster.config(name, names, names, snapshot_every=4)
        sim.add_node(name, lambda rng, rec, cfg=cfg: TallyNode(cfg, rng, rec))
    sim.run_until(2.0)
    lead = leader(sim, names)
    follower = next(n for n in names if n != lead)
    for v in range(12):  # through a follower: forwarded to the leader ("tally" envelopes)
        ask(sim, follower if v % 2 else lead, {"op": "add", "v": v})
        sim.run_for(0.05)
    sim.run_for(1.0)
    tallies = {n: node(sim, n).tally.values for n in names}  # type: ignore[attr-defined]
    assert sorted(tallies[lead]) == list(range(12))
    assert all(t == tallies[lead] for t in tallies.values())
    # The snapshots carry the table: a restarted node gets it back from its own snapshot.
    assert node(sim, follower).raft.snapshot_index > 0
    sim.crash(follower)
    sim.restart(follower)
    sim.run_for(2.0)
    assert node(sim, follower).tally.values == tallies[lead]  # type: ignore[attr-defined]
    assert checker.violations == []


def test_tables_are_registered_before_the_first_event_with_a_name_of_their_own(sim_cluster):
    plain = ClusterNode(sim_cluster.config("n1", ["n1"]), random.Random(1), {})
    with pytest.raises(ValueError):
        plain.register_table(type("Raft", (Tally,), {"name": "raft"})())
    plain.register_table(Tally())
    with pytest.raises(ValueError):
        plain.register_table(Tally())  # one table per name
    plain.handle(Started(0.0))
    with pytest.raises(RuntimeError):
        plain.register_table(type("Late", (Tally,), {"name": "late"})())


def test_a_forwarded_table_entry_is_accepted_only_in_its_senders_name(sim_cluster):
    sim = Simulation(22)
    sim.add_node("n1", lambda rng, rec: TallyNode(sim_cluster.config("n1", ["n1"]), rng, rec))
    sim.run_until(2.0)
    n1 = node(sim, "n1")
    assert n1.raft.role == "leader"
    forged = {"k": "tally", "en": True, "b": {"tally": "add", "v": 1, "r": ["n9", 5]}}
    actions = n1.handle(Received(sim.now, "n2", forged))
    assert not any(isinstance(a, Persist) for a in actions)
    assert any(isinstance(a, Log) and "malformed forward" in a.message for a in actions)
    honest = {"k": "tally", "en": True, "b": {"tally": "add", "v": 1, "r": ["n2", 5]}}
    assert any(isinstance(a, Persist) for a in n1.handle(Received(sim.now, "n2", honest)))


def test_a_node_without_the_table_treats_its_entries_as_commands_and_ignores_its_snapshot(
    sim_cluster,
):
    """Snapshots written with a table load on a node without it, and the other way round."""
    import msgpack

    from nonstop.cluster.raft import Entry

    plain = ClusterNode(sim_cluster.config("n1", ["n1"]), random.Random(1), {})
    plain.handle(Started(0.0))
    state = {"digest": b"x" * 16, "views": [], "dl": {"d": {"n1.1": "commit"}, "f": {}}}
    snap = {"state": msgpack.packb(state), "members": ["n1"], "view_id": 1}
    actions = plain._apply([Entry(5, 1, "snapshot", snap)])
    assert plain.applied_index == 5 and not any(isinstance(a, Log) for a in actions)
    tallied = TallyNode(sim_cluster.config("n1", ["n1"]), random.Random(1), {})
    tallied.handle(Started(0.0))
    actions = tallied._apply([Entry(5, 1, "snapshot", snap)])
    assert tallied.tally.values == []
    assert any(isinstance(a, Log) and "no state for tables ['tally']" in a.message for a in actions)
