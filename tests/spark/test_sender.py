"""NodeSenders (spark/sender.py): nodes at once, each node's batches in order, nothing
sent to a node after one of its batches failed."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from nonstop.errors import Unavailable
from nonstop.spark.sender import NodeSenders


def test_each_node_in_order_and_the_nodes_at_once() -> None:
    log: list[tuple[str, int]] = []
    lock = threading.Lock()

    def send(node: str, i: int) -> Any:
        time.sleep(0.1)
        with lock:
            log.append((node, i))
        return {"node": node, "i": i}

    s = NodeSenders(depth=2)
    start = time.monotonic()
    for i in range(4):
        for node in ("a", "b", "c"):
            s.submit(node, lambda node=node, i=i: send(node, i))
    s.finish()
    took = time.monotonic() - start
    s.close()
    assert took < 0.9, took  # in turn it would take 12 x 0.1 s
    for node in ("a", "b", "c"):
        assert [i for n, i in log if n == node] == [0, 1, 2, 3]
    assert sorted((r["node"], r["i"]) for r in s.results) == sorted(log) and len(log) == 12


def test_after_a_failure_nothing_more_goes_to_that_node() -> None:
    sent: list[tuple[str, int]] = []

    def send(node: str, i: int) -> None:
        if node == "a" and i == 1:
            raise Unavailable("node a went away")
        time.sleep(0.02)
        sent.append((node, i))

    s = NodeSenders(depth=10)
    with pytest.raises(Unavailable, match="node a went away"):
        for i in range(5):
            for node in ("a", "b"):
                s.submit(node, lambda node=node, i=i: send(node, i))
        s.finish()
    s.close()
    assert [i for n, i in sent if n == "a"] == [0]  # 2, 3, 4 never sent
    b = [i for n, i in sent if n == "b"]  # the task fails: b's queue may be cut short,
    assert b == list(range(len(b))) and b  # but never out of order


def test_a_failure_surfaces_while_submitting_and_close_drops_the_rest() -> None:
    sent: list[int] = []

    def send(i: int) -> None:
        if i == 0:
            raise Unavailable("down")
        time.sleep(0.05)
        sent.append(i)

    s = NodeSenders(depth=1)
    with pytest.raises(Unavailable):
        for i in range(100):  # depth 1: the second submit waits for the first: raises
            s.submit("a", lambda i=i: send(i))
    s.close()
    assert sent == []
