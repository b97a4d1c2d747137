"""The partition table on real node processes (issue 10; ha.md sections 2, 6-8, 11a).

Table level only: which node is active and *acting* for each partition, on
every node, across a SIGKILL, a restart and a SIGSTOP longer than the lease.
The data path does not route by partition yet, so no object moves here.

Node processes on one host share ``CLOCK_MONOTONIC`` (the event loop's clock),
so each node's answer "I act for P from ``now`` until ``acting_until``" can be
compared across nodes on one time line (``test_pause_longer_than_lease``).
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nonstop.admin.local import LocalError, spawn_node
from nonstop.client import Client
from nonstop.errors import Error
from tests.cluster.conftest import (
    DETECT_WITHIN,
    REAL_CLUSTER,
    Procs,
    free_port,
    wait_until,
)
from tests.cluster.conftest import run_cli_here as run_cli

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(not REAL_CLUSTER, reason="the partition table is the real cluster node's"),
]

PARTITIONS = 16
LEASE = 0.6
TAKEOVER_WITHIN = DETECT_WITHIN + 3.0
"""Down seen (detector) + a committed view + the failover entry + the old lease waited out
(0.63 s), with slack for a loaded 2-core machine."""


def table(p: Procs, name: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = p.status(name)["partitions"]
    return parts


def settled(p: Procs, names: str) -> dict[str, dict[str, Any]] | None:
    """The table, when every node in ``names`` has the same one with every partition Active
    on its whole list of live nodes, active per priority, and every node acting for exactly
    the partitions the table makes it active for."""
    statuses = {n: p.status(n) for n in names}
    tables = [s["partitions"] for s in statuses.values()]
    if any(t != tables[0] for t in tables) or len(tables[0]) != PARTITIONS:
        return None
    parts = {part["name"]: part for part in tables[0]}
    for part in parts.values():
        listed = [n for n, _ in part["nodes"] if n in names]
        if part["state"] != "Active" or [n for n, _ in part["current"]] != listed:
            return None
        if part["active"] != listed[0]:
            return None
    for n, s in statuses.items():
        mine = sorted(name for name, part in parts.items() if part["active"] == n)
        if sorted(s["acting"]) != mine:
            return None
    return parts


def preferred(part: dict[str, Any], live: str) -> str:
    """The first node of the defined list that is live: the active node per priority."""
    return next(n for n, _ in part["nodes"] if n in live)


def test_three_nodes_spread_every_partition_active(procs: Callable[..., Procs]) -> None:
    p = procs(3)  # no [ha] configuration: the default policy
    p.start_all()
    parts = wait_until(lambda: settled(p, "ABC"), 30, "16 partitions Active, acting, everywhere")
    per_node = Counter(part["active"] for part in parts.values())
    assert sum(per_node.values()) == PARTITIONS
    assert set(per_node) == {"A", "B", "C"}
    assert max(per_node.values()) <= math.ceil(PARTITIONS / 3) + 1, per_node
    for part in parts.values():
        assert part["policy"] == "default"
        assert len(part["current"]) == 2 and all(s == "sync" for _, s in part["current"])
        assert part["active"] == part["nodes"][0][0]  # per priority once everyone enabled
        assert isinstance(part["location"], int) and 0 <= part["location"] < 2**64
    assert len({part["location"] for part in parts.values()}) == PARTITIONS


def test_kill_fails_over_then_restart_hands_back(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    before = wait_until(lambda: settled(p, "ABC"), 30, "the table settled on A, B, C")
    victim = "B"
    lost = sorted(name for name, part in before.items() if part["active"] == victim)
    assert lost

    p.kill(victim)
    killed = time.monotonic()

    def taken_over() -> bool:
        acting = {n: set(p.status(n)["acting"]) for n in "AC"}
        return all(any(name in acting[n] for n in "AC") for name in lost)

    wait_until(taken_over, TAKEOVER_WITHIN, f"A or C acting for every partition {victim} had")
    took = time.monotonic() - killed
    assert took < TAKEOVER_WITHIN
    # The survivors agree on the table: same new active and epoch, the dead node dropped.
    after = wait_until(
        lambda: (t := table(p, "A")) == table(p, "C") and t, 5, "A and C to agree on the table"
    )
    for part in after:
        if part["name"] in lost:
            assert part["active"] in ("A", "C")
            assert part["epoch"] > before[part["name"]]["epoch"]
            assert victim not in [n for n, _ in part["current"]]
            assert part["state"] == "Active"

    # Restart: the node re-enables its partitions, is restored (instantly at table level),
    # and becomes active again where it comes first in the list (handover by priority).
    p.start(victim)
    back = wait_until(lambda: settled(p, "ABC"), 30, f"{victim} restored and the table settled")
    for part in back.values():
        assert part["active"] == preferred(part, "ABC"), part
        assert [n for n, _ in part["current"]] == [n for n, _ in part["nodes"]]
    assert sorted(n for n, part in back.items() if part["active"] == victim) == lost


def until(value: object) -> float:
    """A status's ``acting_until`` (None: no lease held yet)."""
    return float("-inf") if value is None else float(value)  # type: ignore[arg-type]


class Sampler(threading.Thread):
    """Asks every node, round after round, what it acts for and until when (its clock)."""

    def __init__(self, p: Procs, names: str) -> None:
        super().__init__(daemon=True)
        self.p = p
        self.names = names
        self.samples: list[tuple[str, float, float, frozenset[str]]] = []
        self.released: set[tuple[str, str, float]] = set()
        """(node, partition, when) of every handover a node said it made (released_at)."""
        self.stop = threading.Event()

    def acted_for(self, names: str) -> set[str]:
        """Every partition one of ``names`` said it acted for, so far."""
        return {p for n, _, _, acting in list(self.samples) if n in names for p in acting}

    def run(self) -> None:
        clients = {}
        while not self.stop.is_set():
            for n in self.names:
                try:
                    if n not in clients:
                        clients[n] = Client([self.p.address(n)], timeout=0.3, rounds=1)
                    s = clients[n].status()
                except (Error, OSError):
                    client = clients.pop(n, None)
                    if client is not None:
                        client.close()
                    continue
                self.samples.append(
                    (n, float(s["now"]), until(s["acting_until"]), frozenset(s["acting"]))
                )
                for name, at in (s.get("released_at") or {}).items():
                    self.released.add((n, name, float(at)))
            time.sleep(0.02)
        for client in clients.values():
            client.close()


def overlaps(
    samples: list[tuple[str, float, float, frozenset[str]]],
    released: set[tuple[str, str, float]] | frozenset[tuple[str, str, float]] = frozenset(),
) -> list[Any]:
    """Pairs of answers of two nodes claiming one partition at one instant (ha.md section 8):
    a node that says it acts at ``now`` may act until ``acting_until`` -- or until it handed
    the partition over and said so (``released_at``, same host: one monotonic clock); no
    other node may say it acts for the same partition inside that interval."""
    bad = []
    for node, now, until, acting in samples:
        for other, t, _, theirs in samples:
            for name in sorted(acting & theirs) if other != node else ():
                ends = [at for n, p, at in released if n == node and p == name and at >= now]
                if now <= t < min([until, *ends]):
                    bad.append((node, now, until, other, t, name))
    return bad


def test_pause_longer_than_lease(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    before = wait_until(lambda: settled(p, "ABC"), 30, "the table settled on A, B, C")
    victim = "C"
    lost = {name for name, part in before.items() if part["active"] == victim}
    assert lost
    sampler = Sampler(p, "ABC")
    sampler.start()
    try:
        time.sleep(0.5)
        p.signal(victim, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:

            def survivors_took_over() -> bool:
                acting = {n: set(p.status(n)["acting"]) for n in "AB"}
                return all(any(name in acting[n] for n in "AB") for name in lost)

            wait_until(survivors_took_over, TAKEOVER_WITHIN, "A or B acting for C's partitions")
            # C's last lease renewal was applied up to one renewal period (LEASE / 3) before
            # the SIGSTOP, and the survivors wait the lease out from there: a takeover
            # earlier than that would have ignored C's lease.
            assert time.monotonic() - paused_at > LEASE - LEASE / 3
            wait_until(
                lambda: lost <= sampler.acted_for("AB"), 5, "the sampler to see the takeover"
            )
        finally:
            p.signal(victim, signal.SIGCONT)
        resumed = len(sampler.samples)
        wait_until(lambda: settled(p, "ABC"), 30, "C back, restored and the table settled")
        time.sleep(0.3)
    finally:
        sampler.stop.set()
        sampler.join(5)
    samples = sampler.samples
    assert not overlaps(samples, sampler.released), overlaps(samples, sampler.released)[:5]
    # The paused node's first answers after it resumed claim none of the partitions it lost
    # while the others acted for them (its lease ran out while it was stopped).
    first_after = [s for s in samples[resumed:] if s[0] == victim][:3]
    assert first_after, "no answer from the resumed node"
    taken = {name for n, _, _, acting in samples[:resumed] if n != victim for name in acting & lost}
    assert taken == lost
    for _, now, until, acting in first_after:
        assert not acting & taken or now >= until, (now, until, sorted(acting))
    # Each node answered throughout (the sampler saw all three before and after the pause).
    assert {s[0] for s in samples} == set("ABC")


def test_bad_ha_config_is_one_line_and_the_node_does_not_start(tmp_path: Path) -> None:
    """A mapper that does not resolve is found when the node starts (its application
    modules loaded): the node exits with one line naming the binding; nothing runs."""
    data = tmp_path / "n1"
    config = tmp_path / "n1.toml"
    config.write_text(
        f'name = "n1"\ndata = "{data}"\nlisten = "127.0.0.1:{free_port()}"\nmembers = ["n1"]\n'
        f'log_file = "{data / "node.log"}"\n'
        '[ha.bindings.Account]\nmapper = "no_such_module_xyz:Mapper"\n'
    )
    with pytest.raises(LocalError) as info:
        spawn_node(config, data, timeout=20)
    message = str(info.value)
    assert "binding of Account" in message and "no_such_module_xyz:Mapper" in message, message
    assert "\n" not in message
    assert not (data / "node.pid").exists()


def test_partition_commands(procs: Callable[..., Procs]) -> None:
    p = procs(3)
    p.start_all()
    wait_until(lambda: settled(p, "ABC"), 30, "the table settled on A, B, C")
    p.wait_served()  # each active node took its replicated copy: it counts the objects
    node = p.address("A")

    code, out, err = run_cli("partition", "list", "--json", "--node", node)
    assert code == 0, err
    rows = json.loads(out)["partitions"]
    assert [r["name"] for r in rows][:3] == ["default.0", "default.1", "default.2"]
    for r in rows:
        # Routing by partition (the default) and nothing created yet: each counts 0.
        assert r["acting_on"] == [r["active"]] and r["objects"] == 0
        assert set(r["status"]) == {"A", "B", "C"}
        listed = {n for n, _ in r["nodes"]}
        assert {n: s for n, s in r["status"].items() if n in listed} == dict.fromkeys(
            listed, "LocalEnabled"
        )
        assert {s for n, s in r["status"].items() if n not in listed} == {"RemoteEnabled"}
    code, out, err = run_cli("cluster", "status", "--json", "--node", node)
    assert code == 0 and len(json.loads(out)["partitions"]) == PARTITIONS, err

    # A list naming a node that is not a member: one line naming it, exit code 2.
    code, out, err = run_cli("partition", "define", "px", "--nodes", "A,Z", "--node", node)
    assert code == 2 and "node 'Z'" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli("partition", "define", "px", "--nodes", "C,B:async", "--node", node)
    assert code == 0, err
    code, out, err = run_cli("partition", "enable", "px", "--node", node)
    assert code == 0 and "enabled px on C" in out and "enabled px on B" in out, (out, err)
    px = wait_until(
        lambda: next(
            (r for r in table(p, "B") if r["name"] == "px" and r["state"] == "Active"), None
        ),
        10,
        "px Active",
    )
    assert px["active"] == "C" and px["current"] == [["C", "sync"], ["B", "async"]]
    # B is async: disabling C would leave no in-sync sync copy, so the table refuses it.
    code, out, err = run_cli("partition", "disable", "px", "--on", "C", "--node", node)
    assert code == 2 and "last in-sync copy" in err, (out, err)
