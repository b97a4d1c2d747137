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
longer hold their locks until ``decision_timeout``: dtx ``peers_down``).  The cluster
and its accounts come from ``tests/cluster/replicated_bank.py`` (shared with
``test_replication.py``).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from nonstop import errors
from tests.cluster.conftest import REAL_CLUSTER, Procs, wait_until
from tests.cluster.replicated_bank import (
    START,
    accounts_on,
    balances,
    connect,
    read_all,
    replicated_bank,
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

    def __init__(
        self,
        p: Procs,
        numbers: list[str],
        coordinators: tuple[str, ...] = ("ABC", "BCA", "CAB"),
        across: tuple[list[str], list[str]] | None = None,
    ) -> None:
        self.p, self.numbers, self.coordinators = p, numbers, coordinators
        self.across = across
        """Two lists: each transfer goes from one of the first to one of the second (and
        counts nothing), so that every commit is a two-phase one across their nodes."""
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: Counter[int] = Counter()
        self.unknown: Counter[int] = Counter()
        self.attempts: list[tuple[float, float, str, str]] = []
        """(began, seconds, error kind or "ok", message) of every attempt."""
        self.workers = [threading.Thread(target=self.run, args=(i,)) for i in range(THREADS)]

    def run(self, i: int) -> None:
        rng = random.Random(i)
        names = self.coordinators[i % len(self.coordinators)]  # the first one coordinates
        db = connect(self.p, names)
        try:
            while not self.stop.is_set():
                if self.across is None:
                    src, dst = rng.sample(self.numbers, 2)
                    wanted = sorted({src, dst, f"N-{i}"})
                else:
                    src, dst = rng.choice(self.across[0]), rng.choice(self.across[1])
                    wanted = sorted({src, dst})
                began, kind, why = time.monotonic(), "ok", ""
                try:
                    with db.transaction() as tx:
                        got = {n: tx.get(Account, number=n, lock="write") for n in wanted}
                        got[src].balance -= 1
                        got[dst].balance += 1
                        if self.across is None:
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
    numbers = [f"H-{i}" for i in range(ACCOUNTS)]
    counters = [f"N-{i}" for i in range(THREADS)]
    with replicated_bank(tmp_path, numbers + counters) as bank:
        p, db = bank.p, bank.db
        # The transfers go to the partitions B acts for (and takes back): many commits
        # there are in flight at each handover.
        moving = [n for n in accounts_on(bank, "B") if n in numbers]
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
        # The handback's pause: the longest time without a commit from B's restart to the
        # end (the handover's new active node waited a whole lease before session 12).
        done = sorted(b + d for b, d, kind, _ in load.attempts if kind == "ok" and b >= settled_at)
        gap = max((b - a for a, b in itertools.pairwise(done)), default=float("nan"))
        print(
            f"\nhandover: takeover settled {settled_at - killed_at:.2f} s after the kill, B "
            f"restored {handed_at - settled_at:.2f} s after its restart; attempts after "
            f"the takeover {dict(Counter(a[2] for a in late))}; longest attempt begun "
            f"after the kill {slowest[1]:.2f} s ({slowest[2]}); longest time without a "
            f"commit from the restart on {gap:.3f} s"
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


@pytest.mark.timeout(240)
def test_a_dead_coordinators_branches_do_not_hold_their_locks_until_a_timeout(
    tmp_path: Path,
) -> None:
    """Transfers coordinated by B over accounts of partitions B does not act for: when B
    is SIGKILLed, its prepared branches on A and C (partitions that do not move, so no
    promotion resolves them) used to keep their locks for ``decision_timeout`` (10 s),
    and every transfer of the same accounts waited ``lock_wait`` (5 s) per attempt."""
    numbers = [f"D-{i}" for i in range(ACCOUNTS)]
    with replicated_bank(tmp_path, numbers) as bank:
        p, db = bank.p, bank.db
        sides = {name: accounts_on(bank, name) for name in "AC"}
        assert len(sides["A"]) >= 2 and len(sides["C"]) >= 2, sides
        branches: dict[str, list[float]] = {}
        polls: Counter[str] = Counter()
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                for name in "AC":
                    try:
                        held = p.status(name)["dtx"]["branches"]
                    except errors.Error:
                        continue
                    now = time.monotonic()
                    polls[name] += 1
                    for gtid in held:
                        if gtid.startswith("B."):
                            branches.setdefault(f"{name}:{gtid}", [now, now])[1] = now
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        coordinators = ("BAC", "BAC", "ACB", "CAB")
        across = (sides["A"], sides["C"])
        with CountingLoad(p, numbers, coordinators, across) as load:
            time.sleep(1.0)
            watcher.start()
            killed_at = time.monotonic()
            p.kill("B")
            time.sleep(6.0)
        watching.set()
        watcher.join(10)
        after_kill = [a for a in load.attempts if a[0] >= killed_at]
        slowest = max(after_kill, key=lambda a: a[1])
        held_after = {k: last - killed_at for k, (_, last) in branches.items()}
        longest = max(held_after.values(), default=0.0)
        print(
            f"\ndead coordinator: longest attempt begun after the kill {slowest[1]:.2f} s "
            f"({slowest[2]}); B's branches on A/C last seen {longest:.2f} s after the kill "
            f"({len(held_after)} seen in {dict(polls)} polls); "
            f"attempts {dict(Counter(a[2] for a in after_kill))}"
        )
        assert longest < 4.0, f"a dead coordinator's branch held for {longest:.1f} s"
        assert slowest[1] < 4.0, f"an attempt waited {slowest[1]:.1f} s: {slowest}"
        final = read_all(db, numbers, 30)
        assert sum(final.values()) == START * ACCOUNTS, "total not conserved"
