"""The failure detector (C3, C6): keep-alives, one reconnect, node states, identity checks.

The detector is driven on the simulator (``nonstop.sim``) with bare
FailureDetector machines, so timings here are virtual and exact.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from nonstop.cluster.failure import (
    DetectorConfig,
    FailureDetector,
    NodeIdentity,
    NodeState,
    NotifierRegistry,
    location_code,
)
from nonstop.runtime.interface import (
    Action,
    Notify,
    Received,
    Reconnect,
    Send,
    Started,
    TimerFired,
)
from nonstop.sim.core import NetConfig, Simulation

pytestmark = pytest.mark.timeout(60)


def ident(name: str, *, location: int | None = None, ts: int | None = None, proto=(1, 1)):
    return NodeIdentity(
        name=name,
        address=f"sim://{name}",
        location=location if location is not None else location_code(name),
        timestamp=ts if ts is not None else 1000 + int(name[1:]),
        protocol=proto,
    )


def detector_factory(identity: NodeIdentity, peers: list[str], detectors: dict):
    def make(rng: random.Random, recovered: Mapping[bytes, bytes]) -> FailureDetector:
        det = FailureDetector(identity=identity, config=DetectorConfig(), rng=rng)
        for peer in peers:
            det.add_peer(peer, f"sim://{peer}", static=True)
        detectors[identity.name] = det
        return det

    return make


def cluster(names: list[str], identities: dict | None = None, seed: int = 1):
    sim = Simulation(seed, NetConfig(delay_mean=0.001))
    detectors: dict[str, FailureDetector] = {}
    log: list[tuple[float, str, Action]] = []
    sim.observers.append(
        lambda s, node, event, actions: log.extend((s.now, node, a) for a in actions)
    )
    for name in names:
        identity = (identities or {}).get(name) or ident(name)
        peers = [n for n in names if n != name]
        sim.add_node(name, detector_factory(identity, peers, detectors))
    return sim, detectors, log


def states(log, node: str, peer: str) -> list[str]:
    return [
        a.data["new"]
        for _, n, a in log
        if n == node and isinstance(a, Notify) and a.kind == "node_state" and a.data["peer"] == peer
    ]


def test_peers_come_up_through_the_up_notifier_state():
    sim, dets, log = cluster(["n1", "n2", "n3"])
    sim.run_until(0.5)
    for node in ("n1", "n2", "n3"):
        for peer in ("n1", "n2", "n3"):
            if peer != node:
                assert dets[node].state_of(peer) is NodeState.UP
                assert states(log, node, peer) == ["InUpNotifier", "Up"]


def test_dead_node_is_down_in_well_under_a_second_after_exactly_one_reconnect():
    sim, dets, log = cluster(["n1", "n2", "n3"])
    sim.run_until(1.0)
    sim.crash("n3")
    crashed_at = sim.now
    sim.run_until(3.0)
    down_at = [
        t
        for t, n, a in log
        if n == "n1"
        and isinstance(a, Notify)
        and a.kind == "node_state"
        and a.data == {"peer": "n3", "old": "InDownNotifier", "new": "Down"}
    ]
    assert len(down_at) == 1
    detection = down_at[0] - crashed_at
    # non_response_timeout (0.4) + one interval of grace (0.1) + tick granularity (0.1)
    assert 0.4 < detection <= 0.75, detection
    reconnects = [(t, a) for t, n, a in log if n == "n1" and isinstance(a, Reconnect)]
    assert [a.peer for _, a in reconnects] == ["n3"]
    assert crashed_at + 0.4 < reconnects[0][0] < down_at[0]
    assert states(log, "n1", "n3")[-2:] == ["InDownNotifier", "Down"]
    assert dets["n1"].state_of("n2") is NodeState.UP  # nobody else was declared down


def test_restarted_node_comes_back_up():
    sim, dets, log = cluster(["n1", "n2"])
    sim.run_until(0.5)
    sim.crash("n2")
    sim.run_until(2.0)
    assert dets["n1"].state_of("n2") is NodeState.DOWN
    sim.restart("n2")
    sim.run_until(2.5)
    assert dets["n1"].state_of("n2") is NodeState.UP
    assert states(log, "n1", "n2")[-4:] == ["InDownNotifier", "Down", "InUpNotifier", "Up"]


def test_short_pause_below_the_timeout_is_not_a_failure():
    sim, _dets, log = cluster(["n1", "n2"])
    sim.run_until(0.5)
    sim.pause("n2")
    sim.run_until(0.8)  # 0.3 s < non_response_timeout
    sim.resume("n2")
    sim.run_until(2.0)
    assert "Down" not in states(log, "n1", "n2")
    assert not [a for _, n, a in log if n == "n1" and isinstance(a, Reconnect)]


def test_any_message_counts_as_liveness():
    det = FailureDetector(identity=ident("n1"))
    det.add_peer("n2", "sim://n2")
    det.handle(Started(0.0))
    det.on_message(0.0, "n2", {"t": "hello", "id": ident("n2").to_wire(), "en": True})
    assert det.state_of("n2") is NodeState.UP
    t = 0.0
    while t < 3.0:  # no keep-alive reply ever, but other traffic keeps arriving
        t += 0.1
        det.heard(t, "n2", True)
        det.handle(_tick(t))
    assert det.state_of("n2") is NodeState.UP


def _tick(t: float):
    from nonstop.runtime.interface import TimerFired

    return TimerFired(t, "tick")


def test_disabled_node_stops_answering_keepalives_and_is_seen_down():
    sim, dets, log = cluster(["n1", "n2", "n3"])
    sim.run_until(0.5)
    dets["n3"].set_enabled(False)
    sim.run_until(2.0)
    assert dets["n1"].state_of("n3") is NodeState.DOWN
    assert dets["n2"].state_of("n3") is NodeState.DOWN
    # the disabled node still hears the others (that is how it regains quorum)
    assert dets["n3"].up_peers() == ["n1", "n2"]
    kar_after = [
        a
        for t, n, a in log
        if n == "n3" and t > 0.6 and isinstance(a, Send) and a.payload.get("t") == "kar"
    ]
    assert kar_after == []
    dets["n3"].set_enabled(True)
    sim.run_until(3.0)
    assert dets["n1"].state_of("n3") is NodeState.UP


def test_nodes_that_all_start_disabled_still_find_each_other():
    sim = Simulation(3)
    dets: dict[str, FailureDetector] = {}
    names = ["n1", "n2", "n3"]
    for name in names:
        make = detector_factory(ident(name), [n for n in names if n != name], dets)

        def disabled(rng, recovered, make=make):
            det = make(rng, recovered)
            det.enabled = False
            return det

        sim.add_node(name, disabled)
    sim.run_until(1.0)
    assert all(dets[n].up_peers() == [m for m in names if m != n] for n in names)


def test_duplicate_location_is_reported_on_both_sides():
    ids = {"n2": ident("n2", location=location_code("n1"))}
    sim, dets, log = cluster(["n1", "n2"], ids)
    sim.run_until(1.0)
    assert dets["n1"].state_of("n2") is NodeState.DUPLICATE_LOCATION
    assert dets["n2"].state_of("n1") is NodeState.DUPLICATE_LOCATION
    assert any("location code" in w for w in dets["n1"].warnings())
    assert "Up" not in states(log, "n1", "n2")


def test_duplicate_timestamp_is_reported():
    ids = {"n2": ident("n2", ts=ident("n1").timestamp)}
    sim, dets, _ = cluster(["n1", "n2"], ids)
    sim.run_until(1.0)
    assert dets["n1"].state_of("n2") is NodeState.DUPLICATE_TIMESTAMP
    assert dets["n2"].state_of("n1") is NodeState.DUPLICATE_TIMESTAMP


def test_unsupported_protocol_is_reported_and_overlap_is_accepted():
    ids = {"n2": ident("n2", proto=(3, 4)), "n3": ident("n3", proto=(1, 5))}
    sim, dets, _ = cluster(["n1", "n2", "n3"], ids)
    sim.run_until(1.0)
    assert dets["n1"].state_of("n2") is NodeState.UNSUPPORTED_PROTOCOL
    assert dets["n2"].state_of("n1") is NodeState.UNSUPPORTED_PROTOCOL
    assert dets["n1"].state_of("n3") is NodeState.UP
    assert dets["n1"].peers["n3"].protocol == 1


def test_a_corrected_identity_is_accepted_again():
    det = FailureDetector(identity=ident("n1"))
    det.add_peer("n2", "sim://n2")
    bad = ident("n2", location=location_code("n1"))
    det.on_message(0.0, "n2", {"t": "hello", "id": bad.to_wire(), "en": True})
    assert det.state_of("n2") is NodeState.DUPLICATE_LOCATION
    det.on_message(1.0, "n2", {"t": "hello", "id": ident("n2").to_wire(), "en": True})
    assert det.state_of("n2") is NodeState.UP


def test_malformed_input_is_dropped_not_raised():
    det = FailureDetector(identity=ident("n1"))
    det.add_peer("n2", "sim://n2")
    for payload in (None, 3, {"t": "hello"}, {"t": "hello", "id": {"name": 5}}, {"t": "zzz"}):
        det.on_message(0.0, "n2", payload)
    det.handle(Received(0.0, "n2", [1, 2]))
    assert det.state_of("n2") is NodeState.DISCOVERED


def test_static_address_wins_over_discovery():
    det = FailureDetector(identity=ident("n1"))
    det.add_peer("n2", "static:1", static=True)
    det.add_peer("n2", "dynamic:2")
    assert det.peers["n2"].address == "static:1"
    det.add_peer("n3", "dynamic:3")
    det.add_peer("n3", "static:3", static=True)
    assert det.peers["n3"].address == "static:3"
    det.add_peer("n4", None)
    assert det.state_of("n4") is NodeState.UNDISCOVERED
    det.add_peer("n4", "dynamic:4")
    assert det.state_of("n4") is NodeState.DISCOVERED


def test_notifier_registry_serializes_per_node_and_replays_up_nodes():
    registry = NotifierRegistry()
    calls: list[tuple[str, str, bool]] = []

    def first(peer: str, up: bool) -> None:
        calls.append(("first", peer, up))
        if peer == "n2" and up:
            # n2 goes down while its up notifier runs: the down call must wait.
            registry.on_notify({"peer": "n2", "old": "Up", "new": "InDownNotifier"})
            registry.run_pending()  # re-entrant: queued, not run now
            calls.append(("first-done", peer, up))

    registry.install(first)
    registry.on_notify({"peer": "n2", "old": "Discovered", "new": "InUpNotifier"})
    registry.on_notify({"peer": "n3", "old": "Discovered", "new": "InUpNotifier"})
    registry.run_pending()
    assert calls == [
        ("first", "n2", True),
        ("first-done", "n2", True),
        ("first", "n3", True),
        ("first", "n2", False),
    ]
    later: list[tuple[str, bool]] = []
    registry.install(lambda peer, up: later.append((peer, up)))
    registry.run_pending()
    assert later == [("n3", True)]  # called for the node already up, not for n2 (down)


def test_up_peers_follows_every_state_change_and_removal():
    # up_peers is cached (the cluster node asks after every event); the cache and
    # up_version must follow each change of the Up set, and only those.
    sim, dets, _ = cluster(["n1", "n2", "n3"])
    sim.run_until(0.5)
    det = dets["n1"]
    assert det.up_peers() == ["n2", "n3"]
    version = det.up_version
    sim.run_until(0.7)
    assert det.up_version == version  # keep-alives alone change nothing
    dets["n3"].set_enabled(False)
    sim.run_until(2.0)
    assert det.up_peers() == ["n2"] and det.up_version > version
    det.up_peers().append("bogus")  # callers get a copy
    assert det.up_peers() == ["n2"]
    version = det.up_version
    det.remove_peer("n2")
    assert det.up_peers() == [] and det.up_version > version
    dets["n3"].set_enabled(True)
    sim.run_until(3.0)
    assert "n3" in det.up_peers()  # (n2 may be back too: it still sends keep-alives)
    assert det.up_peers() == sorted(n for n, p in det.peers.items() if p.state is NodeState.UP)


def _up_pair() -> FailureDetector:
    det = FailureDetector(identity=ident("n1"))
    det.add_peer("n2", "sim://n2")
    det.handle(Started(0.0))
    det.on_message(0.0, "n2", {"t": "hello", "id": ident("n2").to_wire(), "en": True})
    assert det.state_of("n2") is NodeState.UP
    return det


def test_the_nodes_own_stall_is_not_its_peers_silence():
    """A blocked loop (here: no tick for 0.9 s, more than twice the timeout) wakes to a
    late tick before it reads its sockets: the peer is not reconnected nor Down."""
    det = _up_pair()
    t = 0.0
    for _ in range(5):
        t += 0.1
        det.heard(t, "n2", True)
        det.handle(_tick(t))
    t += 0.9  # the node itself ran nothing for 0.9 s
    actions = det.handle(_tick(t))
    assert not any(isinstance(a, Reconnect) for a in actions)
    assert det.state_of("n2") is NodeState.UP
    det.heard(t + 0.001, "n2", True)  # the answer that waited unread in the socket
    for _ in range(3):
        t += 0.1
        det.heard(t, "n2", True)
        assert not any(isinstance(a, Reconnect) for a in det.handle(_tick(t)))
    assert det.state_of("n2") is NodeState.UP
    assert det.own_stalls == pytest.approx(0.8)


def test_a_dead_peer_is_still_down_after_the_nodes_own_stall():
    """Crediting the stall delays the verdict on a silent peer by the stall, no more."""
    det = _up_pair()
    t = 0.0
    for _ in range(3):
        t += 0.1
        det.heard(t, "n2", True)
        det.handle(_tick(t))
    heard_last = t
    t += 1.0  # a stall, and the peer died during it: nothing waits in the socket
    det.handle(_tick(t))
    assert det.state_of("n2") is NodeState.UP
    down_at = None
    while t < heard_last + 3.0 and down_at is None:
        t += 0.1
        det.handle(_tick(t))
        if det.state_of("n2") is not NodeState.UP:
            down_at = t
    assert det.state_of("n2") is NodeState.DOWN
    assert down_at is not None
    # listening time before the verdict: the usual timeout plus one reconnect interval
    assert down_at - heard_last - 0.9 == pytest.approx(0.6, abs=0.11)


def _tick_for(det: FailureDetector, t: float, *, bare: bool, until: float = 3.0) -> float:
    """Tick ``det`` every 0.1 s from ``t`` to ``until``, each tick after a bare message of
    n2 (``bare``) or after nothing; asserts no ``Reconnect`` while n2 is heard.  The time
    reached."""
    while t < until:
        t += 0.1
        if bare:
            det.heard_bare(t, "n2")
        actions = det.handle(_tick(t))
        if bare and det.peers["n2"].enabled:
            assert not any(isinstance(a, Reconnect) for a in actions)
    return t


def test_bare_messages_keep_a_peer_up_while_its_keepalives_queue_behind_them():
    """Replication frames (no envelope, no flag) arriving while the peer's keep-alives wait
    behind them on the connection: the peer is alive, not reconnected, not Down."""
    det = _up_pair()
    _tick_for(det, 0.0, bare=True)
    assert det.state_of("n2") is NodeState.UP


def test_without_bare_messages_the_same_silence_is_a_down_verdict():
    """The control of the test above: nothing heard at all, the peer goes Down."""
    det = _up_pair()
    _tick_for(det, 0.0, bare=False)
    assert det.state_of("n2") is NodeState.DOWN


def test_bare_messages_of_a_peer_that_said_it_is_disabled_are_not_liveness():
    """A node that lost quorum still sends replication acks and data-plane answers; they
    carry no flag, so its last envelope's ``en`` decides: Disabled, it is seen Down (D16)."""
    det = _up_pair()
    det.heard(0.05, "n2", False)  # its keep-alive after it lost quorum
    t = _tick_for(det, 0.05, bare=True)
    assert det.state_of("n2") is NodeState.DOWN
    det.heard(t, "n2", True)  # quorum regained: its envelopes say so, bare ones count again
    assert det.peers["n2"].enabled


def test_a_disabled_node_counts_the_bare_messages_of_a_disabled_peer():
    """As for envelopes: nodes without quorum must still see each other to regain it."""
    det = _up_pair()
    det.set_enabled(False)
    det.heard(0.05, "n2", False)
    _tick_for(det, 0.05, bare=True)
    assert det.state_of("n2") is NodeState.UP


def test_bare_messages_of_an_unknown_sender_are_ignored():
    det = _up_pair()
    assert det.heard_bare(0.1, "stranger") == []
    assert "stranger" not in det.peers


def test_the_cluster_node_takes_the_runtime_s_note_as_liveness_only():
    """``{"k": "alive"}`` from the runtime (a bare message of the peer was read) keeps a
    peer Up on a ``ClusterNode`` whose keep-alives from it never come; nothing else."""
    from nonstop.cluster.node import ClusterConfig, ClusterNode
    from nonstop.runtime.interface import ALIVE

    config = ClusterConfig("n1", "sim://n1", 1, members=("n1", "n2"))
    node = ClusterNode(config, random.Random(1), {})
    assert node.hears_bare_messages
    node.handle(Started(0.0))
    hello = {"t": "hello", "id": ident("n2").to_wire(), "en": True, "ack": True, "peers": {}}
    node.handle(Received(0.0, "n2", {"k": "fd", "en": True, "b": hello}))
    assert node.detector.state_of("n2") is NodeState.UP
    t = 0.0
    while t < 3.0:
        t += 0.1
        assert node.handle(Received(t, "n2", {"k": ALIVE})) == []
        node.handle(TimerFired(t, "fd:tick"))
    assert node.detector.state_of("n2") is NodeState.UP
    while t < 6.0:  # the notes stop: silence, then Down
        t += 0.1
        node.handle(TimerFired(t, "fd:tick"))
    assert node.detector.state_of("n2") is NodeState.DOWN
