"""Issue 12: a node busy with bulk writes by partition keeps answering, and is never seen Down.

A real 3-node cluster routing by partition (16 partitions, one sync replica each)
takes a load of 40,000 rows in 5,000-row Arrow batches through the Spark task's
writer (``PartitionWriter``, without Spark), while a second client commits small
transactions on the same type.  Meanwhile and afterwards:

* no node's failure detector suspects any peer (no ``node_state`` change to
  ``InDownNotifier`` or ``Down`` in any node's log after the cluster was served):
  the busy nodes keep answering keep-alives, and a busy observer does not take
  its peers for silent (``cluster/failure.py``, its own stalls credited);
* no node's event loop woke more than ``LAG_BOUND`` late (the lag monitor's
  histogram in ``runtime_stats``, counted over the load only): the detector's
  timeout (0.5 s in these clusters);
* every small transaction of the second client committed, none slower than
  ``TX_BOUND`` (no request timeout fires on a node that is busy but progressing).

The sibling test overwrites by partition (one swap transaction over the 16
partitions, data-path.md §6.6) 20,000 rows by 20,000 others -- 40,000 objects
deleted and created, each partition's share replicated in parts of a bounded
size (replication.md §4a) -- while a second client commits small transactions
on another type: no node is suspected, the swap is seen whole, and the loops'
late wake-ups are printed (the lag monitor) for the record.

``long`` (about 30-60 s each on a loaded 2-core machine): ``make test-long``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

import nonstop
from nonstop.admin.owned import DEFAULT_OPTIONS, OwnedCluster
from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.errors import Retryable
from nonstop.model.managed import type_info
from nonstop.spark.partition_writes import PartitionWriter
from nonstop.spark.schema import Options
from tests.spark.model import Item, Plain
from tests.spark.test_partition_overwrite import _staged_job, _state
from tests.spark.test_partition_writes import ITEM, replicated  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.timeout(300), pytest.mark.long]

BATCHES, BATCH = 8, 5_000
LAG_BOUND = 0.5
"""No wake-up of any node's loop later than this during the load (a histogram bound): the
failure detector's ``nonresponse_timeout`` in these clusters."""
TX_BOUND = 5.0
"""No small transaction of the second client slower than this (seconds)."""
SUSPECTED = frozenset({"InDownNotifier", "Down"})


def _runtime_stats(oc: OwnedCluster, name: str) -> dict[str, Any]:
    with BulkClient(oc.address(name), timeout=10) as c:
        reply: dict[str, Any] = c.call("runtime_stats")
        return reply


def _late_wakeups(oc: OwnedCluster) -> dict[str, list[int]]:
    """Per node, its loop-lag histogram counts (``runtime_stats``'s ``loop_lag``)."""
    return {n: list(_runtime_stats(oc, n)["loop_lag"]["counts"]) for n in oc.names}


def _suspicions(oc: OwnedCluster, since: float) -> list[str]:
    """Every failure-detector suspicion logged after ``since`` (epoch seconds), any node."""
    found: list[str] = []
    for name in oc.names:
        log = oc.lc.dir / name / "node.log"
        for line in log.read_text().splitlines():
            if '"node_state"' not in line:
                continue
            event = json.loads(line)
            notify = event.get("notify") or {}
            stamp = time.mktime(time.strptime(event["time"][:19], "%Y-%m-%dT%H:%M:%S"))
            stamp -= time.timezone  # the log's times are UTC
            if notify.get("new") in SUSPECTED and stamp >= since - 1:
                found.append(f"{name} saw {notify.get('peer')} {notify['new']} at {event['time']}")
    return found


class SmallTransactions:
    """A second client committing one small transaction after another on ``kind`` in a
    thread, retrying retryable errors as a user would; latencies and failures kept."""

    def __init__(self, oc: OwnedCluster, kind: type[Any], prefix: str) -> None:
        self.latencies: list[float] = []
        self.failures: list[BaseException] = []
        self._running = threading.Event()
        self._running.set()
        self._thread = threading.Thread(target=self._run, args=(oc, kind, prefix))

    def __enter__(self) -> SmallTransactions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._running.clear()
        self._thread.join(60)

    def _run(self, oc: OwnedCluster, kind: type[Any], prefix: str) -> None:
        db = nonstop.connect(",".join(oc.addresses))
        try:
            i = 0
            while self._running.is_set():
                t0 = time.monotonic()
                for attempt in range(20):
                    try:
                        with db.transaction() as tx:
                            tx.create(kind, sku=f"{prefix}-{i:05}", qty=i)
                        break
                    except Retryable:
                        if attempt == 19:
                            raise
                        time.sleep(0.05)
                self.latencies.append(time.monotonic() - t0)
                i += 1
        except BaseException as exc:  # (reported by the test)
            self.failures.append(exc)
        finally:
            db.close()


def _late(
    oc: OwnedCluster, before: dict[str, list[int]], after: dict[str, list[int]], over: float
) -> dict[str, int]:
    """Per node, its loop's wake-ups later than ``over`` seconds between the two counts."""
    bounds = _runtime_stats(oc, oc.names[0])["loop_lag"]["bounds"]
    return {
        name: sum(
            a - b
            for bound, a, b in zip([*bounds, float("inf")], after[name], before[name], strict=True)
            if bound > over
        )
        for name in oc.names
    }


OVERWRITE_ROWS = int(os.environ.get("NONSTOP_BUSY_OVERWRITE_ROWS", "20000"))
"""Rows of the old set and of the new (the benchmark's sizes by hand: 100000)."""


def test_an_overwrite_by_partition_of_40000_objects_never_makes_a_node_look_down(
    replicated: OwnedCluster,  # noqa: F811
) -> None:
    oc = replicated
    opts = Options.parse({"cluster": ",".join(oc.addresses), "type": ITEM})
    writer = PartitionWriter(opts, cluster_nodes(opts.cluster), "sku", type_info(Item).version)
    try:
        for b in range(OVERWRITE_ROWS // BATCH):
            skus = [f"old-{b:02}-{i:05}" for i in range(BATCH)]
            writer.write(pa.table({"sku": skus, "qty": [1] * BATCH}))
    finally:
        writer.close()
    new = [f"new-{i:05}" for i in range(OVERWRITE_ROWS)]
    quarter = OVERWRITE_ROWS // 4
    job = _staged_job(
        oc,
        [
            pa.table({"sku": new[i : i + quarter], "qty": [2] * quarter})
            for i in range(0, OVERWRITE_ROWS, quarter)
        ],
    )
    before = _late_wakeups(oc)
    started = time.time()
    t0 = time.monotonic()
    with SmallTransactions(oc, Plain, "side") as side:
        job.commit(job.messages)  # type: ignore[attr-defined]
    took = time.monotonic() - t0
    after = _late_wakeups(oc)
    print(
        f"\noverwrite of {OVERWRITE_ROWS} by {OVERWRITE_ROWS}: {took:.1f} s; loop wake-ups",
        f"later than 0.1 s {_late(oc, before, after, 0.1)},",
        f"later than 0.25 s {_late(oc, before, after, 0.25)},",
        f"later than {LAG_BOUND} s {_late(oc, before, after, LAG_BOUND)};",
        f"side transactions {len(side.latencies)}, slowest {max(side.latencies, default=0):.2f} s",
    )
    assert not side.failures, side.failures
    assert side.latencies, "the second client committed nothing"
    assert _suspicions(oc, started) == []
    if OVERWRITE_ROWS <= 20_000:  # (a locking query of 100,000 objects outlasts its retries)
        assert _state(oc, "ABC") == dict.fromkeys(new, 2), "the new set, whole"


def test_a_bulk_load_by_partition_never_makes_a_node_look_down(
    replicated: OwnedCluster,  # noqa: F811
) -> None:
    oc = replicated
    assert DEFAULT_OPTIONS["nonresponse_timeout"] >= LAG_BOUND
    before = _late_wakeups(oc)
    started = time.time()
    opts = Options.parse({"cluster": ",".join(oc.addresses), "type": ITEM})
    writer = PartitionWriter(opts, cluster_nodes(opts.cluster), "sku", type_info(Item).version)
    try:
        with SmallTransactions(oc, Item, "small") as side:
            for b in range(BATCHES):
                skus = [f"busy-{b:02}-{i:05}" for i in range(BATCH)]
                writer.write(pa.table({"sku": skus, "qty": [b] * BATCH}))
    finally:
        writer.close()
    after = _late_wakeups(oc)
    assert not side.failures, side.failures
    assert writer.inserted == BATCHES * BATCH
    assert side.latencies, "the second client committed nothing"
    assert max(side.latencies) < TX_BOUND, sorted(side.latencies)[-5:]
    assert _suspicions(oc, started) == []
    late = _late(oc, before, after, LAG_BOUND)
    assert late == {name: 0 for name in oc.names}, (late, before, after)
