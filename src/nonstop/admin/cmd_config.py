"""``nonstop config load | activate | deactivate | remove | list | show`` (F1).

Configuration is a table of the cluster log (docs/design/configuration.md):
any node answers, and every node applies the same changes.  A change is sent
to one node, which checks it (the file against its type, the life cycle, the
audits), puts it in the log and answers once it is applied there -- or
refuses it with one line naming the culprit (exit code 2), nothing applied.

The commands are plain functions (:func:`load`, :func:`activate`, ...) taking
typed arguments and returning JSON-able results, so that other front ends
(an HTTP API) can register the same commands; :class:`CommandRefused` is their
one-line refusal.  The ``click`` commands below only print them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from nonstop.admin.cmd_cluster import Target, open_client, resolve_target, target_options
from nonstop.admin.output import USAGE, fail
from nonstop.errors import Error

CHANGE_WAIT = 6.0
"""Seconds a node may take to get a change applied (its own limit is 5 s)."""


class CommandRefused(Exception):
    """A configuration command refused; ``usage`` when the request itself is at fault."""

    def __init__(self, message: str, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


def request(
    target: Target, payload: dict[str, Any], timeout: float, op: str = "config"
) -> dict[str, Any]:
    """One configuration request (``op``: ``config``, ``config.list``, ``config.show``)
    to a node of ``target``; its reply or a :class:`CommandRefused`."""
    with open_client(target, timeout) as client:
        try:
            reply = client.request({"op": op, **payload})
        except (Error, OSError) as exc:
            raise CommandRefused(f"{op} {payload.get('do', '')}: {exc}", usage=False) from None
    if not isinstance(reply, dict):
        raise CommandRefused(f"{op}: odd reply {reply!r:.80}", usage=False)
    if "error" in reply:
        message = str(reply.get("message") or reply["error"])
        if reply.get("error") == "BadRequest" and "unknown op" in message:
            message = "the node does not serve configuration (an older node?)"
        raise CommandRefused(message, usage=reply.get("error") == "Rejected")
    return reply


def read_files(paths: list[str]) -> list[dict[str, str]]:
    """``[{file, text}]`` for the request; :class:`CommandRefused` naming an unreadable file."""
    files = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise CommandRefused(f"cannot read {path}: {reason}") from None
        files.append({"file": path, "text": text})
    return files


# ------------------------------------------------------------ the commands
def load(target: Target, paths: list[str], activate: bool, timeout: float) -> dict[str, Any]:
    """Load configuration files (and activate them) in one change."""
    payload = {"do": "load", "files": read_files(paths), "activate": activate}
    return request(target, payload, timeout + CHANGE_WAIT)


def activate(
    target: Target, type_name: str, name: str, version: str, timeout: float
) -> dict[str, Any]:
    """Make ``version`` the active one (the active version, if any, goes Inactive)."""
    payload = {"do": "activate", "type": type_name, "name": name, "version": version}
    return request(target, payload, timeout + CHANGE_WAIT)


def deactivate(
    target: Target, type_name: str, name: str, version: str | None, timeout: float
) -> dict[str, Any]:
    """Deactivate the active version (no version is active after)."""
    payload: dict[str, Any] = {"do": "deactivate", "type": type_name, "name": name}
    if version:
        payload["version"] = version
    return request(target, payload, timeout + CHANGE_WAIT)


def remove(
    target: Target, type_name: str, name: str, version: str, timeout: float
) -> dict[str, Any]:
    """Remove an inactive version."""
    payload = {"do": "remove", "type": type_name, "name": name, "version": version}
    return request(target, payload, timeout + CHANGE_WAIT)


def list_versions(target: Target, timeout: float) -> dict[str, Any]:
    """Every loaded version, as applied on the node that answers."""
    return request(target, {}, timeout, op="config.list")


def show(
    target: Target, type_name: str, name: str, version: str | None, timeout: float
) -> dict[str, Any]:
    """The versions of one configuration with their data."""
    payload: dict[str, Any] = {"type": type_name, "name": name}
    if version:
        payload["version"] = version
    return request(target, payload, timeout, op="config.show")


# ------------------------------------------------------------ click
def _run(fn: Any, *args: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = fn(*args)
    except CommandRefused as exc:
        fail(str(exc), USAGE if exc.usage else 1)
    return result


def _echo_changes(reply: dict[str, Any]) -> None:
    changes = reply.get("changes") or []
    if not changes:
        click.echo("nothing to change (already so)")
    for c in changes:
        old = f" (replaces {c['old_version']})" if c.get("old_version") else ""
        click.echo(f"{c['kind']} {c['type']}/{c['name']} version {c['version']}{old}")


@click.group()
def config() -> None:
    """Versioned configuration: load files, activate, deactivate, remove, list, show."""


@config.command("load")
@click.argument("files", nargs=-1, required=True)
@click.option("--activate", "then_activate", is_flag=True, help="Activate them too (one change).")
@target_options
def config_load(
    files: tuple[str, ...],
    then_activate: bool,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """Load configuration FILES (TOML: type, name, version, data) as one change."""
    target = resolve_target(address, folder)
    _echo_changes(_run(load, target, list(files), then_activate, timeout))


@config.command("activate")
@click.argument("type_name", metavar="TYPE")
@click.argument("name")
@click.argument("version")
@target_options
def config_activate(
    type_name: str, name: str, version: str, address: str | None, folder: str | None, timeout: float
) -> None:
    """Activate VERSION of configuration TYPE NAME (replacing the active one atomically)."""
    target = resolve_target(address, folder)
    _echo_changes(_run(activate, target, type_name, name, version, timeout))


@config.command("deactivate")
@click.argument("type_name", metavar="TYPE")
@click.argument("name")
@click.argument("version", required=False)
@target_options
def config_deactivate(
    type_name: str,
    name: str,
    version: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """Deactivate the active version of TYPE NAME (no version is active after)."""
    target = resolve_target(address, folder)
    _echo_changes(_run(deactivate, target, type_name, name, version, timeout))


@config.command("remove")
@click.argument("type_name", metavar="TYPE")
@click.argument("name")
@click.argument("version")
@target_options
def config_remove(
    type_name: str, name: str, version: str, address: str | None, folder: str | None, timeout: float
) -> None:
    """Remove inactive VERSION of TYPE NAME."""
    target = resolve_target(address, folder)
    _echo_changes(_run(remove, target, type_name, name, version, timeout))


@config.command("list")
@target_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def config_list(address: str | None, folder: str | None, timeout: float, as_json: bool) -> None:
    """Every loaded version and its state."""
    reply = _run(list_versions, resolve_target(address, folder), timeout)
    rows = reply.get("configurations", [])
    if as_json:
        click.echo(json.dumps({"node": reply.get("node"), "configurations": rows}, sort_keys=True))
        return
    table = [("TYPE", "NAME", "VERSION", "STATE", "FILE")]
    table += [(r["type"], r["name"], r["version"], r["state"], r["file"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    click.echo(f"({len(rows)} versions, as applied on {reply.get('node')})")


@config.command("show")
@click.argument("type_name", metavar="TYPE")
@click.argument("name")
@click.argument("version", required=False)
@target_options
def config_show(
    type_name: str,
    name: str,
    version: str | None,
    address: str | None,
    folder: str | None,
    timeout: float,
) -> None:
    """The versions of TYPE NAME (or one VERSION) with their data, as JSON."""
    reply = _run(show, resolve_target(address, folder), type_name, name, version, timeout)
    click.echo(json.dumps(reply.get("versions", []), indent=2, sort_keys=True))


__all__ = [
    "CommandRefused",
    "activate",
    "config",
    "deactivate",
    "list_versions",
    "load",
    "remove",
    "request",
    "show",
]
