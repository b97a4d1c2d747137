"""Sync replication of partitions on real node processes (replication.md §10c, §10d).

Three nodes on loopback with ``ha.data = "partitions"`` and the default policy (16
dynamic partitions, one sync replica each), which replicates (no other setting);
the cluster and its accounts come from ``tests/cluster/replicated_bank.py``, shared
with the handover and request tests:

* objects written on the cluster survive a SIGKILL of the node acting for their
  partitions: after the takeover a survivor serves every one of them, none is
  NotFound, every acknowledged write is there;
* the killed node, restarted, is restored (a copy from the active node) and is
  a replica again: a second kill, of another node, loses nothing either;
* transfers from clients continue through a SIGKILL with only retryable errors
  during the takeover (``Unavailable`` only for attempts begun before it settled),
  through the node's restart and restore, and the total is conserved; the takeover
  time (SIGKILL to the first commit on a partition that moved) is printed.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop import errors
from tests.cluster.conftest import REAL_CLUSTER, Procs, wait_until
from tests.cluster.replicated_bank import (
    OPTIONS,
    START,
    accounts_on,
    connect,
    partitions_of,
    read_all,
    replicated_bank,
    restored,
    retryable,
    served,
)
from tests.distmodel import Account

pytestmark = [
    pytest.mark.skipif(not REAL_CLUSTER, reason="replication is the real cluster node's"),
]

ACCOUNTS = 48


@pytest.mark.timeout(300)
def test_objects_survive_a_kill_and_the_restarted_node_is_a_replica_again(
    tmp_path: Path,
) -> None:
    numbers = [f"R-{i}" for i in range(ACCOUNTS)]
    with replicated_bank(tmp_path, numbers) as bank:
        p, db = bank.p, bank.db
        # Acknowledged updates after the creates: a few balances move.
        rng = random.Random(3)
        for _ in range(20):
            src, dst = rng.sample(numbers, 2)
            transfer(db, src, dst, 1)
        before = read_all(db, numbers, 30)
        assert sum(before.values()) == START * ACCOUNTS

        # (a) SIGKILL the node acting for the most partitions.
        victim = max("ABC", key=lambda n: len(partitions_of(p, n)))
        rest = "".join(n for n in "ABC" if n != victim)
        assert partitions_of(p, victim), "the victim acts for partitions"
        p.kill(victim)
        wait_until(lambda: served(p, rest, replicas=False), 60, f"{rest} serving every partition")
        after = read_all(db, numbers, 30)
        assert after == before, "an acknowledged write was lost in the failover"

        # (c) Restart: the node is restored by copy and becomes a replica (or active) again.
        p.start(victim)
        wait_until(lambda: restored(p, victim, "ABC"), 90, f"{victim} restored")
        # Its copy is real: kill another node; the survivors still serve everything.
        second = rest[0]
        survivors = "".join(n for n in "ABC" if n != second)
        p.kill(second)
        wait_until(
            lambda: served(p, survivors, replicas=False), 60, f"{survivors} serving everything"
        )
        assert read_all(db, numbers, 30) == before


@nonstop.transactional
def transfer(tx: nonstop.Transaction, src: str, dst: str, amount: int) -> None:
    move(tx, src, dst, amount)


def move(tx: nonstop.Transaction, src: str, dst: str, amount: int) -> None:
    locked = {n: tx.get(Account, number=n, lock="write") for n in sorted((src, dst))}
    locked[src].balance -= amount
    locked[dst].balance += amount


class Load:
    """Client threads doing transfers, one attempt per transaction (no replay): every
    error kept with the time its attempt started."""

    def __init__(self, p: Procs, numbers: list[str], threads: int) -> None:
        self.p, self.numbers, self.threads = p, numbers, threads
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[tuple[float, str, str]] = []
        self.lock = threading.Lock()
        self.workers = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        db = connect(self.p)
        try:
            while not self.stop.is_set():
                src, dst = rng.sample(self.numbers, 2)
                started = time.monotonic()
                try:
                    with db.transaction() as tx:  # one attempt: its error is seen here
                        move(tx, src, dst, rng.randint(1, 5))
                except errors.Error as exc:
                    with self.lock:
                        self.errors.append((started, type(exc).__name__, str(exc)))
                    time.sleep(0.05)
                    continue
                with self.lock:
                    self.done += 1
        finally:
            db.close()

    def __enter__(self) -> Load:
        for w in self.workers:
            w.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(60)


def first_commit_on(db: Any, number: str, since: float, timeout: float) -> float:
    """Seconds from ``since`` to the first commit that writes account ``number``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with db.transaction() as tx:
                account = tx.get(Account, number=number, lock="write")
                account.owner = f"t{time.monotonic()}"
            return time.monotonic() - since
        except errors.NotFound:
            raise
        except errors.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.mark.timeout(300)
def test_transfers_continue_through_a_kill_and_the_total_is_conserved(tmp_path: Path) -> None:
    numbers = [f"T-{i}" for i in range(ACCOUNTS)]
    with replicated_bank(tmp_path, numbers) as bank:
        p, db = bank.p, bank.db
        victim = "B"
        moved = partitions_of(p, victim)
        assert moved
        probe = accounts_on(bank, victim)[0]
        with Load(p, numbers, threads=4) as load:
            time.sleep(1.5)
            done_before = load.done
            killed_at = time.monotonic()
            p.kill(victim)
            took = first_commit_on(db, probe, killed_at, 60)
            wait_until(
                lambda: served(p, "AC", replicas=False), 60, "A and C serving every partition"
            )
            settled_at = time.monotonic()
            time.sleep(2.0)
            # Restore under load: the node comes back, is copied to while transfers run,
            # and takes its partitions back by priority.
            done_restart = load.done
            p.start(victim)
            wait_until(lambda: restored(p, victim, "ABC"), 90, f"{victim} restored")
            time.sleep(1.5)
        print(
            f"\ntakeover with data: {took * 1000:.0f} ms from SIGKILL of {victim} to the "
            f"first commit on a partition it acted for ({len(moved)} partitions moved); "
            f"transfers {done_before} before, {load.done} in all (restore under load); errors "
            f"{dict(Counter(kind for _, kind, _ in load.errors))}"
        )
        assert load.done > done_before, "no transfer after the kill"
        assert load.done > done_restart, "no transfer after the restart"
        late = [
            (kind, why) for at, kind, why in load.errors if at > settled_at and not retryable(kind)
        ]
        assert not late, f"non-retryable errors of transfers begun after the takeover: {late}"
        during = {kind for _, kind, _ in load.errors}
        assert during <= {
            "NotActive",
            "Unavailable",
            "TransactionLost",
            "Conflict",
            "LockTimeout",
            "Deadlock",
            "BranchRolledBack",
            "Aborted",
            "AmbiguousCommit",
        }, during
        final = read_all(db, numbers, 30)
        assert sum(final.values()) == START * ACCOUNTS, "total not conserved"
        assert took < 30


def test_partitions_with_replicas_replicate_unless_turned_off(tmp_path: Path) -> None:
    from nonstop.node.config import ConfigError, from_mapping

    def config(ha: dict[str, Any]) -> Any:
        return from_mapping({"name": "A", "data": str(tmp_path), "ha": ha})

    assert config(OPTIONS["ha"]).ha.replicating, "the default policy's replica is fed"
    assert config({**OPTIONS["ha"], "replicate_data": True}).ha.replicating  # the old key
    zero = {"data": "partitions", "policies": {"default": {"replicas": 0}}}
    assert not config(zero).ha.replicating, "one copy: nothing to replicate to"
    assert config({}).ha.replicating, "the default: by partition, one sync replica each"
    assert not config({"data": "nodes"}).ha.replicating, "routing by node does not replicate"
    with pytest.raises((ConfigError, ValueError), match="replicate_data = false"):
        config({**OPTIONS["ha"], "replicate_data": False})
    with pytest.raises((ConfigError, ValueError), match="async replicas"):
        config({"data": "partitions", "policies": {"default": {"async_replicas": 1}}})
