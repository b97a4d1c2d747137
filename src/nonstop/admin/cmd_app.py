"""``nonstop app list | run``: the application commands of a cluster's nodes (G4).

An application module defines its commands (``nonstop.commands.application``);
the nodes that load it run them.  The CLI does not import the application: it
asks a node which commands it has (``app list``) and sends ``app run NAME
KEY=VALUE ...`` to it, where the arguments are checked against the command's
model and the caller's roles against its permission -- the same checks, the
same command as ``POST /api/v1/app/TARGET/COMMAND`` and the console's form.

A value is read as JSON when it parses (``limit=5`` is the number 5,
``tags=["a","b"]`` a list), else as text (``owner=ann``).  Output: the rows as
a table, or with ``--json`` the node's answer ``{command, node, columns, rows}``.
With ``--group NAME`` the command runs on every node of the group
(``nonstop.commands.groups``): one result per node.
"""

from __future__ import annotations

import json
from typing import Any

import click

from nonstop.admin.cmd_cluster import resolve_target, target_options
from nonstop.admin.output import USAGE, fail
from nonstop.admin.registered import context_for, refuse
from nonstop.commands.application import request, run_on_node
from nonstop.commands.failure import CommandError


def parse_pairs(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("a=1", "b=x")`` → ``{"a": 1, "b": "x"}`` (module doc); a usage error otherwise."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            fail(f"an argument is KEY=VALUE, not {pair!r}", USAGE)
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def echo_rows(reply: dict[str, Any]) -> None:
    columns = [str(c) for c in reply.get("columns") or []]
    rows = reply.get("rows") or []
    if not columns:
        click.echo(f"{reply.get('command')} ran on {reply.get('node')}: no rows")
        return
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


@click.group()
def app() -> None:
    """Application commands: list them, run one (on the node, in a transaction)."""


@app.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def app_list(address: str | None, folder: str | None, timeout: float, as_json: bool) -> None:
    """The application commands of the node asked, their permission and arguments."""
    target = resolve_target(address, folder)
    try:
        reply = request(context_for(target, timeout), {"op": "app.commands"})
    except CommandError as exc:
        refuse(exc, target)
    if as_json:
        click.echo(json.dumps(reply, indent=2, sort_keys=True))
        return
    for cmd in reply.get("commands", []):
        fields = ", ".join(cmd.get("arguments", {}).get("properties", {})) or "-"
        click.echo(f"{cmd['name']}  ({cmd['permission']}; arguments: {fields})  {cmd['summary']}")


@app.command("run")
@click.argument("name")
@click.argument("pairs", nargs=-1)
@click.option("--group", help="Run it on every node of this group (one result per node).")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def app_run(
    name: str,
    pairs: tuple[str, ...],
    group: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Run application command NAME (TARGET.COMMAND) with arguments KEY=VALUE ..."""
    target = resolve_target(address, folder)
    arguments = parse_pairs(pairs)
    context = context_for(target, timeout)
    try:
        if group is not None:
            from nonstop.commands.groups import run_on_group

            results = run_on_group(
                context, group, lambda ctx: run_on_node(ctx, name, arguments), f"app.{name}"
            )
            click.echo(json.dumps(results, indent=2, sort_keys=True, default=str))
            return
        reply = run_on_node(context, name, arguments)
    except CommandError as exc:
        refuse(exc, target)
    if as_json:
        click.echo(json.dumps(reply, indent=2, sort_keys=True, default=str))
    else:
        echo_rows(reply)


__all__ = ["app", "parse_pairs"]
