"""Routing by partition on real node processes (``ha.data = "partitions"``, replicas = 0).

Three nodes with the switch on: accounts are created into partitions (the hash of
their number), transfers run across nodes, ``nonstop partition list`` counts the
objects of each partition on its active node.  A SIGKILLed node's partitions
answer ``Unavailable`` (never NotFound: ``get_or_create`` creates no second
account) while the other partitions keep working; after its restart everything
is back and the total is conserved.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop.errors import NotActive, Unavailable
from tests.cluster.conftest import REAL_CLUSTER, Procs, app_cluster, run_cli, wait_until
from tests.distmodel import Account

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not REAL_CLUSTER, reason="the partition table is the real cluster node's"),
]

OPTIONS = {
    "app": ["tests.distmodel"],
    "ha": {"data": "partitions", "policies": {"default": {"replicas": 0}}},
}
ACCOUNTS = 24


@nonstop.transactional
def transfer(tx: nonstop.Transaction, src: str, dst: str, amount: int) -> None:
    locked = {n: tx.get(Account, number=n, lock="write") for n in sorted((src, dst))}
    locked[src].balance -= amount
    locked[dst].balance += amount


def table(p: Procs, name: str) -> dict[str, dict[str, Any]]:
    return {part["name"]: part for part in p.status(name)["partitions"]}


def all_acting(p: Procs, names: str) -> dict[str, dict[str, Any]] | None:
    parts = table(p, names[0])
    if len(parts) != 16:  # every node defined its partitions
        return None
    acting = {n: set(p.status(n)["acting"]) for n in names}
    for name, part in parts.items():
        if (part["active"] or "-") not in names or name not in acting[part["active"]]:
            return None
    return parts


def partition_list(p: Procs) -> list[dict[str, Any]]:
    code, out, err = run_cli("partition", "list", "--json", "--node", p.address("A"))
    assert code == 0, err
    rows: list[dict[str, Any]] = json.loads(out)["partitions"]
    return rows


def total(db: Any) -> int:
    with db.transaction() as tx:
        return sum(a.balance for a in tx.query(Account))


def test_bank_over_partitions_survives_a_kill_without_not_found(tmp_path: Path) -> None:
    with app_cluster(tmp_path, 3, OPTIONS) as p:
        wait_until(lambda: all_acting(p, "ABC"), 30, "every partition acted for")
        # On A (balance="first"), not on B, the node killed: the subject is B's
        # partitions, not the client's own fail-over.
        db = nonstop.connect(",".join(p.address(n) for n in "ABC"), balance="first")
        try:
            numbers = [f"N-{i}" for i in range(ACCOUNTS)]
            with db.transaction() as tx:
                for n in numbers:
                    tx.get_or_create(Account, number=n, defaults={"balance": 100})
            rng = random.Random(7)
            for _ in range(60):
                a, b = rng.sample(numbers, 2)
                transfer(db, a, b, rng.randrange(1, 10))
            assert total(db) == 100 * ACCOUNTS
            # Object counts per partition, each read on its active node.
            rows = partition_list(p)
            assert all(isinstance(r["objects"], int) for r in rows), rows
            assert sum(r["objects"] for r in rows) == ACCOUNTS

            # Where each account lives: the partition its reference names.
            parts = table(p, "A")
            by_location = {part["location"]: part for part in parts.values()}
            home: dict[str, str] = {}
            with db.transaction() as tx:
                for n in numbers:
                    ref = tx.ref(tx.get(Account, number=n))
                    home[n] = by_location[int.from_bytes(ref.raw[:8], "big")]["active"]
            assert set(home.values()) == {"A", "B", "C"}

            p.kill("B")
            wait_until(lambda: all_acting_without(p, "B"), 30, "survivors see B's partitions")
            # ... and A, the client's node, sees B down itself: until its own detector says
            # so, a partition whose only holder is B is a takeover that may still come
            # (retryable NotActive "taking over: B"), not Unavailable -- the leader's
            # detector may mark B down before A's (a clean-clone run, session 13).
            wait_until(lambda: p.states("A").get("B") != "Up", 30, "A sees B down")
            wait_until(lambda: _unavailable(db, lost_first(home)), 10, "B's partitions Unavailable")
            lost = [n for n in numbers if home[n] == "B"]
            kept = [n for n in numbers if home[n] != "B"]
            for n in lost[:4]:
                with pytest.raises(Unavailable, match="partition"), db.transaction() as tx:
                    tx.get(Account, number=n)
                with pytest.raises(Unavailable), db.transaction() as tx:
                    tx.get_or_create(Account, number=n, defaults={"balance": 5})
            for _ in range(20):
                a, b = rng.sample(kept, 2)
                transfer(db, a, b, 1)

            p.start("B")
            wait_until(lambda: all_acting(p, "ABC"), 60, "B back and acting")
            wait_until(lambda: _readable(db, numbers), 30, "every account readable again")
            assert total(db) == 100 * ACCOUNTS
            rows = partition_list(p)
            assert sum(r["objects"] for r in rows) == ACCOUNTS  # no duplicate created
        finally:
            db.close()


def all_acting_without(p: Procs, dead: str) -> bool:
    """The survivors agree that the dead node's partitions have no live active node."""
    live = "ABC".replace(dead, "")
    parts = table(p, live[0])
    return all(part["active"] != dead or part["state"] == "Unavailable" for part in parts.values())


def lost_first(home: dict[str, str]) -> str:
    """The first account whose partition B (the node killed) was active for."""
    return next(n for n, node in sorted(home.items()) if node == "B")


def _unavailable(db: Any, number: str) -> bool:
    """Is ``number``'s partition Unavailable from the client's node (not a takeover that
    may still come: ``NotActive``, retryable, while that node's view of B catches up)?"""
    try:
        with db.transaction() as tx:
            tx.get(Account, number=number)
    except Unavailable:
        return True
    except NotActive:
        return False
    raise AssertionError(f"{number} was read on a partition whose only copy is down")


def _readable(db: Any, numbers: list[str]) -> bool:
    try:
        with db.transaction() as tx:
            return all(tx.get(Account, number=n) is not None for n in numbers)
    except Unavailable:
        return False
