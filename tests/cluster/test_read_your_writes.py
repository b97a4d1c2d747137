"""Read your writes across nodes, with real processes (issue 10).

A commit is acknowledged once every node it wrote has applied it.  Before the
fix it was acknowledged as soon as the decision was durable and the
participants applied it just after: the probe of issue 10 (10,000 objects
created on B by a client of A) read 0 of them in the next query, and the
README's transfer followed by a ``snapshot`` sum showed a torn total in 9 of
50 runs.  Nodes load ``tests.distmodel`` (``--app``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import nonstop
from tests.cluster.test_remote_client import start, transfer
from tests.distmodel import Account

ROUNDS = 3
PER_ROUND = 1_000
TRANSFERS = 50


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    procs = start(tmp_path_factory.mktemp("ryw"), nonresponse_timeout=2.0)
    try:
        yield {n: procs.address(n) for n in "ABC"}
    finally:
        procs.cleanup()


def test_the_next_query_sees_every_object_the_acknowledged_commit_created(
    nodes: dict[str, str],
) -> None:
    with nonstop.connect(nodes["A"]) as c:  # attached to A only
        for r in range(ROUNDS):
            owner = f"ryw{r}"
            with c.transaction() as tx:
                for i in range(PER_ROUND):
                    tx.create(Account, number=f"ryw-{r}-{i}", owner=owner, node="B")
            # The very next transaction, no pause: every object is there.
            with c.transaction() as tx:
                found = tx.query(Account).where(owner=owner).all()
                assert len(found) == PER_ROUND, f"round {r}: {len(found)} of {PER_ROUND}"
                assert {a.number for a in found} == {f"ryw-{r}-{i}" for i in range(PER_ROUND)}
            # And a lock-free count from a snapshot transaction too.
            with c.transaction(isolation="snapshot") as tx:
                assert tx.query(Account).where(owner=owner).count() == PER_ROUND


def test_the_readme_transfer_then_a_snapshot_sum_is_never_torn(nodes: dict[str, str]) -> None:
    with nonstop.connect(nodes["C"]) as c:  # the coordinator is neither account's node
        with c.transaction() as tx:
            tx.create(Account, number="rw-a", owner="rw", balance=1_000, node="A")
            tx.create(Account, number="rw-b", owner="rw", balance=1_000, node="B")
        torn = []
        for i in range(TRANSFERS):
            src, dst = ("rw-a", "rw-b") if i % 2 else ("rw-b", "rw-a")
            transfer(c, src, dst, 7)
            with c.transaction(isolation="snapshot") as tx:
                a = tx.get(Account, number="rw-a").balance
                b = tx.get(Account, number="rw-b").balance
            if a + b != 2_000:
                torn.append((i, a, b))
        assert torn == [], f"{len(torn)} of {TRANSFERS} snapshot sums torn: {torn[:5]}"
