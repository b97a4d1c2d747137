"""``nonstop config load | activate | deactivate | remove | list | show | effective`` (F1, G3).

Configuration is a table of the cluster log (docs/design/configuration.md):
any node answers, and every node applies the same changes.  A change is sent
to one node, which checks it (the file against its type, the life cycle, the
audits), puts it in the log and answers once it is applied there -- or
refuses it with one line naming the culprit (exit code 2), nothing applied.

The commands are those of :mod:`nonstop.commands.config_commands` (the command
model, docs/design/admin.md: the same on HTTP); this module gives them their
options and output.  ``load`` reads the files named on the command line and
sends their contents, as an HTTP caller does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from nonstop.admin.cmd_cluster import resolve_target, target_options
from nonstop.admin.output import USAGE, fail
from nonstop.admin.registered import context_for, run_registered
from nonstop.configuration.scope import describe


def read_files(paths: list[str]) -> list[dict[str, str]]:
    """``[{file, text}]`` for ``config.load``; a one-line failure naming an unreadable file."""
    files = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            fail(f"cannot read {path}: {reason}", USAGE)
        files.append({"file": path, "text": text})
    return files


def _run(
    command: str, address: str | None, folder: str | None, timeout: float, /, **args: Any
) -> Any:
    """Run registered ``command`` with ``args`` (None: not given) against the CLI's target."""
    target = resolve_target(address, folder)
    given = {k: v for k, v in args.items() if v is not None}
    return run_registered(command, context_for(target, timeout), given, target)


def _echo_changes(reply: dict[str, Any]) -> None:
    changes = reply.get("changes") or []
    if not changes:
        click.echo("nothing to change (already so)")
    for c in changes:
        old = f" (replaces {c['old_version']})" if c.get("old_version") else ""
        where = f" for {describe(c['applies_to'])}" if c.get("applies_to") else ""
        click.echo(f"{c['kind']} {c['type']}/{c['name']} version {c['version']}{old}{where}")


@click.group()
def config() -> None:
    """Versioned configuration: load files, activate, deactivate, remove, list, show."""


@config.command("load")
@click.argument("files", nargs=-1, required=True)
@click.option("--activate", "activate", is_flag=True, help="Activate them too (one change).")
@click.option("--group", "group", help="Apply them to this group's nodes only.")
@click.option("--nodes", "nodes", help="Apply them to these nodes only (comma-separated).")
@target_options
def config_load(
    files: tuple[str, ...],
    activate: bool,
    group: str | None,
    nodes: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """Load configuration FILES (TOML: type, name, version, data) as one change.

    A file applies to every node unless it says applies_to = "GROUP" or
    applies_to = ["NODE", ...], or --group / --nodes say so for all the files.
    """
    loaded = read_files(list(files))
    reply = _run(
        "config.load",
        address,
        folder,
        timeout,
        files=loaded,
        activate=activate,
        group=group,
        nodes=[n.strip() for n in nodes.split(",") if n.strip()] if nodes else None,
    )
    _echo_changes(reply)


def _version_command(verb: str, doc: str, version_required: bool) -> None:
    """``config VERB TYPE NAME VERSION`` (VERSION optional unless ``version_required``)."""

    @config.command(verb, help=doc)
    @click.argument("type", metavar="TYPE")
    @click.argument("name")
    @click.argument("version", required=version_required)
    @target_options
    def change(
        type: str,
        name: str,
        version: str | None,
        address: str | None,
        folder: str | None,
        timeout: float,
    ) -> None:
        reply = _run(
            f"config.{verb}", address, folder, timeout, type=type, name=name, version=version
        )
        _echo_changes(reply)


_version_command(
    "activate",
    "Activate VERSION of configuration TYPE NAME (replacing the active one atomically).",
    True,
)
_version_command(
    "deactivate", "Deactivate the active version of TYPE NAME (no version is active after).", False
)
_version_command("remove", "Remove inactive VERSION of TYPE NAME.", True)


@config.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def config_list(address: str | None, folder: str | None, timeout: float, as_json: bool) -> None:
    """Every loaded version and its state."""
    reply = _run("config.list", address, folder, timeout)
    rows = reply["configurations"]
    if as_json:
        click.echo(json.dumps({"node": reply.get("node"), "configurations": rows}, sort_keys=True))
        return
    table = [("TYPE", "NAME", "VERSION", "STATE", "APPLIES TO", "FILE")]
    table += [
        (r["type"], r["name"], r["version"], r["state"], describe(r.get("applies_to")), r["file"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(6)]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"({len(rows)} versions, as applied on {reply.get('node')})")


@config.command("show")
@click.argument("type", metavar="TYPE")
@click.argument("name")
@click.argument("version", required=False)
@target_options
def config_show(
    type: str,
    name: str,
    version: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """The versions of TYPE NAME (or one VERSION) with their data, as JSON."""
    reply = _run("config.show", address, folder, timeout, type=type, name=name, version=version)
    click.echo(json.dumps(reply["versions"], indent=2, sort_keys=True))


__all__ = ["config", "read_files"]
