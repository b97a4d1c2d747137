"""``nonstop partition list | define | enable | disable``: the partition table (D2-D9).

The commands are those of :mod:`nonstop.commands.partition_commands` (the
command model, docs/design/admin.md: the same on HTTP); this module gives them
their options and human tables.  A refusal of the table comes back as one line
naming the culprit (an unknown node, a list that disagrees with the existing
definition, the last copy, ...), exit code 2.

Object counts per partition come from the node acting for it
(``partition.objects``); ``n/a`` while the data path routes by node
(``ha.data = "nodes"``) or no node acts for it.
"""

from __future__ import annotations

import json
from typing import Any

import click

from nonstop.admin.cmd_cluster import Target, resolve_target, target_options
from nonstop.admin.registered import context_for, run_registered


@click.group()
def partition() -> None:
    """The partition table: list partitions, define, enable, disable them."""


@partition.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def partition_list(address: str | None, folder: str | None, timeout: float, as_json: bool) -> None:
    """Every partition: state, epoch, active node, current list, status per node."""
    target = resolve_target(address, folder)
    data = run_registered("partition.list", context_for(target, timeout), {}, target)
    rows = data["partitions"]
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    header = ("NAME", "STATE", "EPOCH", "ACTIVE", "ACTING", "CURRENT", "COPYING", "OBJECTS")
    table = [header]
    for r in rows:
        current = ",".join(f"{n}{'' if s == 'sync' else '(async)'}" for n, s in r["current"])
        table.append(
            (
                r["name"],
                r["state"],
                str(r["epoch"]),
                r["active"] or "-",
                ",".join(r["acting_on"]) or "-",
                current or "-",
                ",".join(r["copying"]) or "-",
                "n/a" if r["objects"] is None else str(r["objects"]),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    disabled = sorted(
        f"{r['name']}@{n}" for r in rows for n, s in r["status"].items() if s == "LocalDisabled"
    )
    if disabled:
        click.echo(f"disabled (LocalDisabled): {', '.join(disabled)}")
    note = ""
    if any(r["objects"] is None for r in rows):
        note = "; OBJECTS n/a: no node acts for it, or the data path routes by node (ha.data)"
    click.echo(f"({len(rows)} partitions, table as applied on {data.get('node')}{note})")


@partition.command("define")
@click.argument("name")
@click.option(
    "--nodes", "nodes", required=True, help="Priority-ordered node list: A,B:async (sync default)."
)
@click.option("--policy", default=None, help="Policy name to record (default: operator).")
@target_options
def partition_define(
    name: str,
    nodes: str,
    policy: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """Define partition NAME with a priority-ordered node list (D2); enable it after."""
    target = resolve_target(address, folder)
    arguments: dict[str, Any] = {"name": name, "nodes": nodes}
    if policy:
        arguments["policy"] = policy
    run_registered("partition.define", context_for(target, timeout), arguments, target)
    click.echo(f"defined {name}: {nodes} (enable it with `nonstop partition enable {name}`)")


def _switch(kind: str, name: str, on: tuple[str, ...], target: Target, timeout: float) -> None:
    data = run_registered(
        f"partition.{kind}", context_for(target, timeout), {"name": name, "on": list(on)}, target
    )
    for result in data["results"]:
        click.echo(
            f"{kind}d {name} on {result['node']}: state {result['state']}, "
            f"epoch {result['epoch']}, active {result['active'] or '-'}"
        )


@partition.command("enable")
@click.argument("name")
@click.option("--on", "on", multiple=True, help="Node to enable it on (default: its list).")
@target_options
def partition_enable(
    name: str, on: tuple[str, ...], address: str | None, folder: str | None, timeout: float
) -> None:
    """Enable partition NAME on nodes (D5/D7): a listed node holds it, the first is active."""
    _switch("enable", name, on, resolve_target(address, folder), timeout)


@partition.command("disable")
@click.argument("name")
@click.option("--on", "on", multiple=True, help="Node to disable it on (default: its list).")
@target_options
def partition_disable(
    name: str, on: tuple[str, ...], address: str | None, folder: str | None, timeout: float
) -> None:
    """Disable partition NAME on nodes; refused for the node holding its last in-sync copy."""
    _switch("disable", name, on, resolve_target(address, folder), timeout)
