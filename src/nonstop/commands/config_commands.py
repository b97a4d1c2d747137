"""``config.list | show | effective | load | activate | deactivate | remove`` (F1, G3).

Configuration is a table of the cluster log (docs/design/configuration.md): any
node answers, and every node applies the same changes.  A change goes to one
node, which checks it (each file against its type, the life cycle, the audits),
puts it in the log and answers once it is applied there -- or refuses it with
one line naming the culprit (a ``refused`` :class:`CommandError`), nothing applied.

``config.load`` takes the files' contents (``[{file, text}]``): over HTTP the
files are the caller's, not the node's; the CLI reads the paths it is given.
``group`` or ``nodes`` says which nodes the files' versions apply to when the
files do not say it themselves (``applies_to``, docs/design/configuration.md);
``config.effective`` is what one node sees: the active versions that apply to it
(per node: ``nonstop group run east config.effective``).

Permissions are those the node's router asks (``nonstop.security.roles``): the
reads (ops ``config.list``, ``config.show``, ``config.effective``) ``status``, the changes (op
``config``) ``admin``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError, ErrorKind
from nonstop.commands.registry import Arguments, NoArguments, register
from nonstop.errors import Error
from nonstop.net.frames import DEFAULT_MAX_FRAME
from nonstop.security.roles import ADMIN_OPS as ADMIN
from nonstop.security.roles import STATUS

CHANGE_WAIT = 6.0
"""Seconds a node may take to get a change applied (its own limit is 5 s)."""

REFUSALS: dict[str, ErrorKind] = {"Rejected": "refused", "NotAuthorized": "forbidden"}
"""The node's error → the command's kind (anything else: ``failed``)."""


def ask(context: CommandContext, op: str, payload: dict[str, Any], wait: float = 0.0) -> Any:
    """One configuration request (``op``: ``config``, ``config.list``, ``config.show``) to a
    node of the context; its reply, or a :class:`CommandError` with the node's one line."""
    with replace(context, timeout=context.timeout + wait).client() as client:
        try:
            reply = client.request({"op": op, **payload})
        except (Error, OSError) as exc:
            raise CommandError(f"{op} {payload.get('do', '')}: {exc}", "unavailable") from None
    if not isinstance(reply, dict):
        raise CommandError(f"{op}: odd reply {reply!r:.80}")
    if "error" in reply:
        message = str(reply.get("message") or reply["error"])
        if reply.get("error") == "BadRequest" and "unknown op" in message:
            message = "the node does not serve configuration (an older node?)"
        raise CommandError(message, REFUSALS.get(str(reply["error"]), "failed"))
    return reply


def change(context: CommandContext, payload: dict[str, Any]) -> dict[str, Any]:
    """A change request (op ``config``); the node's answer: ``{"changes": [...]}``."""
    reply: dict[str, Any] = ask(context, "config", payload, CHANGE_WAIT)
    return reply


# ------------------------------------------------------------ arguments
TEXT_LIMIT = DEFAULT_MAX_FRAME
"""A file's text: no more than a request frame to the node takes (over HTTP the body
limit, ``admin.max_body``, is smaller still)."""


class ConfigFile(BaseModel):
    """One configuration file: a name for the messages, and its TOML text."""

    model_config = ConfigDict(extra="forbid")

    file: str = Field(min_length=1, max_length=1024, description="Name shown in refusals.")
    text: str = Field(max_length=TEXT_LIMIT, description="The file's TOML: type, name, version…")


class LoadArguments(Arguments):
    # "Not both" in the schema too (the OpenAPI description and its fuzz): a body whose
    # group is a string and whose nodes are a list is invalid, as one_scope says.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "not": {
                "required": ["group", "nodes"],
                "properties": {"group": {"type": "string"}, "nodes": {"type": "array"}},
            }
        },
    )

    files: list[ConfigFile] = Field(
        min_length=1, max_length=256, description="The files (their contents) to load."
    )
    activate: bool = Field(default=False, description="Activate them too (one change).")
    group: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
        description="Apply the versions to this group's nodes only (files may say applies_to).",
    )
    nodes: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Apply the versions to these nodes only.",
    )

    @model_validator(mode="after")
    def one_scope(self) -> LoadArguments:
        if self.group is not None and self.nodes is not None:
            raise ValueError("give a group or nodes, not both")
        return self

    def applies_to(self) -> str | list[str] | None:
        return self.group if self.group is not None else self.nodes


class EffectiveArguments(Arguments):
    type: str | None = Field(
        default=None, min_length=1, max_length=256, description="Only this configuration type."
    )


class ConfigArguments(Arguments):
    type: str = Field(min_length=1, max_length=256, description="Configuration type.")
    name: str = Field(min_length=1, max_length=256, description="Configuration name.")


class VersionArguments(ConfigArguments):
    version: str = Field(min_length=1, max_length=256, description="Version.")


class MaybeVersionArguments(ConfigArguments):
    version: str | None = Field(
        default=None, min_length=1, max_length=256, description="Version (default: all/active)."
    )


def key(args: ConfigArguments) -> dict[str, Any]:
    """The request fields of a configuration (and its version when given)."""
    out: dict[str, Any] = {"type": args.type, "name": args.name}
    version = getattr(args, "version", None)
    if version:
        out["version"] = version
    return out


# ------------------------------------------------------------ the commands
def config_list(context: CommandContext, _: NoArguments) -> dict[str, Any]:
    """Every loaded version and its state, as applied on the node that answers."""
    reply = ask(context, "config.list", {})
    return {"node": reply.get("node"), "configurations": reply.get("configurations", [])}


def config_show(context: CommandContext, args: MaybeVersionArguments) -> dict[str, Any]:
    """The versions of one configuration (or one version) with their data."""
    reply = ask(context, "config.show", key(args))
    return {"node": reply.get("node"), "versions": reply.get("versions", [])}


def config_effective(context: CommandContext, args: EffectiveArguments) -> dict[str, Any]:
    """The active versions that apply to the node that answers, with their data."""
    reply = ask(context, "config.effective", {"type": args.type} if args.type else {})
    return {"node": reply.get("node"), "configurations": reply.get("configurations", [])}


def config_load(context: CommandContext, args: LoadArguments) -> dict[str, Any]:
    """Load configuration files (and activate them) as one change."""
    files = [f.model_dump() for f in args.files]
    payload: dict[str, Any] = {"do": "load", "files": files, "activate": args.activate}
    if args.applies_to() is not None:
        payload["applies_to"] = args.applies_to()
    return change(context, payload)


def config_activate(context: CommandContext, args: VersionArguments) -> dict[str, Any]:
    """Activate a version (replacing the active one atomically)."""
    return change(context, {"do": "activate", **key(args)})


def config_deactivate(context: CommandContext, args: MaybeVersionArguments) -> dict[str, Any]:
    """Deactivate the active version (no version is active after)."""
    return change(context, {"do": "deactivate", **key(args)})


def config_remove(context: CommandContext, args: VersionArguments) -> dict[str, Any]:
    """Remove an inactive version."""
    return change(context, {"do": "remove", **key(args)})


WHICH = ("type", "name", "version")
register("config.list", config_list, permission=STATUS)
register(
    "config.show", config_show, arguments=MaybeVersionArguments, permission=STATUS, positional=WHICH
)
register(
    "config.effective",
    config_effective,
    arguments=EffectiveArguments,
    permission=STATUS,
    positional=("type",),
)
register(
    "config.load",
    config_load,
    arguments=LoadArguments,
    permission=ADMIN,
    changes=True,
    positional=("files",),
)
for _name, _handler, _arguments in (
    ("config.activate", config_activate, VersionArguments),
    ("config.deactivate", config_deactivate, MaybeVersionArguments),
    ("config.remove", config_remove, VersionArguments),
):
    register(
        _name, _handler, arguments=_arguments, permission=ADMIN, changes=True, positional=WHICH
    )


__all__ = [
    "CHANGE_WAIT",
    "ConfigFile",
    "EffectiveArguments",
    "LoadArguments",
    "MaybeVersionArguments",
    "VersionArguments",
    "ask",
    "config_activate",
    "config_deactivate",
    "config_effective",
    "config_list",
    "config_load",
    "config_remove",
    "config_show",
]
