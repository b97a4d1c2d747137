"""Queued calls and timers run exactly once across a failover, on real node processes
(A6 and D20 under ``ha.data = "partitions"``; docs/design/ha.md §10a).

Three nodes on loopback, the default policy (16 partitions, one sync replica each).
A client queues slow asynchronous calls on inboxes of the partitions one node acts
for, and calls on the others; that node is SIGKILLed while most of its calls are
still queued (some running); every inbox also has a timer, set by the client, due
about when the kill happens.  After the promotion every call has run exactly once
and every timer fired once: each inbox holds each of its items once, the calls in
queue order -- a call whose run reached the replica is not run again, a call still
queued runs on the promoted node, a timer due during the failover fires after it.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop import errors
from nonstop.ha.partition_table import partition_location
from tests.cluster.conftest import REAL_CLUSTER, app_cluster, wait_until
from tests.cluster.replicated_bank import (
    OPTIONS,
    connect,
    partitions_of,
    restored,
    served,
    table,
)
from tests.distmodel import Inbox

pytestmark = [
    pytest.mark.skipif(not REAL_CLUSTER, reason="replication is the real cluster node's"),
]

INBOXES = 24
CALLS = 3
SLOW = 0.3
TIMER = 1.0


@nonstop.transactional
def create_inboxes(tx: nonstop.Transaction, names: list[str]) -> None:
    for name in names:
        tx.get_or_create(Inbox, name=name)


@nonstop.transactional
def locations(tx: nonstop.Transaction, names: list[str]) -> dict[str, int]:
    """Each inbox's location (its partition)."""
    return {name: tx.ref(tx.get(Inbox, name=name)).location for name in names}


def items(db: Any, names: list[str]) -> dict[str, list[str]]:
    """Every inbox's items, once the cluster answers (retryable errors during a takeover)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with db.transaction() as tx:
                return {n: list(tx.get(Inbox, name=n).items) for n in names}
        except (errors.Retryable, errors.Unavailable, errors.ClusterError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "restore", [False, pytest.param(True, marks=pytest.mark.long, id="and-restore")]
)
def test_queued_calls_run_exactly_once_across_a_kill_of_the_active_node(
    tmp_path: Path, restore: bool
) -> None:
    """With ``restore`` (``make test-long``): the killed node then restarts, is restored
    and takes its partitions back (its store still holds the calls it had queued, run
    since by the promoted node: the copy it loads drops them), and new calls and timers
    queued after the handover also run once."""
    with app_cluster(tmp_path, 3, OPTIONS) as p:
        wait_until(lambda: served(p, "ABC"), 60, "every partition served with a replica")
        db = connect(p)
        try:
            names = [f"I-{i}" for i in range(INBOXES)]
            create_inboxes(db, names)
            where = locations(db, names)
            active = {partition_location(n): part["active"] for n, part in table(p, "A").items()}
            owner = {name: active[where[name]] for name in names}
            victim = Counter(owner.values()).most_common(1)[0][0]
            doomed = [n for n in names if owner[n] == victim]
            rest = "".join(n for n in "ABC" if n != victim)
            expected: dict[str, list[str]] = {}

            # Quick calls on the others, then slow calls on every inbox of the victim in
            # one transaction: a backlog that a kill meets.
            @nonstop.transactional
            def queue(tx: nonstop.Transaction, group: list[str], slow: bool) -> None:
                for name in group:
                    box = tx.get(Inbox, name=name)
                    box.post.after(TIMER, f"{name}:timer")
                    for k in range(CALLS):
                        if slow:
                            box.slow_post(f"{name}:{k}", SLOW)
                        else:
                            box.post(f"{name}:{k}")
                    expected[name] = [f"{name}:{k}" for k in range(CALLS)]

            queue(db, [n for n in names if n not in doomed], False)
            queue(db, doomed, True)
            ran = sum(map(len, items(db, doomed).values()))
            assert ran < len(doomed) * CALLS, "none left to move"
            p.kill(victim)  # most of the victim's calls are still queued
            killed = time.monotonic()
            wait_until(lambda: served(p, rest, replicas=False), 60, f"{rest} serving all")

            def complete() -> dict[str, list[str]] | None:
                got = items(db, names)
                return got if all(len(got[n]) >= CALLS + 1 for n in names) else None

            wait_until(complete, 60, "every queued call ran and every timer fired")
            print(
                f"\n{len(doomed) * CALLS} slow calls and {len(doomed)} timers on {victim}'s "
                f"inboxes, {len(doomed) * CALLS - ran} calls not run before its SIGKILL: all "
                f"ran or fired {time.monotonic() - killed:.1f} s after the kill"
            )
            time.sleep(1.0)  # room for a late duplicate to show (a sleep cannot fail this)
            got = items(db, names)
            for name in names:
                calls = [item for item in got[name] if not item.endswith(":timer")]
                fired = [item for item in got[name] if item.endswith(":timer")]
                assert sorted(calls) == expected[name], f"{name}: not exactly once: {got[name]}"
                # One at a time per target, in queue order (A6), across the failover too.
                assert calls == expected[name], name
                assert fired == [f"{name}:timer"], f"{name}: the timer fired {len(fired)} times"
            assert doomed, "the victim acted for inboxes"
            if restore:
                p.start(victim)
                wait_until(lambda: restored(p, victim, "ABC"), 90, f"{victim} restored")
                wait_until(lambda: partitions_of(p, victim), 60, f"{victim} active again")
                queue(db, names, False)  # (quick calls and a timer on every inbox, again)
                wait_until(
                    lambda: all(len(v) >= 2 * (CALLS + 1) for v in items(db, names).values()),
                    60,
                    "the calls and timers queued after the handover ran",
                )
                time.sleep(1.0)
                got = items(db, names)
                for name in names:
                    # (the first items as before; nothing ran twice, before or after)
                    assert sorted(got[name]) == sorted(
                        [*expected[name] * 2, f"{name}:timer", f"{name}:timer"]
                    ), f"{name}: {got[name]}"
        finally:
            db.close()
