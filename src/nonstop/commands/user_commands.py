"""``user.list | roles | remove``: the users table of the cluster log (permission ``users``).

The changes go through the cluster log like the CLI's did (``nonstop.security.users_table``).
``user add`` and ``user passwd`` stay CLI-only for now: the verifier is computed where
the password is typed, so a password never crosses the network (docs/security.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nonstop.commands.context import CommandContext, ask
from nonstop.commands.registry import Arguments, NoArguments, command
from nonstop.security.roles import USERS

USER_NAME = r"^[A-Za-z0-9_.@-]{1,64}$"
ROLE_NAME = r"^[a-z][a-z0-9_.-]{0,31}$"


@command("user.list", permission=USERS)
def user_list(context: CommandContext, _: NoArguments) -> dict[str, Any]:
    """The users of the cluster's users table and their roles."""
    reply = ask(context, {"op": "user.list"})
    return {"users": reply.get("users", []) if isinstance(reply, dict) else []}


class UserArguments(Arguments):
    name: str = Field(pattern=USER_NAME, description="User name.")


class RolesArguments(UserArguments):
    roles: list[str] = Field(
        min_length=1, max_length=32, description="monitor, app, operator, admin, or app roles."
    )


@command(
    "user.roles", arguments=RolesArguments, permission=USERS, changes=True, positional=("name",)
)
def user_roles(context: CommandContext, args: RolesArguments) -> dict[str, Any]:
    """Replace the roles of a user."""
    ask(context, {"op": "user.roles", "user": args.name, "roles": list(args.roles)})
    return {"user": args.name, "roles": sorted(set(args.roles))}


@command(
    "user.remove", arguments=UserArguments, permission=USERS, changes=True, positional=("name",)
)
def user_remove(context: CommandContext, args: UserArguments) -> dict[str, Any]:
    """Remove a user (its open connections are refused from their next request)."""
    ask(context, {"op": "user.remove", "user": args.name})
    return {"removed": args.name}


__all__ = ["user_list", "user_remove", "user_roles"]
