"""Node log lines: one JSON object per event (the default), or plain text for a terminal.

Every line of a node's log (``DATA/node.log`` of a local cluster) is one
:mod:`logging` record rendered by :class:`JsonLineFormatter`::

    {"time": "2026-11-26T08:43:54.711234Z", "node": "A", "level": "INFO",
     "logger": "nonstop.node", "message": "node A ... listening on ...", ...}

``time`` is UTC with microseconds (ISO 8601, sortable as text and parsed by
``nonstop logs``); ``node`` the node's name; ``level``, ``logger`` and
``message`` the record's.  Structured fields follow: whatever a call passes as
``extra={...}`` (``log.info("joined", extra={"view": 3})`` gives ``"view": 3``),
and ``exc`` with the formatted traceback when there is one.  A value JSON
cannot hold is written as its ``repr``.

The formatter is the standard library's :class:`logging.Formatter` with
:func:`json.dumps`; no logging library is needed for so little, and the field
names stay ours (``nonstop logs`` and the tests rely on them).
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

JSON = "json"
TEXT = "text"

REQUIRED_FIELDS = ("time", "node", "level", "logger", "message")
"""The fields every JSON line has, in this order."""

_RECORD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
"""Attributes every :class:`logging.LogRecord` has: anything else came from ``extra``."""


def utc_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class JsonLineFormatter(logging.Formatter):
    """A record → one JSON line with :data:`REQUIRED_FIELDS` and the record's extras."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "time": utc_time(record.created),
            "node": self.node,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and key not in event:
                event[key] = value
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            event["exc"] = record.exc_text
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return json.dumps(event, default=repr, ensure_ascii=False)


def text_formatter(node: str) -> logging.Formatter:
    """Plain, greppable lines: time, level, node, logger, message."""
    return logging.Formatter(f"%(asctime)s %(levelname)s {node} %(name)s: %(message)s")


def formatter(kind: str, node: str) -> logging.Formatter:
    """The formatter of the ``log_format`` config key (``json`` or ``text``)."""
    return JsonLineFormatter(node) if kind == JSON else text_formatter(node)


__all__ = ["JSON", "REQUIRED_FIELDS", "TEXT", "JsonLineFormatter", "formatter", "utc_time"]
