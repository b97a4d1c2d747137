"""Read your writes across nodes, with real processes (issue 10).

A client attached to node A creates many objects on node B in one
transaction; once the commit is acknowledged, the same client's next
serializable query must see every one of them.  Before the fix the commit was
acknowledged as soon as the decision was durable, and B applied it just after:
the probe of issue 10 (10,000 objects) read 0 of them.  Nodes load
``tests.distmodel`` (``--app``).
"""

from __future__ import annotations

from pathlib import Path

import nonstop
from tests.cluster.test_remote_client import start
from tests.distmodel import Account

ROUNDS = 4
PER_ROUND = 2_000


def test_the_next_query_sees_every_object_the_acknowledged_commit_created(
    tmp_path: Path,
) -> None:
    procs = start(tmp_path, nonresponse_timeout=2.0)
    try:
        with nonstop.connect(procs.address("A")) as c:  # attached to A only
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
    finally:
        procs.cleanup()
