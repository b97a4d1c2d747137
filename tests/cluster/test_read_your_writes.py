"""Read your writes across nodes, with real processes (issue 10).

A commit is acknowledged once every node it wrote has applied it.  Before the
fix it was acknowledged as soon as the decision was durable and the
participants applied it just after: the probe of issue 10 (10,000 objects
created on B by a client of A) read 0 of them in the next query, and the
README's transfer followed by a ``snapshot`` sum showed a torn total in 9 of
50 runs.  Nodes load ``tests.distmodel`` (``--app``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest

import nonstop
from nonstop.client.credentials import load_credentials
from tests.cluster.conftest import Procs
from tests.cluster.test_metrics_logs import basic_auth, get_metrics
from tests.cluster.test_remote_client import start, transfer
from tests.distmodel import Account
from tests.prometheus_samples import families, value

ROUNDS = 3
PER_ROUND = 1_000
TRANSFERS = 50


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    started = start(tmp_path_factory.mktemp("ryw"), nonresponse_timeout=2.0)
    try:
        started.wait_served()
        yield started
    finally:
        started.cleanup()


def numbers_on(procs: Procs, node: str, prefix: str, count: int) -> list[str]:
    """``count`` account numbers whose partition has ``node`` for its active node
    (objects are placed by partition, the default routing)."""
    candidates = [f"{prefix}{i}" for i in range(64)]
    return list(procs.keys_active_on(node, "dist.Account", "number", candidates, count))


@pytest.fixture(scope="module")
def nodes(procs: Procs) -> dict[str, str]:
    return {n: procs.address(n) for n in "ABC"}


def test_the_next_query_sees_every_object_the_acknowledged_commit_created(
    nodes: dict[str, str],
) -> None:
    with nonstop.connect(nodes["A"]) as c:  # attached to A only
        for r in range(ROUNDS):
            owner = f"ryw{r}"
            with c.transaction() as tx:  # placed by key: spread over every partition
                for i in range(PER_ROUND):
                    tx.create(Account, number=f"ryw-{r}-{i}", owner=owner)
            # The very next transaction, no pause: every object is there.
            with c.transaction() as tx:
                found = tx.query(Account).where(owner=owner).all()
                assert len(found) == PER_ROUND, f"round {r}: {len(found)} of {PER_ROUND}"
                assert {a.number for a in found} == {f"ryw-{r}-{i}" for i in range(PER_ROUND)}
            # And a lock-free count from a snapshot transaction too.
            with c.transaction(isolation="snapshot") as tx:
                assert tx.query(Account).where(owner=owner).count() == PER_ROUND


# The reads below run as a user's would: ``@transactional`` replays a retryable error
# (a partition's active node may stop acting for a moment on a loaded machine: NotActive).
@nonstop.transactional(isolation="snapshot")
def snapshot_balances(tx: nonstop.Transaction, *numbers: str) -> list[int]:
    return [tx.get(Account, number=n).balance for n in numbers]


@nonstop.transactional(isolation="snapshot")
def snapshot_sums(tx: nonstop.Transaction, owner: str, numbers: list[str]) -> tuple[int, int]:
    by_query = sum(a.balance for a in tx.query(Account).where(owner=owner))
    by_key = sum(tx.get(Account, number=n).balance for n in numbers)
    return by_query, by_key


def test_the_readme_transfer_then_a_snapshot_sum_is_never_torn(
    procs: Procs, nodes: dict[str, str]
) -> None:
    # The coordinator C is neither account's active node: one's partition is A's, one B's.
    rw_a, rw_b = (numbers_on(procs, node, f"rw-{node}-", 1)[0] for node in "AB")
    with nonstop.connect(nodes["C"]) as c:
        with c.transaction() as tx:
            tx.create(Account, number=rw_a, owner="rw", balance=1_000)
            tx.create(Account, number=rw_b, owner="rw", balance=1_000)
        torn = []
        for i in range(TRANSFERS):
            src, dst = (rw_a, rw_b) if i % 2 else (rw_b, rw_a)
            transfer(c, src, dst, 7)
            a, b = snapshot_balances(c, rw_a, rw_b)
            if a + b != 2_000:
                torn.append((i, a, b))
        assert torn == [], f"{len(torn)} of {TRANSFERS} snapshot sums torn: {torn[:5]}"


@pytest.mark.parametrize(
    ("most_sums", "seconds"),
    [(100, 10.0), pytest.param(200, 20.0, marks=pytest.mark.long)],
    ids=["100-sums", "200-sums"],
)
def test_snapshot_sums_while_transfers_commit_on_many_threads(
    procs: Procs, nodes: dict[str, str], most_sums: int, seconds: float
) -> None:
    """A snapshot is a snapshot (issue 10): while 6 threads run cross-node transfers, a
    ``snapshot`` transaction sums the accounts of all three nodes in a loop -- by a query
    over the owner and by lookups -- and every sum is the conserved total.

    ``make test`` takes up to 100 sums in 10 s (about 80 on the shared 2-core machine,
    where a sum takes about 0.1 s; views per node without the cut tore 1 sum in 6),
    ``make test-long`` up to 200 in 20 s."""
    owner = f"ss{most_sums}"  # (each variant its own accounts: `-m ""` runs both here)
    numbers = [num for n in "ABC" for num in numbers_on(procs, n, f"{owner}-{n}", 3)]
    with nonstop.connect(nodes["A"]) as c, c.transaction() as tx:
        for number in numbers:
            tx.create(Account, number=number, owner=owner, balance=1_000)
    total = 1_000 * len(numbers)
    stop = threading.Event()
    errors: list[BaseException] = []
    transfers = [0] * 6

    def mover(w: int) -> None:
        rng = random.Random(w)
        try:
            with nonstop.connect(nodes["ABC"[w % 3]]) as c:
                while not stop.is_set():
                    src, dst = rng.sample(numbers, 2)
                    transfer(c, src, dst, rng.randint(1, 20))
                    transfers[w] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=mover, args=(w,), daemon=True) for w in range(6)]
    for t in threads:
        t.start()
    sums: list[tuple[int, int]] = []
    took: list[float] = []
    deadline = time.monotonic() + seconds
    try:
        with nonstop.connect(nodes["C"]) as c:
            while len(sums) < most_sums and time.monotonic() < deadline and not errors:
                began = time.monotonic()
                sums.append(snapshot_sums(c, owner, numbers))
                took.append(time.monotonic() - began)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    took.sort()
    admin = load_credentials(procs.lc.credentials_path)
    status, body = get_metrics(procs, "C", basic_auth(admin.user, admin.password))
    assert status == 200
    scraped = families(body.decode())
    cuts = value(scraped, "nonstop_data_events", event="cuts")
    retries = value(scraped, "nonstop_data_events", event="cut_retries")
    print(
        f"\n{len(sums)} snapshot sums, {sum(transfers)} transfers; a snapshot took "
        f"p50 {took[len(took) // 2] * 1e3:.1f} ms, max {took[-1] * 1e3:.1f} ms; "
        f"C opened {cuts:.0f} cuts after {retries:.0f} retries"
    )
    assert cuts >= len(sums)  # every snapshot opened its views as one cut (snapshot_cut.py)
    assert errors == []
    assert len(sums) >= 20 and sum(transfers) >= 50, (len(sums), transfers)
    torn = [s for s in sums if s != (total, total)]
    assert torn == [], f"{len(torn)} of {len(sums)} snapshot sums torn: {torn[:5]}"
