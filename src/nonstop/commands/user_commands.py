"""``user.add | passwd | list | roles | remove``: the users table of the cluster log.

Permission ``users`` (the ``admin`` role).  The changes go through the cluster log
(``nonstop.security.users_table``).  ``user.add`` and ``user.passwd`` take the
password itself and turn it into a verifier here (``nonstop.net.auth.make_verifier``:
scrypt, a fresh salt) before anything is sent: the CLI runs this handler in its own
process, so from the CLI the password never crosses the network; over HTTP the
node runs it, so the password travels in the request body like a basic-auth
password does, and the admin API accepts these commands only over TLS or on a
loopback address (``nonstop.adminapi.app``, docs/security.md "Passwords over HTTP").
The password is a :class:`~pydantic.SecretStr`: logged and echoed as ``**********``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr

from nonstop.commands.context import CommandContext
from nonstop.commands.context import ask as ask_node
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import Arguments, NoArguments, command
from nonstop.security.roles import USERS

USER_NAME = r"^[A-Za-z0-9_.@-]{1,64}$"
ROLE_NAME = r"^[a-z][a-z0-9_.-]{0,31}$"
MIN_PASSWORD = 8
MAX_PASSWORD = 1024


@command("user.list", permission=USERS)
def user_list(context: CommandContext, _: NoArguments) -> dict[str, Any]:
    """The users of the cluster's users table and their roles."""
    reply = ask(context, {"op": "user.list"})
    return {"users": reply.get("users", []) if isinstance(reply, dict) else []}


def ask(context: CommandContext, payload: dict[str, Any]) -> Any:
    """:func:`~nonstop.commands.context.ask`; the users table's refusals (an unknown user,
    one that exists, a bad role: ``BadArgument``, which the client raises as a generic
    cluster error) are usage errors, so HTTP 400 and CLI exit 2, in the table's words."""
    try:
        return ask_node(context, payload)
    except CommandError as exc:
        prefix = "BadArgument: "
        if exc.kind == "failed" and exc.message.startswith(prefix):
            raise CommandError(exc.message.removeprefix(prefix), "usage") from None
        raise


class UserArguments(Arguments):
    name: str = Field(pattern=USER_NAME, description="User name.")


class RolesArguments(UserArguments):
    roles: list[str] = Field(
        min_length=1, max_length=32, description="monitor, app, operator, admin, or app roles."
    )


class PasswordArguments(UserArguments):
    password: SecretStr = Field(
        max_length=MAX_PASSWORD,
        description=f"The password: at least {MIN_PASSWORD} characters, not the user name.",
    )


class AddArguments(RolesArguments, PasswordArguments):
    pass


def verifier_of(args: PasswordArguments) -> dict[str, Any]:
    """The wire form of a new verifier for ``args.password``; a weak password is refused
    (usage) with a message that does not contain it."""
    from nonstop.net.auth import make_verifier

    secret = args.password.get_secret_value()
    if len(secret) < MIN_PASSWORD:
        raise CommandError(
            f"the password is too short: at least {MIN_PASSWORD} characters", "usage"
        )
    if secret.casefold() == args.name.casefold():
        raise CommandError("the password must not be the user name", "usage")
    wire: dict[str, Any] = make_verifier(secret).to_wire()
    return wire


@command("user.add", arguments=AddArguments, permission=USERS, changes=True, positional=("name",))
def user_add(context: CommandContext, args: AddArguments) -> dict[str, Any]:
    """Add a user with roles and a password."""
    payload = {"op": "user.add", "user": args.name, "roles": list(args.roles)}
    ask(context, {**payload, "verifier": verifier_of(args)})
    return {"user": args.name, "roles": sorted(set(args.roles))}


@command(
    "user.passwd",
    arguments=PasswordArguments,
    permission=USERS,
    changes=True,
    positional=("name",),
)
def user_passwd(context: CommandContext, args: PasswordArguments) -> dict[str, Any]:
    """Set a new password for a user."""
    ask(context, {"op": "user.passwd", "user": args.name, "verifier": verifier_of(args)})
    return {"user": args.name, "password": "changed"}


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


__all__ = ["user_add", "user_list", "user_passwd", "user_remove", "user_roles", "verifier_of"]
