"""No commit gap under contention: cross-node deadlocks end in milliseconds (issue 14).

The README's ``transfer`` locks ``src`` then ``dst`` (not sorted), so clients
choosing accounts on different nodes form wait-for cycles across nodes.  Such a
cycle used to end only at ``lock_wait`` (5 s): with three client threads the
whole load stopped for 5.0 s two or three times in 30 s.  Now the nodes share
their wait-for edges and abort one victim (``Deadlock``, replayed by
``@transactional``), so no interval without a commit exceeds ``MAX_GAP``.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from pathlib import Path
from typing import Any

import nonstop
from nonstop.admin.owned import OwnedCluster
from nonstop.client import Client
from nonstop.demos.bank import Account
from nonstop.errors import Error

NODES = ["A", "B", "C"]
PER_NODE = 2  # few accounts: cycles are frequent
CLIENTS = 4
RUN_S = 10.0
MAX_GAP = 0.5
"""Longest interval without a commit.  A deadlock ended at ``lock_wait`` stops the load
for 5 s, one ended by detection for about a commit: under routing by partition (the
default) a commit waits for its sync replica's durable copy too, and on the shared
2-core machine a lone client's commits were up to 0.19 s apart (with four clients and
their deadlocks, up to 0.25 s; 0.12 s under routing by node, the bound was 0.2 s)."""


@nonstop.transactional
def readme_transfer(tx: Any, src: int, dst: int, amount: int) -> None:
    """As in the README: ``src`` first, then ``dst`` (any order across clients)."""
    a = tx.get(Account, number=src, lock="write")
    b = tx.get(Account, number=dst, lock="write")
    a.balance -= amount
    b.balance += amount


def _victims(address: str) -> int:
    with Client([address], timeout=5, rounds=1) as c:
        stats = c.request({"op": "runtime_stats"})
    return int(stats.get("data", {}).get("deadlock_victims", 0))


def _wait_settled(addresses: list[str], within: float = 30.0) -> None:
    """Until no partition is being copied and each is acted for by its active node.

    At start the first node to enable takes every partition; as the others are restored
    the partitions move to them by priority, each new active node waiting out the old
    one's lease (ha.md section 8). The measured window starts after that: a handover
    is a start-up transient, not a stall of the commit path this test is about.
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        acting: set[str] = set()
        parts: list[dict[str, Any]] = []
        try:
            for address in addresses:
                with Client([address], timeout=2, rounds=1) as c:
                    status = c.status()
                acting |= set(status.get("acting", []))
                parts = status.get("partitions", [])
        except Error:
            time.sleep(0.1)
            continue
        if all(p["name"] in acting and not p["copying"] for p in parts):
            return  # (no partitions at all: routing by node, nothing to settle)
        time.sleep(0.1)
    raise AssertionError(f"partitions not settled within {within} s")


def run_contention(
    folder: Path,
    options: dict[str, Any],
    seconds: float,
    clients: int = CLIENTS,
    per_node: int = PER_NODE,
) -> dict[str, Any]:
    """Transfers from ``clients`` threads for ``seconds``; commit times, errors, victims."""
    numbers = [100 * i + k for i in range(len(NODES)) for k in range(per_node)]
    with OwnedCluster(folder, len(NODES), apps=["nonstop.demos.bank"], options=options) as oc:
        oc.start_all()
        addresses = oc.addresses
        with nonstop.connect(addresses) as client:
            for i, node in enumerate(NODES):
                with client.transaction() as tx:
                    for k in range(per_node):
                        tx.create(Account, node=node, number=100 * i + k, balance=1000)
        _wait_settled(addresses)
        commits: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def client_thread(i: int) -> None:
            rng = random.Random(i)
            # The rotation is this test's own spread of coordinators: pin it (H5's
            # default would pick each handle's primary itself).
            order = addresses[i % 3 :] + addresses[: i % 3]
            with nonstop.connect(order, balance="first") as c:
                while time.monotonic() < deadline:
                    src, dst = rng.sample(numbers, 2)
                    try:
                        readme_transfer(c, src, dst, 1)
                    except Error as exc:
                        with lock:
                            errors.append(f"{type(exc).__name__}: {exc}")
                    else:
                        with lock:
                            commits.append(time.monotonic())

        threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(clients)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=seconds + 30)
        hung = any(t.is_alive() for t in threads)
        victims = sum(_victims(addresses[i]) for i in range(len(NODES)))
    times = [started, *sorted(commits), deadline]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return {
        "commits": len(commits),
        "errors": errors,
        "hung": hung,
        "max_gap": max(gaps),
        "gaps_over": sum(1 for g in gaps if g > MAX_GAP),
        "victims": victims,
    }


def test_readme_transfers_on_three_nodes_never_stall(tmp_path: Path) -> None:
    result = run_contention(tmp_path / "cluster", {}, RUN_S)
    assert not result["hung"], "a client hung"
    assert result["commits"] > 100, result
    assert not result["errors"], result["errors"][:5]
    assert result["max_gap"] <= MAX_GAP, (
        f"no transfer committed for {result['max_gap']:.3f} s "
        f"({result['gaps_over']} gaps over {MAX_GAP} s; {result['victims']} victims)"
    )
