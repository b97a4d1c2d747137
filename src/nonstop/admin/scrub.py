"""``nonstop store verify PATH``: the full scrub of a node's stores (structure and checksums).

PATH is a node's data directory (both ``cluster`` and ``store`` are verified),
or one LMDB directory (an object store opened with ``nonstop.open``, or a
``cluster`` directory).  Unlike the check a node makes at start (bounded in
time), it walks everything, and cross-checks an object store's bookkeeping
(index entries against their objects, counts against extents).  It reads with
LMDB's reader lock, so it may run next to a live node; the walk runs in a
child process, so a page that crashes LMDB is reported as damage, not as the
death of the command.

Output: one line per directory (``OK`` with what was checked, or the problems),
or with ``--json`` one JSON document; exit code 0 when everything is intact,
1 when anything is damaged or missing.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import click

from nonstop.store.verify import Report, verify_isolated


def targets(path: str) -> list[str]:
    """The LMDB directories under ``path``: itself, or a data directory's parts."""
    if os.path.exists(os.path.join(path, "data.mdb")):
        return [path]
    parts = [os.path.join(path, p) for p in ("cluster", "store")]
    return [p for p in parts if os.path.exists(os.path.join(p, "data.mdb"))] or [path]


def scrub(path: str, *, seconds: float | None = None) -> list[Report]:
    """Verify every LMDB directory of ``path`` (see :func:`targets`)."""
    return [verify_isolated(t, seconds=seconds, deep=True) for t in targets(path)]


@click.group("store")
def store() -> None:
    """Check the files of a node's stores."""


@store.command("verify")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--seconds", type=float, default=None, help="Stop after this long (default: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def verify_command(path: str, seconds: float | None, as_json: bool) -> None:
    """Verify the structure and every checksum of the stores in PATH."""
    reports = scrub(path, seconds=seconds)
    if as_json:
        click.echo(json.dumps([{**asdict(r), "ok": r.ok} for r in reports], indent=2))
    else:
        for r in reports:
            if r.ok:
                click.echo(r.summary())
            for problem in r.problems:
                click.echo(f"nonstop: error: {problem}", err=True)
    if not all(r.ok for r in reports):
        raise SystemExit(1)


__all__ = ["scrub", "store", "targets"]
