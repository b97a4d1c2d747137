"""Errors of the data source that Spark shows as one line at the top of its message.

Spark wraps an exception raised by a Python data source while it plans a read
or a write (``schema``, ``reader``, ``writer``, a job's ``commit``) as
``[PYTHON_DATA_SOURCE_ERROR] Failed to ...: <the worker's formatted exception>``;
by default that is a whole traceback, so the first line the user sees says
``Traceback (most recent call last):`` and the nonstop error that names the
problem is at the bottom.  Spark formats the exception alone when the worker's
environment has ``SPARK_HIDE_TRACEBACK`` (``pyspark.util.handle_worker_exception``).

:func:`one_line` sets it when a nonstop error (an unreachable cluster, a type
the nodes do not know, a schema mismatch...) leaves a planning entry point, so
the top line reads ``[PYTHON_DATA_SOURCE_ERROR] Failed to ...:
nonstop.errors.UnknownType: node A does not know ...``; the next entry into
any of them restores the variable as it was (a planner worker may be reused).
Other exceptions (bugs) keep their traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from nonstop.errors import Error

HIDE = "SPARK_HIDE_TRACEBACK"
F = TypeVar("F", bound=Callable[..., Any])
_set_by_us = False


def one_line(fn: F) -> F:
    """Wrap a planning entry point of the data source (module doc)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _set_by_us
        if _set_by_us:
            os.environ.pop(HIDE, None)
            _set_by_us = False
        try:
            return fn(*args, **kwargs)
        except Error:
            if HIDE not in os.environ:
                os.environ[HIDE] = "1"
                _set_by_us = True
            raise

    return wrapper  # type: ignore[return-value]


__all__ = ["HIDE", "one_line"]
