"""``nonstop user add | list | remove | passwd | roles``: the users of a cluster (G5).

Users live in the users table of the cluster log (``nonstop.security.users_table``):
a change made through any node is replicated to every node.  Every command is a
command of the registry (``nonstop.commands.user_commands``), run here in the CLI's
process: ``add`` and ``passwd`` turn the password into a verifier before they send
anything, so from the CLI the password never crosses the network.  Every command
needs a user with the ``admin`` role (a local cluster's folder credential is one).
"""

from __future__ import annotations

import json
from typing import Any

import click

from nonstop.admin.cmd_cluster import resolve_target
from nonstop.admin.output import USAGE, fail
from nonstop.client.credentials import new_password, write_credentials
from nonstop.security.roles import BUILTIN_ROLES


def _options(f: Any) -> Any:
    for option in (
        click.option("--credentials", help="Credentials file of an admin user."),
        click.option("--timeout", default=5.0, show_default=True, help="Seconds per request."),
        click.option("--dir", "folder", help="Local cluster folder (default ./.nonstop/local)."),
        click.option("--node", "address", help="Node address(es) to ask, comma-separated."),
    ):
        f = option(f)
    return f


def _run(
    name: str,
    address: str | None,
    folder: str | None,
    credentials: str | None,
    timeout: float,
    arguments: dict[str, Any],
) -> Any:
    """Run the registered command ``name`` (nonstop.commands.user_commands)."""
    from nonstop.admin.registered import context_for, run_registered

    target = resolve_target(address, folder, credentials)
    return run_registered(name, context_for(target, timeout), arguments, target)


def _password(password: str | None, out: str | None) -> str:
    if password is not None:
        return password
    if out is None:
        fail("give --password, or --out FILE to write a generated one to", USAGE)
    return new_password()


@click.group()
def user() -> None:
    """Users and their roles: monitor, app, operator, admin, or an application role."""


@user.command("add")
@click.argument("name")
@click.option(
    "--role", "roles", multiple=True, required=True, help=f"{', '.join(BUILTIN_ROLES)}, ..."
)
@click.option("--password", help="The password (default: generated, see --out).")
@click.option("--out", help="Write a credentials file (0600) for the new user here.")
@_options
def user_add(
    name: str,
    roles: tuple[str, ...],
    password: str | None,
    out: str | None,
    address: str | None,
    folder: str | None,
    credentials: str | None,
    timeout: float,
) -> None:
    """Add user NAME with the given roles."""
    secret = _password(password, out)
    arguments = {"name": name, "roles": list(roles), "password": secret}
    _run("user.add", address, folder, credentials, timeout, arguments)
    if out is not None:
        write_credentials(out, name, secret)
    click.echo(f"user {name} added with roles {','.join(sorted(set(roles)))}")


@user.command("passwd")
@click.argument("name")
@click.option("--password", help="The new password (default: generated, see --out).")
@click.option("--out", help="Write a credentials file (0600) with the new password here.")
@_options
def user_passwd(
    name: str,
    password: str | None,
    out: str | None,
    address: str | None,
    folder: str | None,
    credentials: str | None,
    timeout: float,
) -> None:
    """Set a new password for user NAME."""
    secret = _password(password, out)
    _run("user.passwd", address, folder, credentials, timeout, {"name": name, "password": secret})
    if out is not None:
        write_credentials(out, name, secret)
    click.echo(f"password of {name} changed")


@user.command("roles")
@click.argument("name")
@click.option("--role", "roles", multiple=True, required=True)
@_options
def user_roles(
    name: str,
    roles: tuple[str, ...],
    address: str | None,
    folder: str | None,
    credentials: str | None,
    timeout: float,
) -> None:
    """Replace the roles of user NAME."""
    _run("user.roles", address, folder, credentials, timeout, {"name": name, "roles": list(roles)})
    click.echo(f"user {name} now has roles {','.join(sorted(set(roles)))}")


@user.command("remove")
@click.argument("name")
@_options
def user_remove(
    name: str, address: str | None, folder: str | None, credentials: str | None, timeout: float
) -> None:
    """Remove user NAME (its open connections are refused from their next request)."""
    _run("user.remove", address, folder, credentials, timeout, {"name": name})
    click.echo(f"user {name} removed")


@user.command("list")
@click.option("--json", "as_json", is_flag=True)
@_options
def user_list(
    as_json: bool,
    address: str | None,
    folder: str | None,
    credentials: str | None,
    timeout: float,
) -> None:
    """List the users of the cluster's users table and their roles."""
    users = _run("user.list", address, folder, credentials, timeout, {})["users"]
    if as_json:
        click.echo(json.dumps(users))
        return
    for entry in users:
        click.echo(f"{entry['user']}\t{','.join(entry['roles'])}")
    if not users:
        click.echo(
            "(no users in the table; the bootstrap admin of the nodes' config is not listed)"
        )
