"""How late the node's event loop wakes: the measure of a blocked loop.

Everything a node does for its peers -- keep-alives, their answers, the cluster
log, other clients' requests -- runs on one event loop thread.  A step that keeps
the loop busy for longer than the failure detector's timeout makes the node look
dead to its peers (and makes its peers look dead to it), however healthy it is.
:class:`LoopLagMonitor` is a small task that asks to wake every ``interval``
seconds and measures how late it actually woke: that lateness is the longest a
ready callback (a keep-alive, a reply) had to wait behind whatever ran before it.

It keeps plain numbers (a histogram as per-bucket counts, the worst lag since the
previous scrape, the worst ever) that the metrics collector reads at scrape time
(``nonstop_event_loop_lag_seconds``), and it logs one warning line naming the lag
when it is over ``warn_after`` (half the failure detector's timeout in a node):
"event loop blocked for 0.512 s (warning above 0.200 s)".  The lines are rate
limited (one a second, counting the ones held back) so a busy node does not fill
its log with them.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("nonstop.runtime.loop")

LAG_BOUNDS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Histogram bucket bounds (seconds): from a healthy loop to one that makes peers see it Down."""


class LoopLagMonitor:
    """A periodic task measuring how late the loop wakes (module doc)."""

    def __init__(
        self,
        *,
        interval: float = 0.05,
        warn_after: float = 0.2,
        warn_every: float = 1.0,
        bounds: Sequence[float] = LAG_BOUNDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.warn_after = warn_after
        self.warn_every = warn_every
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        """Per-bucket counts of every wake-up's lag (the last bucket: above every bound)."""
        self.sum = 0.0
        self.samples = 0
        self.worst = 0.0
        """The largest lag ever measured (seconds)."""
        self.recent_worst = 0.0
        """The largest lag since :meth:`take_recent_worst` was last called."""
        self.last = 0.0
        """The lag of the latest wake-up."""
        self.over = 0
        """Wake-ups later than ``warn_after``."""
        self._clock = clock
        self._last_warning = float("-inf")
        self._held_back = 0
        self._task: asyncio.Task[None] | None = None
        self.gc_seconds = [0.0, 0.0, 0.0]
        """Seconds spent in the cyclic garbage collector, per generation (it stops the loop too)."""
        self.gc_worst = [0.0, 0.0, 0.0]
        """The longest collection of each generation."""
        self._gc_started = 0.0
        self._gc_generation = -1
        """The generation being collected now (-1: none): the stack watchdog names it."""
        self._gc_last = (-1, 0.0, 0.0)
        """(generation, seconds, when it ended) of the last collection (the watchdog's)."""
        self._woke = clock()
        """When the loop last ran this monitor (read by the stack watchdog's thread)."""
        self._watchdog: threading.Thread | None = None
        self._watchdog_stop = threading.Event()

    def observe(self, lag: float) -> None:
        """Count one wake-up ``lag`` seconds late; warn (rate limited) when it is too late."""
        lag = max(0.0, lag)
        self.counts[bisect.bisect_left(self.bounds, lag)] += 1
        self.sum += lag
        self.samples += 1
        self.last = lag
        self.worst = max(self.worst, lag)
        self.recent_worst = max(self.recent_worst, lag)
        if lag <= self.warn_after:
            return
        self.over += 1
        now = self._clock()
        if now - self._last_warning < self.warn_every:
            self._held_back += 1
            return
        held, self._held_back = self._held_back, 0
        self._last_warning = now
        more = f"; {held} more over it in the last {self.warn_every:g} s" if held else ""
        log.warning(
            "event loop blocked for %.3f s (warning above %.3f s%s)",
            lag,
            self.warn_after,
            more,
            extra={"loop_lag": round(lag, 6)},
        )

    def snapshot(self) -> dict[str, Any]:
        """The numbers, for the ``runtime_stats`` reply (seconds; ``counts`` per ``bounds``
        bucket, the last one above every bound)."""
        return {
            "samples": self.samples,
            "worst": round(self.worst, 6),
            "last": round(self.last, 6),
            "over": self.over,
            "warn_after": self.warn_after,
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "gc_seconds": [round(x, 6) for x in self.gc_seconds],
            "gc_worst": [round(x, 6) for x in self.gc_worst],
            "gc_frozen": gc.get_freeze_count(),
        }

    def take_recent_worst(self) -> float:
        """The worst lag since the previous call, and start a new period."""
        worst, self.recent_worst = self.recent_worst, 0.0
        return worst

    async def run(self) -> None:
        """Sleep ``interval``, measure how late the wake-up came, for ever."""
        clock = self._clock  # not loop.time(): uvloop's is cached per turn, in ms
        while True:
            due = clock() + self.interval
            await asyncio.sleep(self.interval)
            self._woke = now = clock()
            self.observe(now - due)

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a task of the running loop (once), and time the collector."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="loop-lag")
            if self._on_gc not in gc.callbacks:
                gc.callbacks.append(self._on_gc)
        return self._task

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._watchdog_stop.set()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # A collection of many live objects holds the loop as any long step does; its
        # time is kept apart so a lag can be told from a collection.
        generation = min(max(int(info.get("generation", 0)), 0), 2)
        if phase == "start":
            self._gc_started = time.perf_counter()
            self._gc_generation = generation
            return
        self._gc_generation = -1
        ended = time.perf_counter()
        took = ended - self._gc_started
        self._gc_last = (generation, took, ended)
        self.gc_seconds[generation] += took
        self.gc_worst[generation] = max(self.gc_worst[generation], took)

    def watch_stacks(self, after: float) -> None:
        """Diagnosis: log the loop thread's stack while it is blocked longer than ``after``.

        A thread looks every ``interval`` at when the loop last woke this monitor;
        when that is over ``warn_after`` ago it logs the loop thread's current stack
        (once per blocked stretch), and the innermost frames of every other thread (one
        of them may hold the GIL): the step that blocks, named.  Off unless asked
        for (the node's environment ``NONSTOP_LOOP_STACKS=<seconds>``): it costs a
        thread waking 20 times a second.
        """
        if self._watchdog is not None:
            return
        loop_thread = threading.get_ident()
        self._woke = self._clock()
        self._watchdog = threading.Thread(
            target=self._watch, args=(loop_thread, after), name="loop-stacks", daemon=True
        )
        self._watchdog.start()

    def _watch(self, loop_thread: int, after: float) -> None:
        reported = 0.0
        while not self._watchdog_stop.wait(self.interval):
            woke = self._woke
            if woke == reported or self._clock() - woke <= after:
                continue
            frame = sys._current_frames().get(loop_thread)
            if frame is None:
                continue
            reported = woke
            stack = "".join(traceback.format_stack(frame, limit=25))
            others = "".join(
                f"thread {ident} ({names.get(ident, '?')}):\n"
                + "".join(traceback.format_stack(f, limit=6))
                for ident, f in sys._current_frames().items()
                if ident not in (loop_thread, threading.get_ident())
                for names in [{t.ident: t.name for t in threading.enumerate()}]
            )
            collecting = self._gc_generation
            last, took, ended = self._gc_last
            gc_now = (
                f" (the GC collecting generation {collecting})"
                if collecting >= 0
                else f" (the last GC: generation {last}, {took:.3f} s, ended "
                f"{time.perf_counter() - ended:.3f} s ago)"
            )
            log.warning(
                "event loop busy for %.3f s so far%s, in:\n%s\nother threads (innermost 6):\n%s",
                self._clock() - woke,
                gc_now,
                stack,
                others,
            )


__all__ = ["LAG_BOUNDS", "LoopLagMonitor"]
