"""The last events of a node's own log, for the console's logs view: :func:`tail_events`.

The reader is ``nonstop logs``'s (:mod:`nonstop.node.log_events`), given only the
file's last :data:`TAIL_BYTES` (a log may be gigabytes; the console wants the
recent lines): the first, probably partial, line of that window is dropped, the
rest is read into events (continuation lines join their event), filtered by
least level and by a substring, and the newest ``limit`` are kept.  Every
bound is here: bytes read, events returned, the length of each message and of
the filter.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from typing import Any

from nonstop.node.log_events import LEVELS, LogEvent, LogFilter, read_events

TAIL_BYTES = 1 << 20
"""Bytes read from the end of the log file per request."""
MAX_LINES = 500
"""Events one request may ask for."""
MAX_MESSAGE = 2000
"""Characters of a message (and of a traceback) returned; longer ones are cut."""
MAX_FILTER = 200


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "…"


def _row(event: LogEvent) -> dict[str, Any]:
    row = event.as_json()
    row["message"] = _cut(event.message)
    exc = event.fields.get("exc")
    if isinstance(exc, str):
        row["exc"] = _cut(exc)
    return row


def tail_events(
    path: str | Path | None,
    node: str,
    level: str | None = None,
    limit: int = 100,
    contains: str = "",
    tail_bytes: int = TAIL_BYTES,
) -> dict[str, Any]:
    """The newest ``limit`` events of the log at ``path`` at ``level`` or above whose
    line contains ``contains``: ``{"available", "file", "events", "reason"?}``."""
    if level is not None and level.upper() not in LEVELS:
        raise ValueError(f"unknown level {level!r} (one of {', '.join(LEVELS)})")
    limit = max(1, min(limit, MAX_LINES))
    contains = contains[:MAX_FILTER]
    if path is None:
        return {
            "available": False,
            "file": None,
            "events": [],
            "reason": "this node logs to stderr (set log_file to see its log here)",
        }
    keep = LogFilter(level=level.upper() if level else None)
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - tail_bytes)
            fh.seek(start)
            data = fh.read(size - start)
    except OSError as exc:
        return {"available": False, "file": str(path), "events": [], "reason": exc.strerror}
    lines = data.decode("utf-8", errors="replace").splitlines()
    if start > 0 and lines:
        lines = lines[1:]  # the window began inside this line
    newest: collections.deque[dict[str, Any]] = collections.deque(maxlen=limit)
    for event in read_events(lines, node):
        if keep(event) and (not contains or contains in event.raw):
            newest.append(_row(event))
    return {"available": True, "file": str(path), "events": list(newest)}


__all__ = ["MAX_LINES", "TAIL_BYTES", "tail_events"]
