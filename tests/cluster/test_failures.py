"""Crashes and pauses of real node processes (C3, C6, D16), each bounded in time."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import pytest

from nonstop.client import Client, connect
from nonstop.errors import Unavailable
from tests.cluster.conftest import (
    DETECT_WITHIN,
    REAL_CLUSTER,
    Procs,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

VIEW_WITHIN = 3.0
"""A committed view without a killed follower, after it is seen Down (goal ~1 s; slack for
a loaded 2-core machine)."""


def seen_down(p: Procs, observer: str, victim: str) -> bool:
    return p.states(observer).get(victim) == "Down"


def test_kill_one_then_two_then_restart(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    p.wait_quorum(["A", "B", "C"], "Active", timeout=20)

    # SIGKILL C: both survivors see it Down within the timeout, quorum Partial.
    p.kill("C")
    killed = time.monotonic()
    wait_until(
        lambda: seen_down(p, "A", "C") and seen_down(p, "B", "C"),
        DETECT_WITHIN,
        "A and B to see C Down",
    )
    detected = time.monotonic() - killed
    assert detected < DETECT_WITHIN
    p.wait_quorum(["A", "B"], "Partial", timeout=5)
    if REAL_CLUSTER:
        # ... and the leader commits a new view without C, applied on both survivors.
        wait_until(
            lambda: all(
                "C" not in (s := p.status(n))["live"] and s["members"] == ["A", "B", "C"]
                for n in "AB"
            ),
            VIEW_WITHIN,
            "a committed view without C on A and B",
        )
        assert time.monotonic() - killed < DETECT_WITHIN + VIEW_WITHIN

    # SIGKILL B: the survivor has no quorum any more and goes Disabled.
    p.kill("B")
    p.wait_quorum(["A"], "Disabled", timeout=DETECT_WITHIN + 2)

    # Restart both on their old data: the cluster is Active again everywhere.
    p.start("B")
    p.start("C")
    p.wait_quorum(["A", "B", "C"], "Active", timeout=20)
    for name in "ABC":
        states = p.states(name)
        assert all(s in ("Up", "Self") for s in states.values()), (name, states)

    # Every node went through the same sequence of views (same id → same members).
    views: dict[int, list[str]] = {}
    for name in "ABC":
        for rec in p.notifications(name, "view"):
            members = sorted(rec.get("members") or [])
            view_id = int(rec.get("view", rec.get("view_id", -1)))
            assert views.setdefault(view_id, members) == members, rec
    if REAL_CLUSTER:
        # Once every node is back in a committed view with everyone live, every node reports
        # the same (numbered, consecutive) view history, the one with C not live included.
        wait_until(
            lambda: (
                all(p.status(n)["live"] == ["A", "B", "C"] for n in "ABC")
                and len({str(p.status(n)["views"]) for n in "ABC"}) == 1
            ),
            VIEW_WITHIN + 10,
            "the same view sequence, ending with every node live, everywhere",
        )
        history = p.status("A")["views"]
        ids = [v["id"] for v in history]
        assert ids == list(range(ids[0], ids[0] + len(ids))), history
        assert any("C" not in v["live"] for v in history), history


def test_sigstop_is_seen_down_then_heals(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    p.wait_quorum(["A", "B", "C"], "Active", timeout=20)

    p.signal("C", signal.SIGSTOP)
    try:
        wait_until(
            lambda: seen_down(p, "A", "C") and seen_down(p, "B", "C"),
            DETECT_WITHIN,
            "A and B to see the paused C Down",
        )
        p.wait_quorum(["A", "B"], "Partial", timeout=5)
    finally:
        p.signal("C", signal.SIGCONT)
    p.wait_quorum(["A", "B", "C"], "Active", timeout=15)
    assert p.states("A")["C"] == "Up"


def test_new_node_joins_through_any_address(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    p.wait_quorum(["A", "B", "C"], "Active", timeout=20)
    _, address = p.start_extra("D", join=[p.address("B")])
    wait_until(
        lambda: "D" in p.status("A").get("members", []) and p.states("A").get("D") == "Up",
        20,
        "D to be a member, Up on A",
    )
    with Client([address], timeout=1.0, rounds=1) as c:
        wait_until(lambda: c.status()["quorum"] == "Active", 10, "D to see quorum Active")


def test_protocol_versions_between_real_nodes(procs: Callable[..., Procs]) -> None:
    """E4: a node speaking 1..2 joins a 1..1 cluster; a node speaking only 2..3 is refused."""
    p = procs(3)
    p.start_all()
    p.wait_quorum(["A", "B", "C"], "Active", timeout=20)
    p.start_extra("N", join=[p.address("A")], protocol=(1, 2))
    wait_until(lambda: p.states("A").get("N") == "Up", 20, "N (1..2) Up on A")
    p.start_extra("X", join=[p.address("A")], protocol=(2, 3))
    wait_until(
        lambda: p.states("A").get("X") == "UnsupportedProtocol",
        10,
        "X (2..3) UnsupportedProtocol on A",
    )
    status = p.status("A")
    assert "X" not in status.get("members", [])
    assert status["quorum"] == "Active"
    assert any("X" in w for w in status["warnings"])


def test_client_fails_over_when_its_node_dies(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    p.wait_quorum(["A", "B", "C"], "Active", timeout=20)
    addresses = ",".join(p.address(n) for n in "ABC")
    # balance="first": the client is attached to A, the node killed first (H5 pinned).
    with connect(addresses, timeout=1.0, balance="first") as client:
        assert client.status()["name"] == "A"
        p.kill("A")
        status = client.status()  # same handle: answered by the next node
        assert status["name"] == "B"
        p.kill("B")
        p.kill("C")
        with pytest.raises(Unavailable):
            client.status()
