"""A large overwrite on a real 3-node cluster: the swap never blocks a node.

The nodes run with a short ``rpc_timeout`` (``RPC_TIMEOUT``, 1 s) so that a swap longer than
that is what the test exercises: before, the swap ran as one step on the
node's event loop and the coordinator gave up with ``Unavailable: node B did
not answer branch.overwrite``.  Now each node swaps in bounded slices,
yielding to its event loop between them, and reports progress to the
coordinator while it works (data-path.md §6.2); a type the bounded swap covers
(bulk/swap_apply.py) is swapped by a transaction of a few hundred bytes and then
applied a page per store commit on each node, in a thread of its own
(data-path.md §6.3).  From the swap's start until every node holds the new set
a second client commits small transactions (their latency stays low) and a
watcher asks every node for the cluster's state (no node is ever seen Down,
and no node's failure detector logs a peer Down).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nonstop.admin.owned import OwnedCluster
from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.model.codec import pack
from nonstop.spark.source import home
from tests.spark.conftest import ROOT, wait_until
from tests.spark.watch import DownLog, DownWatcher

ITEM = "pipe.Item"
PLAIN = "pipe.Plain"
"""Swapped with memory bounded per page (bulk/swap_apply.py)."""
OWNER = "pipe.Owner"
OLD = 60_000
"""Objects before the swap (20,000 a node): the swap takes several rpc_timeouts."""
NEW = 45_000
RPC_TIMEOUT = 1.0
"""The nodes' ``rpc_timeout``: the swap must last longer, or the test proves nothing."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[OwnedCluster]:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if os.environ.get("SPARK_DEBUG_LOOP"):
        env["PYTHONASYNCIODEBUG"] = "1"
    # The by-node swap (bulk/swap_apply.py); overwrite by partition:
    # tests/spark/test_partition_overwrite.py.
    options = {"rpc_timeout": RPC_TIMEOUT, "sync": False, "ha": {"data": "nodes"}}
    oc = OwnedCluster(tmp_path / "c", 3, apps=["tests.spark.model"], options=options, env=env)
    try:
        oc.start_all(timeout=60)
        yield oc
    finally:
        oc.close()


def _columns(keys: list[str], qty: int) -> bytes:
    return pack({"sku": keys, "qty": [qty] * len(keys)})


def _by_home(keys: list[str], names: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {n: [] for n in names}
    for k in keys:
        out[names[home(k, len(names))]].append(k)
    return out


@pytest.mark.parametrize(
    ("kind", "scale"),
    [
        # The bounded swap (Plain, 240,000 objects): the proof, in make test.
        pytest.param(PLAIN, 4, id="bounded-swap"),
        # The per-object swap (Item): in make test-long only.
        pytest.param(ITEM, 1, id="per-object-swap", marks=pytest.mark.long),
    ],
)
def test_a_large_swap_keeps_every_node_answering(
    cluster: OwnedCluster, kind: str, scale: int
) -> None:
    """``scale``: the bounded swap is several times faster per object; 4x the objects
    make it still last longer than ``rpc_timeout`` on an idle machine (2.3 s here)."""
    addresses = ",".join(cluster.addresses)
    nodes = cluster_nodes(addresses)
    names = [n["name"] for n in nodes]
    address = {n["name"]: n["address"] for n in nodes}
    old = _by_home([f"o{i:06}" for i in range(OLD * scale)], names)
    new = _by_home([f"n{i:06}" for i in range(NEW * scale)], names)
    job = "bigswap"
    for name in names:
        with BulkClient(address[name]) as c:
            keys = old[name]
            for i in range(0, len(keys), 10_000):
                c.call(
                    "bulk.upsert",
                    type=kind,
                    format="columns",
                    rows=_columns(keys[i : i + 10_000], 1),
                )
            c.call("bulk.overwrite.begin", type=kind, job=job)
            keys = new[name]
            for i in range(0, len(keys), 10_000):
                c.call(
                    "bulk.overwrite.part",
                    type=kind,
                    job=job,
                    tag=f"0/0/{i}",
                    key="sku",
                    format="columns",
                    rows=_columns(keys[i : i + 10_000], 2),
                )

    stop = threading.Event()
    latencies: list[float] = []
    failures: list[BaseException] = []

    def other_client() -> None:
        """Small transactions on another type, through another node, during the swap."""
        n = 0
        with BulkClient(address["C"], timeout=30) as c:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    sid = c.call("tx.begin")["s"]
                    c.call("tx.create", s=sid, type=OWNER, st=pack({"name": f"w{n}"}))
                    c.call("tx.commit", s=sid)
                except BaseException as exc:
                    failures.append(exc)
                    return
                latencies.append(time.monotonic() - started)
                n += 1
                time.sleep(0.02)

    def counts() -> dict[str, int]:
        out = {}
        for name in names:
            with BulkClient(address[name], timeout=120) as c:
                out[name] = c.call("bulk.plan", type=kind)["count"]
        return out

    want = {name: len(new[name]) for name in names}
    downs = DownLog({name: cluster.log_path(name) for name in names})
    threads = [threading.Thread(target=other_client)]
    for t in threads:
        t.start()
    with DownWatcher(address) as watcher:
        time.sleep(0.5)  # the other client's latency before the swap, for comparison
        try:
            started = time.monotonic()
            marks = [time.time()]
            with BulkClient(address["A"], timeout=600) as c:
                sid = c.call("tx.begin")["s"]
                swapped = c.call("tx.overwrite", s=sid, type=kind, job=job, parts=None)
                marks.append(time.time())
                c.call("tx.commit", s=sid)
                marks.append(time.time())
            # Phase two lands on each node once it applied its prepared write set (the
            # bounded swap: once its pages are applied); a bulk read waits for that.
            landed = wait_until(lambda: counts() == want, 120)
            marks.append(time.time())
            took = time.monotonic() - started
        finally:
            stop.set()
            for t in threads:
                t.join(60)
    assert landed, (counts(), want)
    assert swapped["deleted"] == OLD * scale and swapped["inserted"] == NEW * scale, swapped
    assert took > 1.5 * RPC_TIMEOUT, (
        f"the swap took {took:.1f} s: not well over rpc_timeout ({RPC_TIMEOUT} s), proves nothing"
    )
    assert not failures, failures
    assert not watcher.down_seen, (marks, watcher.down_seen[:5])
    # No failure detector marked a peer Down from the swap's start until the new set
    # landed.
    assert not downs.lines(), downs.lines()[:5]
    assert len(latencies) > 10, latencies
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.25, latencies  # median
    assert latencies[-1] < 1.5, latencies[-5:]  # worst
    print("marks", marks, "took", round(took, 1), "latencies", latencies[len(latencies) // 2])
