"""What every ``nonstop`` command shares: one-line errors and the status table.

Errors are one line on stderr, ``nonstop: error: <problem>: <what to do>``;
the exit code is 2 for a usage error (a bad option, a name that does not
exist, a refusal the user can fix by asking differently) and 1 for a failure
(a node that does not start, a cluster that does not answer).
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click

from nonstop.commands.cluster_commands import status_rows

USAGE = 2
FAILURE = 1


def fail(message: str, code: int = FAILURE) -> NoReturn:
    """Print ``nonstop: error: message`` (one line) and exit with ``code``."""
    click.echo(f"nonstop: error: {' '.join(message.split())}", err=True)
    sys.exit(code)


def note(message: str) -> None:
    """A one-line remark on stderr that does not change the outcome."""
    click.echo(f"note: {message}", err=True)


def emit_status(
    status: dict[str, Any],
    as_json: bool,
    *,
    cluster: str | None = None,
    source: str | None = None,
    metrics: dict[str, str] | None = None,
) -> None:
    """Print a node's status: JSON, or a header (cluster, view, leader) and a node table.

    ``cluster`` is the cluster id the answering node reported and ``source`` where
    the addresses asked came from; both are shown so that nobody mistakes one
    cluster for another.  ``metrics`` (node name → ``host:port``, from a local
    cluster's layout) adds each node's metrics endpoint.
    """
    status = {**status, "nodes": status_rows(status)}
    if metrics:
        for row in status["nodes"]:
            if row["name"] in metrics:
                row["metrics"] = metrics[row["name"]]
    if cluster is not None:
        status["cluster"] = cluster
    if source is not None:
        status["source"] = source
    if as_json:
        click.echo(json.dumps(status, indent=2, sort_keys=True))
        return
    if cluster is not None:
        click.echo(f"cluster {cluster}" + (f"  (addresses from {source})" if source else ""))
    leader = status.get("leader")
    click.echo(
        f"node {status.get('name')}: view {status.get('view')}  quorum {status.get('quorum')}  "
        f"leader {leader if leader else '-'} (term {status.get('term', 0)})"
    )
    if "members" in status:
        # The committed view: configured members, and those its leader saw Up when deciding it.
        members = ",".join(status.get("members") or []) or "-"
        live = ",".join(status.get("live") or []) or "-"
        click.echo(f"view {status.get('view')}: members {members}  live {live}")
    header: tuple[str, ...] = ("NAME", "ADDRESS", "STATE", "MEMBER", "PID")
    table = [header] + [
        (
            str(n["name"]),
            str(n["address"] or "-"),
            str(n["state"]),
            {True: "yes", False: "no"}.get(n.get("member"), "-"),
            str(n["pid"] or "-"),
        )
        for n in status["nodes"]
    ]
    if metrics:
        header = (*header, "METRICS")
        table = [header] + [
            (*row, str(n.get("metrics") or "-"))
            for row, n in zip(table[1:], status["nodes"], strict=True)
        ]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for r in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for warning in status.get("warnings", []):
        click.echo(f"warning: {warning}")
