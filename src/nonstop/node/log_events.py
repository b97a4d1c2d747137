"""Reading node logs: lines → events, several files merged by time, filters (``nonstop logs``).

A node writes one event per line (:mod:`nonstop.node.log_format`): a JSON
object by default, or a plain text line (``log_format = "text"``).  Both are
read here into :class:`LogEvent`; a text line that does not start an event (a
traceback's) belongs to the event before it.  Each file is in time order, so
merging is a k-way merge (:func:`heapq.merge`) that reads every file once,
lazily; equal times keep the files' order.

Times: JSON lines carry UTC (``...Z``); text lines carry the node's local time
without a zone, read as this machine's local time (the node ran here).
``--since``/``--until`` take an ISO 8601 time (no zone: local time) or a
duration back from now (``90s``, ``15m``, ``2h``, ``1d``).
"""

from __future__ import annotations

import datetime
import heapq
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "ERROR": 40, "CRITICAL": 50}
_TEXT_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ([A-Z]+) (\S+) ([^\s:]+): (.*)$", re.DOTALL
)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_CORE = ("time", "node", "level", "logger", "message")


@dataclass
class LogEvent:
    """One event of a node's log."""

    time: float
    """Seconds since the epoch."""
    node: str
    level: str
    logger: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)
    """The structured fields beyond the five above (JSON lines only)."""
    raw: str = ""
    """The line(s) as written."""

    def as_json(self) -> dict[str, Any]:
        """The event as a JSON line's object (text lines are converted)."""
        return {
            "time": iso_utc(self.time),
            "node": self.node,
            "level": self.level,
            "logger": self.logger,
            "message": self.message,
            **self.fields,
        }

    def text(self) -> str:
        """A terminal line: local time, node, level, logger, message (and a traceback)."""
        stamp = datetime.datetime.fromtimestamp(self.time).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
        line = f"{stamp} {self.node:<4} {self.level:<7} {self.logger}: {self.message}"
        exc = self.fields.get("exc")
        return f"{line}\n{exc}" if isinstance(exc, str) else line


def iso_utc(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, tz=datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ"
    )


def parse_iso(text: str) -> float:
    """An ISO 8601 time → epoch seconds (``Z`` or an offset: that zone; none: local time)."""
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment.timestamp()


def parse_when(text: str, now: float | None = None) -> float:
    """``--since``/``--until``: an ISO 8601 time or a duration back from ``now`` (module doc)."""
    m = _DURATION.match(text.strip())
    if m:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return parse_iso(text.strip())
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (give an ISO 8601 time like 2026-11-26T09:30:00 "
            "or a duration back from now like 15m)"
        ) from None


def parse_line(line: str, node: str = "") -> LogEvent | None:
    """A line → its event, or None when it does not start one (a continuation line)."""
    stripped = line.rstrip("\n")
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError:
            return None
        if not isinstance(obj, dict) or "time" not in obj:
            return None
        try:
            when = parse_iso(str(obj["time"]))
        except ValueError:
            return None
        return LogEvent(
            time=when,
            node=str(obj.get("node") or node),
            level=str(obj.get("level", "INFO")),
            logger=str(obj.get("logger", "")),
            message=str(obj.get("message", "")),
            fields={k: v for k, v in obj.items() if k not in _CORE},
            raw=stripped,
        )
    m = _TEXT_LINE.match(stripped)
    if m is None:
        return None
    stamp, level, name, logger, message = m.groups()
    when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return LogEvent(when, name or node, level, logger, message, raw=stripped)


def read_events(lines: Iterable[str], node: str = "") -> Iterator[LogEvent]:
    """The events of one log, in the file's order; continuation lines join their event."""
    current: LogEvent | None = None
    for line in lines:
        event = parse_line(line, node)
        if event is not None:
            if current is not None:
                yield current
            current = event
        elif current is not None and line.strip():
            extra = line.rstrip("\n")
            current.raw += "\n" + extra
            previous = current.fields.get("exc")
            current.fields["exc"] = extra if previous is None else f"{previous}\n{extra}"
    if current is not None:
        yield current


@dataclass
class LogFilter:
    """Which events to show: nodes (empty: all), least level, time range (epoch seconds)."""

    nodes: frozenset[str] = frozenset()
    level: str | None = None
    since: float | None = None
    until: float | None = None

    def __call__(self, event: LogEvent) -> bool:
        if self.nodes and event.node not in self.nodes:
            return False
        if self.level is not None and LEVELS.get(event.level, 0) < LEVELS[self.level.upper()]:
            return False
        if self.since is not None and event.time < self.since:
            return False
        return self.until is None or event.time <= self.until


def merge(streams: Iterable[Iterable[LogEvent]]) -> Iterator[LogEvent]:
    """Events of several time-ordered logs as one time-ordered stream (ties: stream order)."""
    return heapq.merge(*streams, key=lambda event: event.time)


def merged_logs(files: dict[str, Path], keep: LogFilter) -> Iterator[LogEvent]:
    """The events of ``files`` (node name → log file) that ``keep`` keeps, merged by time.

    A file that is missing (a node that never started) gives no events.
    """
    handles: list[TextIO] = []
    try:
        streams = []
        for node, path in files.items():
            if keep.nodes and node not in keep.nodes:
                continue
            try:
                fh = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
            except OSError:
                continue
            handles.append(fh)
            streams.append(e for e in read_events(fh, node) if keep(e))
        yield from merge(streams)
    finally:
        for handle in handles:
            handle.close()


__all__ = [
    "LEVELS",
    "LogEvent",
    "LogFilter",
    "merge",
    "merged_logs",
    "parse_line",
    "parse_when",
    "read_events",
]
