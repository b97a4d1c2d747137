"""``cluster.join | remove``: change the membership through the cluster log (permission
``membership``: operator, admin).

The same requests as the client's ``join``/``leave`` (``nonstop.cluster.node``): the
node asked forwards them to the leader and answers once the view is committed.  A
removal is refused while the node's store holds objects (the node asked says what
it holds, in one line): membership never loses objects.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from nonstop.commands.cluster_commands import read_status
from nonstop.commands.context import CommandContext, ask
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import Arguments, command
from nonstop.security.roles import MEMBERSHIP

NODE_NAME = r"^[A-Za-z0-9_.@-]{1,64}$"
NODE_ADDRESS = r"^[A-Za-z0-9_.:\[\]-]{1,253}:[0-9]{1,5}$"


class MemberArguments(Arguments):
    name: str = Field(pattern=NODE_NAME, description="The node's name.")


class JoinArguments(MemberArguments):
    node_address: str = Field(
        pattern=NODE_ADDRESS, description="host:port where the new node listens."
    )


def view_of(reply: Any) -> dict[str, Any]:
    reply = reply if isinstance(reply, dict) else {}
    return {"view": reply.get("view"), "members": list(reply.get("members") or [])}


@command(
    "cluster.join",
    arguments=JoinArguments,
    permission=MEMBERSHIP,
    changes=True,
    positional=("name", "node_address"),
)
def cluster_join(context: CommandContext, args: JoinArguments) -> dict[str, Any]:
    """Add node NAME at NODE_ADDRESS to the membership (it must be running, waiting to be
    added: started without bootstrap members)."""
    try:
        reply = ask(context, {"op": "join", "name": args.name, "address": args.node_address})
    except CommandError as exc:
        raise CommandError(f"cannot add {args.name}: {exc.message}", exc.kind) from None
    return {"joined": args.name, **view_of(reply)}


@command(
    "cluster.remove",
    arguments=MemberArguments,
    permission=MEMBERSHIP,
    changes=True,
    positional=("name",),
)
def cluster_remove(context: CommandContext, args: MemberArguments) -> dict[str, Any]:
    """Remove node NAME from the membership (refused while its store holds objects)."""
    _, status = read_status(context)
    members = list(status.get("members") or [])
    if args.name not in members:
        raise CommandError(
            f"{args.name} is not a member (members: {', '.join(members) or '-'})", "usage"
        )
    try:
        reply = ask(context, {"op": "leave", "name": args.name})
    except CommandError as exc:
        raise CommandError(f"cannot remove {args.name}: {exc.message}", exc.kind) from None
    return {"removed": args.name, **view_of(reply)}


__all__ = ["cluster_join", "cluster_remove"]
