"""A node's recent metrics as a bounded ring of samples, for the console's live charts (G2, G6).

Not a second metrics system: once a second the node reads the very counters and
histograms its Prometheus collector reads (:mod:`nonstop.node.metrics`: the
:class:`~nonstop.node.metrics.DataObserver`'s commits, aborts and commit-latency
buckets; the group committer's ``CommitStats``), and keeps the *difference*
from the previous reading as one :class:`Sample`: commits/s, aborts/s, the
commit latency's p50 and p99 over that second, group commits/s and their mean
and p99 size.  A Prometheus server computes the same with ``rate()`` and
``histogram_quantile()``; the console has no Prometheus, so the node does it
for the last :data:`RING` seconds only.

With replication of partitions a sample also carries the replication lag of
each partition the node is active for: the records committed there and not yet
completed (durable here and acknowledged by every in-sync sync replica), read
from the replication machine's status, a gauge taken at the sample's moment.

Quantiles are estimated from the buckets as ``histogram_quantile`` does: the
bucket holding the rank, linearly interpolated inside it (the +Inf bucket
answers its lower bound).  A second without commits has no latency (``None``,
a gap in the chart, not a zero).

:class:`SampleRing` is plain state (readings in, samples out); :func:`sample_forever`
is the asyncio loop that feeds it on the node's event loop, where the readings
are taken between two events like a scrape's.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nonstop.node.metrics import DataObserver

log = logging.getLogger("nonstop.metrics")

RING = 300
"""Samples kept: five minutes at one a second."""
INTERVAL = 1.0


@dataclass(frozen=True)
class Reading:
    """The cumulative counters of one moment (they only grow)."""

    at: float
    commits: int
    aborts: int
    latency_bounds: tuple[float, ...]
    latency_counts: tuple[int, ...]
    groups: int
    write_sets: int
    size_bounds: tuple[float, ...]
    size_counts: tuple[int, ...]
    pending: dict[str, int] | None = None
    """Replication: per partition this node is active for, the records waiting to be
    completed (durable here and acknowledged by every in-sync sync replica); None
    without replication.  A gauge, not a counter."""


@dataclass(frozen=True)
class Sample:
    """What happened between two readings, per second and in milliseconds."""

    at: float
    commits_per_s: float
    aborts_per_s: float
    latency_p50_ms: float | None
    latency_p99_ms: float | None
    group_commits_per_s: float
    group_size_mean: float | None
    group_size_p99: float | None
    replication_pending: dict[str, int] | None = None

    def as_json(self) -> dict[str, Any]:
        extra = (
            {}
            if self.replication_pending is None
            else {"replication_pending": dict(self.replication_pending)}
        )
        return {
            **extra,
            "t": round(self.at, 3),
            "commits_per_s": round(self.commits_per_s, 3),
            "aborts_per_s": round(self.aborts_per_s, 3),
            "latency_p50_ms": _rounded(self.latency_p50_ms),
            "latency_p99_ms": _rounded(self.latency_p99_ms),
            "group_commits_per_s": round(self.group_commits_per_s, 3),
            "group_size_mean": _rounded(self.group_size_mean),
            "group_size_p99": _rounded(self.group_size_p99),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def quantile(
    q: float, bounds: Sequence[float], counts: Sequence[int], lowest: float = 0.0
) -> float | None:
    """The ``q`` quantile of a histogram of per-bucket ``counts`` (``len(bounds) + 1``,
    the last: +Inf), interpolated inside its bucket like Prometheus's
    ``histogram_quantile``; ``lowest`` is the first bucket's lower end; None without
    observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if count > 0 and seen + count >= rank:
            if i >= len(bounds):  # +Inf: the highest finite bound is all we know
                return float(bounds[-1]) if bounds else None
            lower = lowest if i == 0 else float(bounds[i - 1])
            return lower + (float(bounds[i]) - lower) * (rank - seen) / count
        seen += count
    return float(bounds[-1]) if bounds else None


def _delta(new: Sequence[int], old: Sequence[int]) -> list[int]:
    if len(new) != len(old):
        return list(new)
    return [max(0, a - b) for a, b in zip(new, old, strict=True)]


class SampleRing:
    """The last ``capacity`` samples of one node (module doc)."""

    def __init__(self, capacity: int = RING) -> None:
        self.samples: collections.deque[Sample] = collections.deque(maxlen=capacity)
        self._last: Reading | None = None

    def add(self, reading: Reading) -> Sample | None:
        """Take a reading; the sample since the previous one (None for the first)."""
        last, self._last = self._last, reading
        if last is None:
            return None
        seconds = reading.at - last.at
        if seconds <= 0:
            return None
        latency = _delta(reading.latency_counts, last.latency_counts)
        sizes = _delta(reading.size_counts, last.size_counts)
        groups = max(0, reading.groups - last.groups)
        write_sets = max(0, reading.write_sets - last.write_sets)
        p50 = quantile(0.5, reading.latency_bounds, latency)
        p99 = quantile(0.99, reading.latency_bounds, latency)
        sample = Sample(
            at=reading.at,
            commits_per_s=max(0, reading.commits - last.commits) / seconds,
            aborts_per_s=max(0, reading.aborts - last.aborts) / seconds,
            latency_p50_ms=None if p50 is None else p50 * 1000,
            latency_p99_ms=None if p99 is None else p99 * 1000,
            group_commits_per_s=groups / seconds,
            group_size_mean=write_sets / groups if groups else None,
            group_size_p99=quantile(0.99, reading.size_bounds, sizes, lowest=1.0),
            replication_pending=reading.pending,
        )
        self.samples.append(sample)
        return sample

    def rows_after(self, moment: float) -> list[dict[str, Any]]:
        """The samples taken after ``moment`` (epoch seconds) as JSON rows, oldest first.

        Safe from another thread than the one adding: the ring is copied in one C call
        first (iterating a deque that grows meanwhile would raise).  Compared on the
        rows' rounded ``t``, the value a client sends back as ``since``, so the last
        sample it has is not answered again."""
        rows = [s.as_json() for s in list(self.samples)]
        return [row for row in rows if row["t"] > moment]


def read(runtime: Any, observer: DataObserver, clock: Callable[[], float] = time.time) -> Reading:
    """The counters of ``runtime``'s node now: the same sources as ``NodeCollector``."""
    from nonstop.store.group_commit import GROUP_SIZE_BUCKETS

    engine = getattr(getattr(getattr(runtime, "router", None), "db", None), "engine", None)
    stats = getattr(getattr(engine, "committer", None), "stats", None)
    latency = observer.latency
    return Reading(
        at=clock(),
        commits=observer.commits,
        aborts=sum(observer.aborts.values()),
        latency_bounds=latency.bounds,
        latency_counts=tuple(latency.counts),
        groups=int(getattr(stats, "groups", 0)),
        write_sets=int(getattr(stats, "commits", 0)),
        size_bounds=tuple(float(b) for b in GROUP_SIZE_BUCKETS),
        size_counts=tuple(getattr(stats, "group_sizes", ()) or ()),
        pending=replication_pending(getattr(runtime, "machine", None)),
    )


def replication_pending(machine: Any) -> dict[str, int] | None:
    """Per partition this node is active for, the records not yet completed, read from
    the replicating machine's status (``streams[p].pending``); None without replication."""
    status_of = getattr(machine, "replication_status", None)
    if not callable(status_of):
        return None
    streams = (status_of().get("replication") or {}).get("streams") or {}
    return {str(p): int(s.get("pending", 0)) for p, s in sorted(streams.items())}


async def sample_forever(
    ring: SampleRing, take: Callable[[], Reading], interval: float = INTERVAL
) -> None:
    """Feed ``ring`` a reading every ``interval`` seconds until cancelled; a failed
    reading is skipped (the first one logged), it never ends the sampling."""
    failed = False
    while True:
        try:
            ring.add(take())
        except Exception:
            if not failed:
                log.exception("metric sample failed (further failures are not logged)")
            failed = True
        await asyncio.sleep(interval)


__all__ = [
    "RING",
    "Reading",
    "Sample",
    "SampleRing",
    "quantile",
    "read",
    "replication_pending",
    "sample_forever",
]
