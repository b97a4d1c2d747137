"""The event-loop lag monitor (runtime/loop_lag.py): what it counts, when it warns."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from nonstop.runtime.loop_lag import LoopLagMonitor

pytestmark = pytest.mark.timeout(30)


def test_lags_are_counted_in_buckets_and_only_late_ones_warn(caplog):
    now = [0.0]
    lag = LoopLagMonitor(
        warn_after=0.2, warn_every=1.0, bounds=(0.01, 0.1, 0.5), clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger="nonstop.runtime.loop"):
        for value in (0.001, 0.05, 0.3, 0.7, -0.002):
            lag.observe(value)
        now[0] = 0.5
        lag.observe(0.4)  # within warn_every of the last line: held back, counted
        now[0] = 1.5
        lag.observe(0.25)
    assert lag.counts == [2, 1, 3, 1]
    assert lag.samples == 7 and lag.over == 4
    assert lag.worst == pytest.approx(0.7)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "event loop blocked for 0.300 s (warning above 0.200 s)",
        "event loop blocked for 0.250 s (warning above 0.200 s; 2 more over it in the last 1 s)",
    ]
    assert lag.take_recent_worst() == pytest.approx(0.7)
    assert lag.take_recent_worst() == 0.0


def test_a_blocking_callback_is_measured():
    async def main() -> LoopLagMonitor:
        lag = LoopLagMonitor(interval=0.01, warn_after=10.0)
        lag.start()
        await asyncio.sleep(0.03)
        time.sleep(0.15)  # the loop is blocked: the monitor wakes late
        await asyncio.sleep(0.03)
        lag.stop()
        return lag

    lag = asyncio.run(main())
    assert lag.worst >= 0.12
    assert lag.snapshot()["samples"] >= 2
