"""Helper threads doing bulk work run at a lower priority than the event loop's thread."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from nonstop.runtime import thread_priority
from nonstop.runtime.thread_priority import BULK_NICE, bulk_executor, bulk_nice, lower_this_thread

LINUX = sys.platform == "linux"
"""Per-thread nice values are Linux's: elsewhere nothing is lowered (and nothing asserted
lower)."""


def _nice_of(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def test_only_the_calling_thread_is_lowered() -> None:
    main = _nice_of(threading.get_native_id())
    seen: dict[str, int] = {}

    def work() -> None:
        seen["done"] = int(lower_this_thread(3))
        seen["nice"] = _nice_of(threading.get_native_id())

    t = threading.Thread(target=work)
    t.start()
    t.join(5)
    assert seen["done"] == int(LINUX)
    assert seen["nice"] == (min(19, main + 3) if LINUX else main)
    assert _nice_of(threading.get_native_id()) == main  # the caller's thread is untouched


def test_the_bulk_pool_runs_lower_than_the_thread_that_uses_it() -> None:
    main = _nice_of(threading.get_native_id())
    nice = bulk_executor().submit(lambda: _nice_of(threading.get_native_id())).result(5)
    assert nice == (min(19, main + bulk_nice()) if LINUX else main)
    assert bulk_executor() is bulk_executor()  # one pool per process


def test_the_increment_comes_from_the_environment_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NONSTOP_BULK_NICE", raising=False)
    assert bulk_nice() == BULK_NICE
    monkeypatch.setenv("NONSTOP_BULK_NICE", "0")
    assert bulk_nice() == 0
    assert lower_this_thread() is False  # 0: left as it is
    monkeypatch.setenv("NONSTOP_BULK_NICE", "99")
    assert bulk_nice() == 19
    monkeypatch.setenv("NONSTOP_BULK_NICE", "lots")
    assert bulk_nice() == BULK_NICE


def test_a_refused_change_leaves_the_thread_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError("not allowed")

    monkeypatch.setattr(thread_priority.os, "setpriority", refuse)
    assert lower_this_thread(5) is False
