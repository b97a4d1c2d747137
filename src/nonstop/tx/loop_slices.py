"""Cleanup too long for one step of a node's event loop, run a slice per loop turn.

A transaction that ends holding hundreds of thousands of locks and entries (an
overwrite's swap: ~400,000 at 200,000 rows) took 0.4-1.2 s to release them in
one step, on the loop (an abort) or on the store's writer thread holding the
lock table's mutex (a commit's phase two), which the loop then waited for: the
peers' failure detectors (timeout 0.5 s) saw the node ``Down`` (data-path.md
§6.8).  Such work is a *step* function -- do a bounded slice (~10 ms), return
True once all is done -- handed to :meth:`SliceRunner.run`:

* with a *home* loop (the node's, :meth:`SliceRunner.home`), one call per turn
  of that loop, from whichever thread hands it over: keep-alives, other
  clients' ops and replication run between slices, and the store's writer
  thread goes back to committing at once;
* without one (an embedded database, or the loop gone), every slice at once in
  the caller's thread -- as before, except that whatever a step locks is free
  between slices (the lock table's mutex: other threads get in).

Nothing here is a protocol decision: a step must leave a state other threads
may see between any two slices (for the locks: those not yet released are
still held by the ended transaction, as if it had not ended yet).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

__all__ = ["SliceRunner", "Step"]

Step = Callable[[], bool]
"""One slice of the work; True once nothing is left to do."""


class _Job:
    __slots__ = ("done", "step")

    def __init__(self, step: Step) -> None:
        self.step = step
        self.done = False


class SliceRunner:
    """Runs steps a slice per turn of a home loop, or at once without one (module doc)."""

    __slots__ = ("_loop", "_mutex", "_pending")

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._mutex = threading.Lock()
        self._pending: set[_Job] = set()

    def home(self, loop: asyncio.AbstractEventLoop | None) -> None:
        """Run later steps on ``loop`` (the node's, from its start); None (the node
        stops: call it on that loop's thread) finishes every pending step here, now."""
        with self._mutex:
            self._loop = loop
            if loop is not None:
                return
            pending, self._pending = self._pending, set()
        for job in pending:
            _finish(job)

    def run(self, step: Step) -> None:
        """Call ``step`` until it returns True: once per turn of the home loop, or every
        call now in this thread without one.  Safe from any thread."""
        job = _Job(step)
        with self._mutex:
            loop = self._loop
            if loop is not None:
                self._pending.add(job)
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._turn, job, loop)
                return
            except RuntimeError:  # the loop is closed: nobody would run it
                with self._mutex:
                    self._pending.discard(job)
        _finish(job)

    def pending(self) -> int:
        """Steps handed to the home loop and not finished yet (tests, diagnostics)."""
        with self._mutex:
            return len(self._pending)

    def _turn(self, job: _Job, loop: asyncio.AbstractEventLoop) -> None:
        if job.done:  # finished by home(None)
            return
        job.done = job.step()
        if job.done:
            with self._mutex:
                self._pending.discard(job)
        else:
            loop.call_soon(self._turn, job, loop)


def _finish(job: _Job) -> None:
    while not job.done:
        job.done = job.step()
