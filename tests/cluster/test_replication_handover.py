"""A handover back to a restored node under load (replication.md §10e), real processes.

Three nodes, the default policy (16 partitions, one sync replica).  Client threads
run transfers, one attempt per transaction (every error is seen), each also
counting its own commits in an account of its own.  B is SIGKILLed, A and C take
over, B restarts, is restored by copy and takes its partitions back by priority
(the handover).  Proven:

* every attempt begun after the takeover settled -- through B's restart, its
  restore and the handover -- fails, if at all, with a retryable error: before a
  handover the old active node takes no new commit (``NotActive``, nothing made)
  and lets what is in flight complete, so no commit there ends with an unknown
  outcome (``Unavailable``);
* no acknowledged commit is lost and no retryable error hides a commit: each
  thread's counter equals its acknowledged commits plus at most its attempts of
  unknown outcome; the total of the transfer accounts is conserved.

The longest attempt after the kill is printed (a dead coordinator's branches no
longer hold their locks until ``decision_timeout``: dtx ``peers_down``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nonstop import errors
from nonstop.ha.partition_table import partition_location
from tests.cluster.conftest import REAL_CLUSTER, Procs, app_cluster, wait_until
from tests.cluster.test_replication import (
    OPTIONS,
    START,
    balances,
    connect,
    create_accounts,
    partitions_of,
    read_all,
    restored,
    retryable,
    served,
)
from tests.distmodel import Account

pytestmark = [
    pytest.mark.skipif(not REAL_CLUSTER, reason="replication is the real cluster node's"),
    pytest.mark.long,  # ~16 s of real processes: `make test-long` (make test is near its bound)
]

ACCOUNTS = 48
THREADS = 6


class CountingLoad:
    """Threads of transfers; each commit also adds 1 to the thread's own counter account."""

    def __init__(self, p: Procs, numbers: list[str]) -> None:
        self.p, self.numbers = p, numbers
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: Counter[int] = Counter()
        self.unknown: Counter[int] = Counter()
        self.attempts: list[tuple[float, float, str, str]] = []
        """(began, seconds, error kind or "ok", message) of every attempt."""
        self.workers = [threading.Thread(target=self.run, args=(i,)) for i in range(THREADS)]

    def run(self, i: int) -> None:
        rng = random.Random(i)
        names = "ABC"[i % 3 :] + "ABC"[: i % 3]  # coordinators on every node, B's too
        db = connect(self.p, names)
        try:
            while not self.stop.is_set():
                src, dst = rng.sample(self.numbers, 2)
                began, kind, why = time.monotonic(), "ok", ""
                try:
                    with db.transaction() as tx:
                        wanted = sorted({src, dst, f"N-{i}"})
                        got = {n: tx.get(Account, number=n, lock="write") for n in wanted}
                        got[src].balance -= 1
                        got[dst].balance += 1
                        got[f"N-{i}"].balance += 1
                except errors.Error as exc:
                    kind, why = type(exc).__name__, str(exc)
                with self.lock:
                    self.attempts.append((began, time.monotonic() - began, kind, why))
                    if kind == "ok":
                        self.acked[i] += 1
                    elif not retryable(kind):
                        self.unknown[i] += 1
                if kind != "ok":
                    time.sleep(0.05)
        finally:
            db.close()

    def __enter__(self) -> CountingLoad:
        for w in self.workers:
            w.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        for w in self.workers:
            w.join(60)


@pytest.mark.timeout(240)
def test_a_handover_under_load_fails_commits_only_retryably_and_loses_none(
    tmp_path: Path,
) -> None:
    with app_cluster(tmp_path, 3, OPTIONS) as p:
        wait_until(lambda: served(p, "ABC"), 60, "every partition served with a replica")
        db = connect(p)
        try:
            numbers = [f"H-{i}" for i in range(ACCOUNTS)]
            counters = [f"N-{i}" for i in range(THREADS)]
            create_accounts(db, numbers + counters)
            # The transfers go to the partitions B acts for (and takes back): many commits
            # there are in flight at each handover.
            locations = {partition_location(n) for n in partitions_of(p, "B")}
            with db.transaction() as tx:
                moving = [
                    n for n in numbers if tx.ref(tx.get(Account, number=n)).location in locations
                ]
            assert len(moving) >= 4, moving
            with CountingLoad(p, moving) as load:
                time.sleep(1.0)
                killed_at = time.monotonic()
                p.kill("B")
                wait_until(lambda: served(p, "AC", replicas=False), 60, "A and C serving")
                settled_at = time.monotonic()
                p.start("B")
                wait_until(lambda: restored(p, "B", "ABC"), 90, "B restored, handed back")
                handed_at = time.monotonic()
                time.sleep(1.0)
            after_kill = [a for a in load.attempts if a[0] >= killed_at]
            slowest = max(after_kill, key=lambda a: a[1])
            late = [a for a in load.attempts if a[0] >= settled_at]
            print(
                f"\nhandover: takeover settled {settled_at - killed_at:.2f} s after the kill, B "
                f"restored {handed_at - settled_at:.2f} s after its restart; attempts after "
                f"the takeover {dict(Counter(a[2] for a in late))}; longest attempt begun "
                f"after the kill {slowest[1]:.2f} s ({slowest[2]})"
            )
            bad = [(kind, why) for _, _, kind, why in late if kind != "ok" and not retryable(kind)]
            assert not bad, f"non-retryable errors after the takeover settled: {bad}"
            assert sum(load.acked.values()) > 0
            final = read_all(db, numbers + counters, 30)
            assert sum(final[n] for n in numbers) == START * ACCOUNTS, "total not conserved"
            for i, name in enumerate(counters):
                commits = final[name] - START
                assert load.acked[i] <= commits <= load.acked[i] + load.unknown[i], (
                    f"thread {i}: {commits} commits, {load.acked[i]} acknowledged, "
                    f"{load.unknown[i]} of unknown outcome"
                )
            assert balances(db, counters)  # a plain read answers too
        finally:
            db.close()
