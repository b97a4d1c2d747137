"""The console's views of a node without a node process (G2, G6).

The samples ring (nonstop.node.metrics_samples) turns readings of the counters
the metrics endpoint reads into per-second samples; the log tail
(nonstop.node.log_tail) reads the end of a JSON-lines log with ``nonstop logs``'s
reader; the admin API's routes (nonstop.adminapi.views) check who asks and bound
what is asked.  The browser's view of a real node is
tests/cluster/test_console_browser.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.unit.test_adminapi import COMMANDS, GRANTS, KEY, basic, check_password, roles_of

from nonstop.adminapi.app import build_app
from nonstop.adminapi.principal import Directory
from nonstop.adminapi.tokens import SessionTokens
from nonstop.adminapi.views import NodeViews
from nonstop.commands.context import CommandContext
from nonstop.node.log_tail import MAX_MESSAGE, tail_events
from nonstop.node.metrics import DataObserver, attach
from nonstop.node.metrics_samples import Reading, SampleRing, quantile, read, sample_forever

LATENCY = (0.001, 0.01, 0.1)
SIZES = (1.0, 2.0, 4.0)


def reading(
    at: float,
    commits: int = 0,
    aborts: int = 0,
    latency: tuple[int, ...] = (0, 0, 0, 0),
    groups: int = 0,
    write_sets: int = 0,
    sizes: tuple[int, ...] = (0, 0, 0, 0),
) -> Reading:
    return Reading(at, commits, aborts, LATENCY, latency, groups, write_sets, SIZES, sizes)


# ------------------------------------------------------------------ samples
def test_quantile_interpolates_inside_the_bucket_like_prometheus() -> None:
    # 10 observations in (0.001, 0.01]: the median is halfway through that bucket.
    assert quantile(0.5, LATENCY, [0, 10, 0, 0]) == pytest.approx(0.0055)
    # 99 fast, 1 slow: p99 is the end of the fast bucket, p50 half of it.
    assert quantile(0.99, LATENCY, [99, 0, 1, 0]) == pytest.approx(0.001)
    assert quantile(0.5, LATENCY, [99, 0, 1, 0]) == pytest.approx(0.001 * 50 / 99)
    assert quantile(0.99, LATENCY, [0, 0, 0, 5]) == 0.1  # +Inf: the highest finite bound
    assert quantile(0.5, LATENCY, [0, 0, 0, 0]) is None
    assert quantile(0.99, SIZES, [7, 0, 0, 0], lowest=1.0) == 1.0  # groups of one


def test_ring_turns_readings_into_rates_and_quantiles() -> None:
    ring = SampleRing()
    assert ring.add(reading(100.0)) is None  # nothing to compare with yet
    sample = ring.add(
        reading(
            102.0,
            commits=20,
            aborts=2,
            latency=(0, 22, 0, 0),
            groups=4,
            write_sets=20,
            sizes=(0, 0, 4, 0),
        )
    )
    assert sample is not None
    assert sample.commits_per_s == 10.0 and sample.aborts_per_s == 1.0
    assert sample.latency_p50_ms == pytest.approx(5.5)
    assert sample.latency_p99_ms is not None and 9.0 < sample.latency_p99_ms <= 10.0
    assert sample.group_commits_per_s == 2.0 and sample.group_size_mean == 5.0
    quiet = ring.add(
        reading(103.0, commits=20, aborts=2, latency=(0, 22, 0, 0), groups=4, write_sets=20)
    )
    assert quiet is not None and quiet.commits_per_s == 0.0
    assert quiet.latency_p50_ms is None and quiet.group_size_mean is None  # a gap, not a zero
    assert [row["t"] for row in ring.rows_after(102.5)] == [103.0]
    assert ring.rows_after(103.0) == []
    row = quiet.as_json()
    assert row["t"] == 103.0 and row["latency_p99_ms"] is None
    json.dumps(row)  # what the API answers


def test_ring_is_bounded_and_ignores_a_clock_that_went_back() -> None:
    ring = SampleRing(capacity=5)
    for i in range(20):
        ring.add(reading(float(i), commits=i))
    assert len(ring.samples) == 5 and ring.samples[-1].at == 19.0
    # A client sends back the rounded t of the last row it got: that row is not sent again.
    ring.add(reading(20.00049, commits=20))
    last = ring.rows_after(0.0)[-1]["t"]
    assert last == 20.0 and ring.rows_after(last) == []
    assert ring.add(reading(10.0, commits=30)) is None
    assert len(ring.samples) == 5


def test_read_takes_the_collector_sources_and_the_sampler_feeds_the_ring() -> None:
    observer = DataObserver(list(LATENCY))
    for corr in range(3):
        observer.op(1, corr, "tx.commit")
        observer.reply(1, corr, {"ok": True})
    stats = SimpleNamespace(groups=2, commits=3, group_sizes=[0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
    engine = SimpleNamespace(committer=SimpleNamespace(stats=stats))
    runtime = SimpleNamespace(router=SimpleNamespace(db=SimpleNamespace(engine=engine)))
    first = read(runtime, observer, clock=lambda: 10.0)
    assert (first.commits, first.groups, first.write_sets) == (3, 2, 3)
    assert sum(first.latency_counts) == 3 and first.size_counts[1:3] == (1, 1)
    assert read(SimpleNamespace(), observer, clock=lambda: 0.0).groups == 0  # no store: zeros

    ring = SampleRing()
    clock = itertools.count(11.0)

    async def three_ticks() -> None:
        task = asyncio.ensure_future(
            sample_forever(ring, lambda: read(runtime, observer, lambda: next(clock)), 0.01)
        )
        while len(ring.samples) < 2:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(asyncio.wait_for(three_ticks(), 5))
    ats = [s.at for s in ring.samples]
    assert ats[:2] == [12.0, 13.0]  # the first reading (11.0) only starts the ring
    assert all(s.commits_per_s == 0.0 for s in ring.samples)  # nothing new since


def test_attach_is_shared_by_the_metrics_endpoint_and_the_console() -> None:
    service = SimpleNamespace(observer=None)
    notifiers: list[str] = []
    runtime = SimpleNamespace(
        router=SimpleNamespace(data=service), add_notifier=lambda kind, _f: notifiers.append(kind)
    )
    first = attach(runtime, list(LATENCY))
    assert attach(runtime, list(LATENCY)) is first and service.observer is first
    assert notifiers == ["node_state", "quorum", "leader"]  # hooked once


# ------------------------------------------------------------------ log tail
def event_line(i: int, level: str = "INFO", message: str = "") -> str:
    return json.dumps(
        {
            "time": f"2026-11-26T10:00:{i % 60:02d}.000000Z",
            "node": "A",
            "level": level,
            "logger": "nonstop.node",
            "message": message or f"event {i}",
        }
    )


def test_tail_returns_the_newest_events_filtered_and_bounded(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    lines = [event_line(i, "WARNING" if i % 10 == 0 else "INFO") for i in range(200)]
    lines.append(event_line(200, "ERROR", "it broke"))
    lines.append("Traceback (most recent call last):")
    lines.append(event_line(201, "INFO", "x" * (MAX_MESSAGE + 50)))
    log.write_text("\n".join(lines) + "\n")

    out = tail_events(log, "A", limit=3)
    assert out["available"] is True
    assert [e["message"][:8] for e in out["events"]] == ["event 19", "it broke", "x" * 8]
    assert out["events"][1]["exc"] == "Traceback (most recent call last):"
    assert len(out["events"][2]["message"]) == MAX_MESSAGE + 1  # cut, with an ellipsis

    warnings = tail_events(log, "A", level="warning", limit=500)["events"]
    assert [e["level"] for e in warnings].count("ERROR") == 1
    assert all(e["level"] in ("WARNING", "ERROR") for e in warnings) and len(warnings) == 21
    assert [e["message"] for e in tail_events(log, "A", contains="event 15")["events"]] == [
        "event 15",
        "event 150",
        "event 151",
        "event 152",
        "event 153",
        "event 154",
        "event 155",
        "event 156",
        "event 157",
        "event 158",
        "event 159",
    ]
    assert len(tail_events(log, "A", limit=10_000)["events"]) == 202  # capped at 500 anyway


def test_tail_reads_only_the_end_of_the_file(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_text("\n".join(event_line(i) for i in range(1000)) + "\n")
    window = len(event_line(999)) * 3 + 10  # three lines and a piece of a fourth
    events = tail_events(log, "A", limit=500, tail_bytes=window)["events"]
    assert [e["message"] for e in events] == ["event 997", "event 998", "event 999"]


def test_tail_without_a_file_says_why(tmp_path: Path) -> None:
    assert "stderr" in tail_events(None, "A")["reason"]
    missing = tail_events(tmp_path / "none.log", "A")
    assert missing["available"] is False and missing["events"] == []
    with pytest.raises(ValueError, match="unknown level"):
        tail_events(tmp_path / "none.log", "A", level="LOUD")


# ------------------------------------------------------------------ the routes
def make_api(views: NodeViews | None) -> TestClient:
    return TestClient(
        build_app(
            COMMANDS,
            Directory(check_password, roles_of),
            SessionTokens(KEY, 60.0),
            lambda: CommandContext(addresses=["127.0.0.1:1"]),
            lambda roles, perm: any(perm in GRANTS.get(r, set()) for r in roles),
            views=views,
        )
    )


def test_samples_need_status_and_logs_need_admin_and_both_are_bounded() -> None:
    asked: list[Any] = []

    def samples(since: float) -> dict[str, Any]:
        asked.append(since)
        return {"node": "A", "samples": [{"t": since + 1}]}

    def logs(level: str | None, limit: int, contains: str) -> dict[str, Any]:
        asked.append((level, limit, contains))
        return {"available": True, "events": []}

    api = make_api(NodeViews(samples=samples, logs=logs))
    monitor, admin = basic("mo", "pw-mo"), basic("ann", "pw-ann")
    assert api.get("/api/v1/samples").status_code == 401
    assert api.get("/api/v1/logs").status_code == 401
    r = api.get("/api/v1/samples?since=5.5", headers=monitor)
    assert (r.status_code, r.json()["samples"]) == (200, [{"t": 6.5}])
    r = api.get("/api/v1/logs", headers=monitor)
    assert r.status_code == 403 and "'admin'" in r.json()["detail"]
    r = api.get("/api/v1/logs?level=WARNING&limit=7&contains=peer", headers=admin)
    assert r.status_code == 200 and asked[-1] == ("WARNING", 7, "peer")
    for bad in (
        "/api/v1/logs?limit=501",
        "/api/v1/logs?limit=0",
        "/api/v1/logs?level=LOUD",
        "/api/v1/logs?contains=" + "x" * 201,
        "/api/v1/samples?since=-1",
        "/api/v1/samples?since=soon",
    ):
        assert api.get(bad, headers=admin).status_code == 422, bad
    assert asked == [5.5, ("WARNING", 7, "peer")]  # nothing refused reached the node


def test_without_views_there_are_no_such_routes() -> None:
    api = make_api(None)
    assert api.get("/api/v1/samples", headers=basic("ann", "pw-ann")).status_code == 404


def test_node_views_read_the_nodes_ring_and_log_file(tmp_path: Path) -> None:
    from nonstop.node.admin_http import node_views
    from nonstop.node.config import NodeConfig

    service = SimpleNamespace(observer=None)
    runtime = SimpleNamespace(router=SimpleNamespace(data=service), add_notifier=lambda *_: None)
    log = tmp_path / "node.log"
    log.write_text(event_line(1, "WARNING", "peer B is Down") + "\n" + event_line(2) + "\n")
    cfg = NodeConfig(name="A", data=str(tmp_path / "data"), log_file=str(log))
    views, ring, take = node_views(runtime, cfg)
    assert isinstance(service.observer, DataObserver)  # hooked for the samples
    ring.add(take())
    service.observer.op(1, 7, "tx.commit")
    service.observer.reply(1, 7, {"ok": True})
    time.sleep(0.01)  # the reading's clock is the wall clock: let it move
    ring.add(take())
    answer = views.samples(0.0)
    assert answer["node"] == "A" and answer["capacity"] == 300
    assert [row["commits_per_s"] > 0 for row in answer["samples"]] == [True]
    assert [e["message"] for e in views.logs("WARNING", 10, "")["events"]] == ["peer B is Down"]
    no_file = node_views(runtime, NodeConfig(name="A", data=str(tmp_path)))[0]
    assert no_file.logs(None, 10, "")["available"] is False
