"""``nonstop group nodes | run``: one command on every node of a group (G3).

A group is a ``nonstop.group`` configuration (``nonstop.configuration.groups``:
``nonstop config load east.toml --activate``) or ``all`` (every member).
``group run GROUP COMMAND KEY=VALUE ...`` runs a registered command that answers
per node (``node.status``, ``cluster.status``, ``config.list``, ...) or an
application command (``app.TARGET.COMMAND``) on each node of the group and
prints one JSON result per node (``nonstop.commands.groups``).  The same on
HTTP: ``POST /api/v1/node/status?group=east``.
"""

from __future__ import annotations

import json
from typing import Any

import click
from pydantic import ValidationError

from nonstop.admin.cmd_app import parse_pairs
from nonstop.admin.cmd_cluster import resolve_target, target_options
from nonstop.admin.output import USAGE, fail
from nonstop.admin.registered import context_for, refuse
from nonstop.commands.application import APP_PREFIX, run_on_node
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.groups import group_nodes, run_on_group
from nonstop.commands.registry import load_all


@click.group()
def group() -> None:
    """Groups of nodes: list a group's nodes, run one command on each of them."""


@group.command("nodes")
@click.argument("name")
@target_options
def group_nodes_command(name: str, address: str | None, folder: str | None, timeout: float) -> None:
    """The nodes of group NAME (all: every member), one a line."""
    target = resolve_target(address, folder)
    try:
        for node in group_nodes(context_for(target, timeout), name):
            click.echo(node)
    except CommandError as exc:
        refuse(exc, target)


@group.command("run")
@click.argument("name")
@click.argument("command")
@click.argument("pairs", nargs=-1)
@target_options
def group_run(
    name: str,
    command: str,
    pairs: tuple[str, ...],
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """Run COMMAND (node.status, app.TARGET.COMMAND, ...) with KEY=VALUE arguments on
    every node of group NAME; JSON, one result per node."""
    target = resolve_target(address, folder)
    arguments = parse_pairs(pairs)
    run = runner(command, arguments)
    try:
        results = run_on_group(context_for(target, timeout), name, run, command)
    except CommandError as exc:
        refuse(exc, target)
    click.echo(json.dumps(results, indent=2, sort_keys=True, default=str))
    if not all(r["ok"] for r in results["results"]):
        raise SystemExit(1)


def runner(command: str, arguments: dict[str, Any]) -> Any:
    """What runs ``command`` on one node; a usage error for a command that is not per node
    or arguments its model refuses (checked once, before any node is asked)."""
    registered = load_all().get(command)
    if registered is None and command.startswith(APP_PREFIX):
        name = command[len(APP_PREFIX) :]
        return lambda ctx: run_on_node(ctx, name, arguments)
    if registered is None:
        fail(f"unknown command {command!r} (`nonstop --help`, `nonstop app list`)", USAGE)
    if not registered.per_node:
        fail(f"{command} changes the cluster once, not per node: run it without a group", USAGE)
    try:
        parsed = registered.arguments.model_validate(arguments)
    except ValidationError as exc:
        fail(f"{command}: {exc.errors()[0]['msg']}", USAGE)

    def run(ctx: CommandContext) -> Any:
        return registered.handler(ctx, parsed)

    return run


__all__ = ["group", "runner"]
