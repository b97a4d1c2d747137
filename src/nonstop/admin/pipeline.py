"""``nonstop pipeline ...``: the Spark jobs (J3) from the command line.

Each command starts a Spark session (``--master``, default ``local[*]``), runs
one job of :mod:`nonstop.spark.jobs` with a progress display (step lines here,
Spark's stage bar on stderr) and prints a report (``--json``: one JSON
document).  Spark is imported only when a command runs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from nonstop.admin.cmd_cluster import credentials_option
from nonstop.errors import Error

CLUSTER_HELP = "Node addresses host:port,... (any nodes of the cluster)."


def _progress() -> Callable[[str], None]:
    """Step lines on stderr (stdout stays the report, also with --json)."""
    started = time.monotonic()

    def say(step: str) -> None:
        click.echo(f"[{time.monotonic() - started:7.1f}s] {step}", err=True)

    return say


def _run(
    job: Callable[..., dict[str, Any]],
    checks: list[tuple[str, str]],
    as_json: bool,
    master: str,
    *args: Any,
    **kw: Any,
) -> dict[str, Any]:
    """Check ``(cluster, type)`` pairs without Spark, then run ``job`` in a session."""
    from nonstop.spark import jobs

    say = _progress()
    try:
        for cluster, type_name in checks:
            jobs.check_type(cluster, type_name)
    except Error as exc:
        click.echo(f"nonstop: error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    from pyspark.sql import SparkSession

    # Called inside a running Spark application (a notebook, a test): use its session
    # and leave it running.
    existing = SparkSession.getActiveSession()
    say(f"starting Spark ({master})" if existing is None else "using the active Spark session")
    spark = jobs.session(master)
    try:
        report = job(spark, *args, progress=say, **kw)
    except Exception as exc:  # Spark wraps node errors: show the nonstop one
        message = (
            f"{type(exc).__name__}: {exc}" if isinstance(exc, Error) else jobs.error_message(exc)
        )
        click.echo(f"nonstop: error: {message}", err=True)
        sys.exit(1)
    finally:
        if existing is None:
            spark.stop()
    say("done")
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        for k, v in report.items():
            if k not in ("schema",):
                click.echo(f"{k}: {v}")
    return report


@click.group()
def pipeline() -> None:
    """Spark jobs: load files into a type, export to Parquet, import, audit two copies."""


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = credentials_option(fn)
    fn = click.option("--master", default="local[*]", show_default=True, help="Spark master.")(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")(fn)
    return fn


@pipeline.command("load")
@click.option("--cluster", required=True, help=CLUSTER_HELP)
@click.option("--type", "type_name", required=True, help="Managed type name.")
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "parquet", "json"]), help="Default: by extension."
)
@click.option(
    "--mode", type=click.Choice(["append", "overwrite"]), default="append", show_default=True
)
@click.argument("path")
@_common
def load_cmd(
    cluster: str, type_name: str, fmt: str | None, mode: str, path: str, master: str, as_json: bool
) -> None:
    """Load a CSV (with header), Parquet or JSON-lines file into a type (upsert by key)."""
    from nonstop.spark import jobs

    _run(
        jobs.load,
        [(cluster, type_name)],
        as_json,
        master,
        cluster,
        type_name,
        path,
        fmt=fmt,
        mode=mode,
    )


@pipeline.command("export")
@click.option("--cluster", required=True, help=CLUSTER_HELP)
@click.option("--type", "type_name", required=True, help="Managed type name.")
@click.argument("out")
@_common
def export_cmd(cluster: str, type_name: str, out: str, master: str, as_json: bool) -> None:
    """Export a type to Parquet in OUT (with _nonstop.json: the snapshots it was read at)."""
    from nonstop.spark import jobs

    _run(jobs.export, [(cluster, type_name)], as_json, master, cluster, type_name, out)


@pipeline.command("import")
@click.option("--cluster", required=True, help=CLUSTER_HELP)
@click.option("--type", "type_name", required=True, help="Managed type name.")
@click.option(
    "--mode", type=click.Choice(["append", "overwrite"]), default="append", show_default=True
)
@click.argument("path")
@_common
def import_cmd(
    cluster: str, type_name: str, mode: str, path: str, master: str, as_json: bool
) -> None:
    """Import a Parquet export back into a type."""
    from nonstop.spark import jobs

    _run(jobs.import_, [(cluster, type_name)], as_json, master, cluster, type_name, path, mode=mode)


@pipeline.command("audit")
@click.option("--type", "type_name", required=True, help="Managed type name.")
@click.option("--key", help="Field to match objects by (default: the first unique key).")
@click.argument("left")
@click.argument("right")
@_common
def audit_cmd(
    type_name: str, key: str | None, left: str, right: str, master: str, as_json: bool
) -> None:
    """Compare a type's objects in LEFT and RIGHT: each a Parquet export directory or
    cluster addresses, optionally '#node' to take only what that node holds.
    Exit code 2 when they differ."""
    from nonstop.spark import jobs

    sources = [(s, type_name) for s in (left, right) if not os.path.isdir(s)]
    report = _run(jobs.audit, sources, as_json, master, left, right, type_name, key=key)
    if not report["equal"]:
        sys.exit(2)


@pipeline.command("serve")
@click.option("--data", required=True, type=click.Path(file_okay=False), help="Store directory.")
@click.option("--listen", default="127.0.0.1:7201", show_default=True)
@click.option("--app", multiple=True, help="Module(s) defining the managed types.")
@click.option("--name", default="", help="Node name to announce.")
@click.option(
    "--credentials",
    help="Credentials file of the one user who may connect (default $NONSTOP_CREDENTIALS, "
    "else one written next to the store).",
)
def serve_cmd(
    data: str, listen: str, app: tuple[str, ...], name: str, credentials: str | None
) -> None:
    """Serve one embedded store to Spark jobs (the bulk ops of a node), until SIGTERM."""
    from nonstop.bulk.server import main

    argv = ["--data", data, "--listen", listen, "--name", name]
    if credentials:
        argv += ["--credentials", credentials]
    for module in app:
        argv += ["--app", module]
    main(argv)
