"""The command registry: every administrative command defined once (docs/design/admin.md).

A :class:`Command` is a name (``"partition.enable"``: CLI ``nonstop partition
enable``, HTTP ``POST /api/v1/partition/enable``), a pydantic model of its
typed arguments, the permission it needs (the names of
``nonstop.security.roles``: ``status``, ``membership``, ``users``, ``admin``),
and a handler ``(context, arguments) -> JSON-able data``.  The front ends only
translate: the CLI turns options into the arguments model and prints the data
(``--json``: as it is), the HTTP API validates the JSON body against the same
model and answers the same data.  A handler refuses with :class:`CommandError`,
whose ``kind`` each front end maps to its own convention (exit code, HTTP status).

Registering: :func:`command` as a decorator on a handler, or :func:`register`
for a plain function (the configuration commands, ``config_commands``): both add
to :data:`REGISTRY`, which the CLI and the HTTP API read when they are built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, SecretStr

from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError


class Arguments(BaseModel):
    """Base of every command's arguments: unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class NoArguments(Arguments):
    """A command without arguments."""


Handler = Callable[[CommandContext, Any], Any]


@dataclass(frozen=True)
class Command:
    name: str
    arguments: type[Arguments]
    permission: str
    handler: Handler
    summary: str
    changes: bool = False
    """True for a command that changes the cluster (the console asks before running it)."""
    positional: tuple[str, ...] = ()
    """Argument fields the CLI takes as positional arguments (in this order)."""
    per_node: bool = False
    """Whether its answer depends on the node asked, so that it may run on every node of
    a group (``nonstop.commands.groups``): the reads, and the application commands."""

    @property
    def words(self) -> list[str]:
        """The CLI words / URL segments: ``partition.enable`` → ``["partition", "enable"]``."""
        return self.name.split(".")

    @property
    def secret_fields(self) -> tuple[str, ...]:
        """Arguments that carry a secret (typed :class:`~pydantic.SecretStr`: a password):
        logged and echoed masked; the HTTP API takes them only over TLS or loopback."""
        fields = self.arguments.model_fields
        return tuple(name for name, info in fields.items() if info.annotation is SecretStr)

    def run(self, context: CommandContext, raw: dict[str, Any]) -> Any:
        """Validate ``raw`` (pydantic ``ValidationError`` when wrong) and run the handler."""
        return self.handler(context, self.arguments.model_validate(raw))


REGISTRY: dict[str, Command] = {}


def register(
    name: str,
    handler: Handler,
    *,
    arguments: type[Arguments] = NoArguments,
    permission: str,
    summary: str = "",
    changes: bool = False,
    positional: tuple[str, ...] = (),
    per_node: bool | None = None,
) -> Command:
    """Add a command (a second one with the same name is a programming error);
    ``per_node`` defaults to ``not changes``."""
    if name in REGISTRY:
        raise ValueError(f"command {name!r} is registered twice")
    for field in positional:
        if field not in arguments.model_fields:
            raise ValueError(f"{name}: positional {field!r} is not an argument")
    cmd = Command(
        name=name,
        arguments=arguments,
        permission=permission,
        handler=handler,
        summary=summary or (handler.__doc__ or name).strip().splitlines()[0],
        changes=changes,
        positional=positional,
        per_node=(not changes) if per_node is None else per_node,
    )
    REGISTRY[name] = cmd
    return cmd


def command(
    name: str,
    *,
    arguments: type[Arguments] = NoArguments,
    permission: str,
    changes: bool = False,
    positional: tuple[str, ...] = (),
) -> Callable[[Handler], Handler]:
    """Decorator form of :func:`register`; the handler's first doc line is the summary."""

    def add(handler: Handler) -> Handler:
        register(
            name,
            handler,
            arguments=arguments,
            permission=permission,
            changes=changes,
            positional=positional,
        )
        return handler

    return add


def load_all() -> dict[str, Command]:
    """Import every module that defines commands, then the registry (front ends call this)."""
    import nonstop.commands.cluster_commands
    import nonstop.commands.config_commands
    import nonstop.commands.membership_commands
    import nonstop.commands.partition_commands
    import nonstop.commands.user_commands  # noqa: F401

    return REGISTRY


__all__ = [
    "REGISTRY",
    "Arguments",
    "Command",
    "CommandError",
    "NoArguments",
    "command",
    "load_all",
    "register",
]
