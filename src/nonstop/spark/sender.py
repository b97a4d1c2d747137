"""Per-node write pipelines of a Spark task: the nodes work at once, in order each.

A task used to send a batch to one node, wait for its commit (an fsync), then
the next node: the nodes took turns and the task idled meanwhile.  Here every
node has a sender thread of its own: a node's batches still go, and commit, in
the order the task cut them (a key always has the same home, so a later row
of a key lands after an earlier one), while the other nodes commit theirs and
the task cuts the next batch.  At most ``depth`` batches per node are queued.

After a send to a node fails, the later batches for that node are not sent
(they fail with the same error): a retry of the task then applies them in
order again — their tags were never recorded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class NodeSenders:
    """One FIFO sender thread per node name; :meth:`finish` waits for all of them."""

    def __init__(self, depth: int = 2) -> None:
        self._depth = depth
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._queued: dict[str, deque[Future[Any]]] = {}
        self._failed: dict[str, BaseException] = {}
        self.results: list[Any] = []
        """Every send's return value, in completion order (read after :meth:`finish`)."""

    def submit(self, node: str, send: Callable[[], Any]) -> None:
        """Queue ``send()`` for ``node``; blocks while ``depth`` are already queued
        there, and raises a failure of an earlier send (to any node) once seen."""
        pool = self._pools.get(node)
        if pool is None:
            pool = self._pools[node] = ThreadPoolExecutor(1, f"nonstop-send-{node}")
            self._queued[node] = deque()
        queued = self._queued[node]
        while len(queued) >= self._depth:
            self.results.append(queued.popleft().result())
        queued.append(pool.submit(self._run, node, send))

    def _run(self, node: str, send: Callable[[], Any]) -> Any:
        failed = self._failed.get(node)
        if failed is not None:
            raise failed  # keep the node's order: nothing after a failed batch
        try:
            return send()
        except BaseException as exc:
            self._failed[node] = exc
            raise

    def finish(self) -> None:
        """Wait for every queued send; raise the first failure."""
        for queued in self._queued.values():
            while queued:
                self.results.append(queued.popleft().result())

    def close(self) -> None:
        """Drop what was not started, wait for what was (no send outlives the task)."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
