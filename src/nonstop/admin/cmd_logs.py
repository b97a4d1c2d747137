"""``nonstop logs``: the merged log of every node of a local cluster (or of given files).

Reads each node's ``DIR/<name>/node.log`` (JSON lines, or text lines of a node
with ``log_format = "text"``), merges them by time and prints one event per
line: ``--json`` prints the events as JSON lines (text lines converted),
``--node``, ``--level``, ``--since`` and ``--until`` filter, ``-f`` keeps
reading what the nodes append (polling the files; events arriving in the same
poll are printed in time order).  The reading and merging is
:mod:`nonstop.node.log_events`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import click

from nonstop.admin.local import DEFAULT_DIR, LocalCluster
from nonstop.admin.output import USAGE, fail
from nonstop.node.log_events import (
    LEVELS,
    LogEvent,
    LogFilter,
    merge,
    merged_logs,
    parse_when,
    read_events,
)

POLL_SECONDS = 0.25


def log_files(folder: str | None, files: tuple[str, ...]) -> dict[str, Path]:
    """Node name → log file: the given files (named by their folder), else the local cluster's."""
    if files:
        out: dict[str, Path] = {}
        for raw in files:
            path = Path(raw)
            name = path.parent.name if path.name == "node.log" else path.stem
            while name in out:
                name += "'"
            out[name] = path
        return out
    lc = LocalCluster(folder or DEFAULT_DIR)
    layout = lc.load()
    if layout is None:
        fail(
            f"no local cluster in {lc.dir}: pass --dir of a local cluster folder or log files",
            USAGE,
        )
    return lc.log_files(layout)


def show(as_json: bool) -> Callable[[LogEvent], None]:
    def emit(event: LogEvent) -> None:
        if as_json:
            click.echo(json.dumps(event.as_json(), ensure_ascii=False, default=str))
        else:
            click.echo(event.text())

    return emit


class Follower:
    """Reads what is appended to the log files, whole lines only (``-f``)."""

    def __init__(self, files: dict[str, Path], keep: LogFilter) -> None:
        self.keep = keep
        self.files = {n: p for n, p in files.items() if not keep.nodes or n in keep.nodes}
        self.handles: dict[str, TextIO] = {}
        self.partial: dict[str, str] = {}

    def poll(self) -> list[LogEvent]:
        """The new events of every file since the last poll, merged by time."""
        streams = []
        for node, path in self.files.items():
            fh = self.handles.get(node)
            if fh is None:
                try:
                    fh = self.handles[node] = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
                except OSError:
                    continue  # not there yet: a node still starting
            text = self.partial.pop(node, "") + fh.read()
            lines = text.split("\n")
            if lines[-1]:
                self.partial[node] = lines[-1]  # not a whole line yet
            streams.append([e for e in read_events(lines[:-1], node) if self.keep(e)])
        return list(merge(streams))

    def close(self) -> None:
        for fh in self.handles.values():
            fh.close()


@click.command("logs")
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--dir", "folder", help=f"Local cluster folder (default {DEFAULT_DIR}).")
@click.option("--node", "nodes", multiple=True, help="Only this node; repeatable.")
@click.option(
    "--level",
    type=click.Choice([name.lower() for name in LEVELS], case_sensitive=False),
    help="Only events of this level or above.",
)
@click.option("--since", help="From this time: ISO 8601 (local time unless zoned) or 15m, 2h...")
@click.option("--until", help="Up to this time (same forms as --since).")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (one event per line).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what the nodes log.")
def logs(
    files: tuple[str, ...],
    folder: str | None,
    nodes: tuple[str, ...],
    level: str | None,
    since: str | None,
    until: str | None,
    as_json: bool,
    follow: bool,
) -> None:
    """The merged log of every node of a local cluster (or of FILES), ordered by time."""
    try:
        keep = LogFilter(
            nodes=frozenset(nodes),
            level=level,
            since=None if since is None else parse_when(since),
            until=None if until is None else parse_when(until),
        )
    except ValueError as exc:
        fail(str(exc), USAGE)
    paths = log_files(folder, files)
    unknown = sorted(set(nodes) - set(paths))
    if unknown:
        fail(f"no log of node(s) {', '.join(unknown)} (there are: {', '.join(paths)})", USAGE)
    emit = show(as_json)
    if not follow:
        for event in merged_logs(paths, keep):
            emit(event)
        return
    follower = Follower(paths, keep)
    try:
        while True:
            for event in follower.poll():
                emit(event)
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        pass
    finally:
        follower.close()


__all__ = ["Follower", "log_files", "logs"]
