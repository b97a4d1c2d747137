"""A replicating real cluster with bank accounts: the setup the replication tests share.

``replicated_bank(tmp_path, numbers)`` starts three nodes on loopback with
``ha.data = "partitions"`` and the default policy (16 dynamic partitions, one
sync replica each), waits until every partition is served by an acting node
with an in-sync replica, creates the accounts ``numbers`` with ``START`` each,
and yields the processes and a connected client (closed at the end).  The
helpers the tests then use to look at the cluster (the partition table, which
node serves what, reads that ride out a takeover) are here too, so no test
module imports another.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nonstop
from nonstop import errors
from nonstop.ha.partition_table import partition_location
from tests.cluster.conftest import Procs, app_cluster, wait_until
from tests.distmodel import Account

OPTIONS = {"app": ["tests.distmodel"], "ha": {"data": "partitions"}}
PARTITIONS = 16
START = 100


@dataclass
class Bank:
    p: Procs
    db: Any
    """A client of every node (``connect``)."""
    numbers: list[str]
    """The accounts created, ``START`` each."""


@contextmanager
def replicated_bank(tmp_path: Path, numbers: list[str]) -> Iterator[Bank]:
    """Three replicating nodes serving every partition with a replica, and the accounts
    ``numbers`` (module doc)."""
    with app_cluster(tmp_path, 3, OPTIONS) as p:
        wait_until(lambda: served(p, "ABC"), 60, "every partition served with a replica")
        db = connect(p)
        try:
            create_accounts(db, numbers)
            yield Bank(p, db, numbers)
        finally:
            db.close()


def table(p: Procs, name: str) -> dict[str, dict[str, Any]]:
    return {part["name"]: part for part in p.status(name)["partitions"]}


def served(p: Procs, names: str, replicas: bool = True) -> dict[str, dict[str, Any]] | None:
    """The table once every partition's active node is one of ``names``, acts for it and
    its store took the replicated copy -- and, with ``replicas``, every partition has an
    in-sync replica (after a kill the partitions of two-node lists have none left)."""
    parts = table(p, names[0])
    if len(parts) != PARTITIONS:
        return None
    statuses = {n: p.status(n) for n in names}
    for name, part in parts.items():
        active = part["active"]
        if active not in statuses:
            return None
        status = statuses[active]
        if name not in status["acting"] or name not in status["replication"]["ready"]:
            return None
        if replicas and not any(r["in_sync"] for r in part["replicas"]):
            return None
    return parts


def restored(p: Procs, node: str, names: str) -> bool:
    """``node`` holds an in-sync copy of every partition it is listed for."""
    parts = served(p, names)
    if parts is None:
        return False
    listed = [part for part in parts.values() if node in [n for n, _ in part["nodes"]]]
    return bool(listed) and all(
        node in [n for n, _ in part["current"]] and node not in part["copying"] for part in listed
    )


def connect(p: Procs, names: str = "ABC") -> Any:
    """A client whose transactions ``names[0]`` coordinates while it is up, then the next
    (``balance="first"``: callers choose the coordinator, e.g. "BAC" to kill B's)."""
    return nonstop.connect(",".join(p.address(n) for n in names), balance="first")


def balances(db: Any, numbers: list[str]) -> dict[str, int]:
    """Every account's balance, each looked up by its key (NotFound would raise)."""
    with db.transaction() as tx:
        return {n: tx.get(Account, number=n).balance for n in numbers}


def read_all(db: Any, numbers: list[str], timeout: float) -> dict[str, int]:
    """``balances`` once it answers (retryable errors while a takeover settles); NotFound
    is never retried: it fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return balances(db, numbers)
        except errors.NotFound:
            raise
        except (errors.Retryable, errors.Unavailable, errors.ClusterError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def create_accounts(db: Any, numbers: list[str]) -> None:
    for i in range(0, len(numbers), 8):
        chunk = numbers[i : i + 8]

        @nonstop.transactional
        def make(tx: nonstop.Transaction, chunk: list[str] = chunk) -> None:
            for n in chunk:
                tx.get_or_create(Account, number=n, defaults={"balance": START})

        make(db)


def partitions_of(p: Procs, node: str) -> set[str]:
    return {name for name, part in table(p, node).items() if part["active"] == node}


def accounts_on(bank: Bank, node: str) -> list[str]:
    """The accounts of ``bank`` in the partitions ``node`` acts for now."""
    locations = {partition_location(n) for n in partitions_of(bank.p, node)}
    with bank.db.transaction() as tx:
        return [n for n in bank.numbers if tx.ref(tx.get(Account, number=n)).location in locations]


def retryable(kind: str) -> bool:
    """Is the error class named ``kind`` one ``@nonstop.transactional`` replays?"""
    cls = getattr(errors, kind, None)
    return isinstance(cls, type) and issubclass(cls, errors.Retryable)


__all__ = [
    "OPTIONS",
    "PARTITIONS",
    "START",
    "Bank",
    "accounts_on",
    "balances",
    "connect",
    "create_accounts",
    "partitions_of",
    "read_all",
    "replicated_bank",
    "restored",
    "retryable",
    "served",
    "table",
]
