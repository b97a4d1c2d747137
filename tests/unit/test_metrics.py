"""The node's metrics (nonstop.node.metrics, metrics_http) without a node process.

The collector reads an embedded store's group committer and lock table and a
stand-in runtime; the observer sees ops and replies as the data service hands
them over; the HTTP handler answers scrapes and refuses everything else.  The
scrape of a real node is tests/cluster/test_metrics_logs.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry
from tests.bankmodel import Account
from tests.prometheus_samples import families, value

import nonstop
from nonstop.errors import Deadlock, LockTimeout
from nonstop.node.metrics import (
    DataObserver,
    NodeCollector,
    error_kind,
    histogram,
    node_registry,
)
from nonstop.node.metrics_http import serve_metrics
from nonstop.tx.locks import LockMode
from nonstop.tx.waiting import LockTable

BOUNDS = [0.001, 0.01, 0.1, 1.0]


def scrape(registry: Any) -> dict[str, Any]:
    from prometheus_client import generate_latest

    return families(generate_latest(registry).decode())


def test_observer_counts_commit_outcomes_and_latency() -> None:
    obs = DataObserver(BOUNDS)
    for corr in range(5):
        obs.op(1, corr, "tx.commit")
    for corr in range(3):
        obs.reply(1, corr, {"ok": True})
    obs.reply(1, 3, {"error": "Conflict", "message": "x"})
    obs.reply(1, 4, {"error": "MadeUpAppError", "message": "x"})
    obs.op(1, 9, "tx.rollback")
    obs.reply(1, 9, {"ok": True})
    obs.op(2, 1, "tx.get")
    obs.reply(2, 1, {"error": "NotFound"})
    obs.reply(2, 77, {"ok": True})  # a reply to an op never seen: ignored
    obs.op(3, [1, 2], "tx.commit")  # a client's odd request id: counted, not tracked
    obs.reply(3, [1, 2], {"error": "ProtocolError"})
    assert obs.commits == 3
    assert dict(obs.aborts) == {"Conflict": 1, "other": 1, "Rollback": 1}
    assert dict(obs.errors) == {"Conflict": 1, "other": 1, "NotFound": 1, "ProtocolError": 1}
    assert sum(obs.latency.counts) == 5, "every commit's latency, not the rollback's"
    assert obs.ops == 8


def test_error_kinds_are_bounded() -> None:
    assert error_kind("LockTimeout") == "LockTimeout"
    assert error_kind("Unavailable") == "Unavailable"
    assert error_kind("ZeroDivisionError") == "other"
    assert error_kind({"not": "a name"}) == "other"


def test_histogram_is_cumulative() -> None:
    family = histogram("h", "doc", [1, 2], [3, 0, 2], 9.5)
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert samples[("nonstop_h_bucket", "1.0")] == 3
    assert samples[("nonstop_h_bucket", "2.0")] == 3
    assert samples[("nonstop_h_bucket", "+Inf")] == 5
    assert samples[("nonstop_h_count", None)] == 5
    assert samples[("nonstop_h_sum", None)] == 9.5


def test_lock_table_counts_waits_timeouts_and_deadlocks() -> None:
    table = LockTable()
    table.acquire("t1", "r1", LockMode.WRITE)
    with pytest.raises(LockTimeout):
        table.acquire("t2", "r1", LockMode.WRITE, timeout=0.05)
    assert (table.waits, table.timeouts, table.deadlocks) == (1, 1, 0)
    table.acquire("t2", "r2", LockMode.WRITE)
    waiter = threading.Thread(target=table.acquire, args=("t1", "r2", LockMode.WRITE, 5.0))
    waiter.start()
    deadline = time.monotonic() + 5
    while table.waits < 2:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    with pytest.raises(Deadlock):
        table.acquire("t2", "r1", LockMode.WRITE, timeout=5.0)
    table.release_all("t2")
    waiter.join(5)
    assert (table.waits, table.timeouts, table.deadlocks) == (2, 1, 1)


@pytest.fixture
def db(tmp_path: Path) -> Any:
    database = nonstop.open(str(tmp_path / "store"))
    try:
        yield database
    finally:
        database.close()


def stand_in_runtime(db: Any) -> Any:
    """What the collector reads of a runtime, without the cluster machine."""
    return SimpleNamespace(
        router=SimpleNamespace(data=None, db=db),
        machine=None,
        stats={"commits": 4, "commit_us": 2_000_000, "received": 7},
    )


def test_collector_reads_group_commit_and_locks_of_a_store(db: Any) -> None:
    registry = node_registry(stand_in_runtime(db), DataObserver(BOUNDS))
    before = scrape(registry)
    for i in range(5):
        with db.transaction() as tx:
            tx.create(Account, number=f"m{i}", owner="o", balance=i)
    after = scrape(registry)
    grew = value(after, "nonstop_group_commit_write_sets")
    was = value(before, "nonstop_group_commit_write_sets")
    assert grew - was == 5
    sizes = "nonstop_group_commit_batch_size"
    assert value(after, sizes, sizes + "_count") == value(after, "nonstop_group_commit_batches")
    assert value(after, sizes, sizes + "_sum") == grew
    fsync = "nonstop_group_commit_write_seconds"
    assert value(after, fsync, fsync + "_count") >= 5 and value(after, fsync, fsync + "_sum") > 0
    assert value(after, "nonstop_cluster_store_commit_seconds") == pytest.approx(2.0)
    assert value(after, "nonstop_runtime_events", event="received")
    assert "process_cpu_seconds" in after, "the library's process collector"
    db.engine.locks.acquire("t1", "r", LockMode.WRITE)
    with pytest.raises(LockTimeout):
        db.engine.locks.acquire("t2", "r", LockMode.WRITE, timeout=0.01)
    later = scrape(registry)
    assert value(later, "nonstop_lock_waits") == 1
    assert value(later, "nonstop_lock_timeouts") == 1


def test_collector_without_services_still_answers() -> None:
    runtime = SimpleNamespace(router=None, machine=None, stats={})
    families = scrape(node_registry(runtime, DataObserver(BOUNDS), process=False))
    assert value(families, "nonstop_transactions_committed") == 0
    assert value(families, "nonstop_cluster_peers", state="Up") == 0
    assert "nonstop_group_commit_batches" not in families


async def http(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return lines[0], headers, body


def test_http_endpoint_serves_text_and_openmetrics_and_refuses_the_rest() -> None:
    runtime = SimpleNamespace(router=None, machine=None, stats={})
    registry = node_registry(runtime, DataObserver(BOUNDS), process=False)

    async def main() -> None:
        server = await serve_metrics(registry, "127.0.0.1:0")
        try:
            port = server.port
            status, headers, body = await http(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert status == "HTTP/1.1 200 OK"
            assert headers["content-type"].startswith("text/plain; version=0.0.4")
            assert int(headers["content-length"]) == len(body)
            names = {f.name for f in text_string_to_metric_families(body.decode())}
            assert "nonstop_transactions_committed" in names
            accept = b"Accept: application/openmetrics-text; version=1.0.0\r\n"
            status, headers, body = await http(
                port, b"GET /metrics HTTP/1.1\r\n" + accept + b"\r\n"
            )
            assert headers["content-type"].startswith("application/openmetrics-text")
            assert body.endswith(b"# EOF\n")
            status, headers, body = await http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
            assert status.endswith("200 OK") and body == b"" and int(headers["content-length"]) > 0
            assert (await http(port, b"GET /../etc/passwd HTTP/1.1\r\n\r\n"))[0].endswith(
                "404 Not Found"
            )
            assert (await http(port, b"POST /metrics HTTP/1.1\r\n\r\n"))[0].endswith(
                "405 Method Not Allowed"
            )
            assert (await http(port, b"hello\r\n\r\n"))[0].endswith("400 Bad Request")
            huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
            assert (await http(port, huge))[0].endswith("400 Bad Request")
            assert server.scrapes == 3
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_failing_collector_is_a_500_and_the_server_goes_on() -> None:
    class Broken:
        def collect(self) -> Any:
            raise RuntimeError("broken")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Broken())  # type: ignore[arg-type]

    async def main() -> None:
        server = await serve_metrics(registry, "127.0.0.1:0")
        try:
            for _ in range(2):
                status, _, _ = await http(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
                assert status.endswith("500 Internal Server Error")
        finally:
            await server.stop()

    asyncio.run(main())


def test_partition_counts_when_the_machine_has_a_partition_table() -> None:
    def part(state: str, active: str | None, copying: list[str]) -> Any:
        return SimpleNamespace(state=state, active=active, copying=copying)

    table = SimpleNamespace(
        partitions={
            "p1": part("Active", "A", []),
            "p2": part("Active", "B", ["A"]),
            "p3": part("Migrating", "A", []),
        }
    )
    node = SimpleNamespace(raft=None, name="A", partition_table=table)
    runtime = SimpleNamespace(router=None, machine=SimpleNamespace(cluster=node), stats={})
    parsed = scrape(node_registry(runtime, DataObserver(BOUNDS), process=False))
    assert value(parsed, "nonstop_partitions", state="Active") == 2
    assert value(parsed, "nonstop_partitions", state="Migrating") == 1
    assert value(parsed, "nonstop_partitions", state="Unavailable") == 0
    assert value(parsed, "nonstop_partitions_active_here") == 2
    assert value(parsed, "nonstop_partitions_copying_here") == 1
    without = scrape(node_registry(SimpleNamespace(), DataObserver(BOUNDS), process=False))
    assert "nonstop_partitions" not in without


def test_collector_is_a_prometheus_collector() -> None:
    runtime = SimpleNamespace(router=None, machine=None, stats={})
    families = list(NodeCollector(runtime, DataObserver(BOUNDS)).collect())
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "each family once"
    assert all(n.startswith("nonstop_") for n in names)


def test_connection_limits_are_exported() -> None:
    from nonstop.runtime.limits import CLIENT, ConnectionBounds

    bounds = ConnectionBounds()
    bounds.refusals.budget_exceeded = 3
    bounds.refusals.idle_timeout = 1
    bounds._counts[CLIENT] = 2  # as if two clients were connected
    bounds.budget.take(1000)
    runtime = SimpleNamespace(router=None, machine=None, stats={}, bounds=bounds)
    got = scrape(node_registry(runtime, DataObserver(BOUNDS), process=False))
    assert value(got, "nonstop_connection_refusals", reason="budget_exceeded") == 3
    assert value(got, "nonstop_connection_refusals", reason="idle_timeout") == 1
    assert value(got, "nonstop_connection_refusals", reason="slow_sender") == 0
    assert value(got, "nonstop_connections", state="client") == 2
    assert value(got, "nonstop_buffered_bytes") == 1000
    assert value(got, "nonstop_buffer_budget_bytes") == bounds.budget.limit
