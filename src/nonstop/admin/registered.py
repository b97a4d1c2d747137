"""The CLI side of the command model (docs/design/admin.md): run a registered command.

:func:`run_registered` runs a command of :data:`nonstop.commands.registry.REGISTRY`
with the context the CLI options give (:func:`context_for`) and turns its
:class:`~nonstop.commands.failure.CommandError` into the CLI's one-line error
and exit code.  The hand-written commands (``cluster status``, ``partition
enable``, ...) keep their options and human tables and call it for the data;
:func:`add_generated` gives every registered command that has no hand-written
one a generated ``click`` command (options from its arguments model, ``--json``
output), so a command registered anywhere -- the configuration commands -- is
on the CLI with the same name and arguments as on HTTP.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from nonstop.admin.cmd_cluster import Target, resolve_target, target_options
from nonstop.admin.output import FAILURE, USAGE, fail
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import REGISTRY, Command, load_all
from nonstop.net.tls import TLSConfig

EXIT_CODES = {
    "usage": USAGE,
    "refused": USAGE,
    "forbidden": FAILURE,
    "unavailable": FAILURE,
    "failed": FAILURE,
}


def context_for(target: Target, timeout: float, tls: TLSConfig | None = None) -> CommandContext:
    """The context of the CLI's target: its addresses, cluster id, TLS and credentials."""
    if tls is None or not tls.enabled:
        tls = target.tls
    options: dict[str, Any] = {"tls": tls, "credentials": target.credentials}
    if target.folder is not None:
        options["folder"] = target.folder
    return CommandContext(
        addresses=target.addresses.split(","),
        cluster=target.cluster,
        timeout=timeout,
        options=options,
    )


def refuse(exc: CommandError, target: Target | None = None) -> NoReturn:
    if exc.kind == "unavailable" and target is not None and target.folder is not None:
        fail(
            f"no node of the local cluster in {target.folder} answers ({exc.message}): "
            f"start it with `nonstop local up --dir {target.folder}`"
        )
    fail(exc.message, EXIT_CODES[exc.kind])


def run_registered(
    name: str, context: CommandContext, arguments: dict[str, Any], target: Target | None = None
) -> Any:
    """Run command ``name`` of the registry; a refusal is the CLI's one-line error."""
    cmd = load_all()[name]
    try:
        return cmd.run(context, arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
        )
        fail(f"{name}: {problems}", USAGE)
    except CommandError as exc:
        refuse(exc, target)


def generated_command(cmd: Command) -> click.Command:
    """A ``click`` command for ``cmd``: positional fields as arguments, others as options."""
    params: list[click.Parameter] = []
    for field_name, info in cmd.arguments.model_fields.items():
        many = "list" in str(info.annotation)
        if field_name in cmd.positional:
            params.append(click.Argument([field_name], nargs=-1 if many else 1))
        else:
            params.append(
                click.Option(
                    [f"--{field_name.replace('_', '-')}", field_name],
                    multiple=many,
                    required=info.is_required(),
                    help=info.description,
                )
            )

    def callback(address: str | None, folder: str | None, timeout: float, **values: Any) -> None:
        target = resolve_target(address, folder)
        given = {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items()}
        given = {k: v for k, v in given.items() if v is not None and v != []}
        data = run_registered(cmd.name, context_for(target, timeout), given, target)
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))

    generated = click.Command(
        cmd.words[-1], params=params, callback=callback, help=f"{cmd.summary} (JSON output)"
    )
    return target_options(generated)  # type: ignore[no-any-return]


def add_generated(root: click.Group) -> list[str]:
    """Give every registered command without a CLI command a generated one; their names."""
    added = []
    for cmd in load_all().values():
        group: click.Command = root
        words = cmd.words
        for word in words[:-1]:
            assert isinstance(group, click.Group)
            sub = group.commands.get(word)
            if sub is None:
                sub = click.Group(word, help=f"{word} commands")
                group.add_command(sub)
            group = sub
        assert isinstance(group, click.Group)
        if words[-1] not in group.commands:
            group.add_command(generated_command(cmd))
            added.append(cmd.name)
    return added


def cli_path(root: click.Group, cmd: Command) -> click.Command | None:
    """The CLI command of ``cmd`` (None: not on the CLI) -- the parity tests use it."""
    node: click.Command | None = root
    for word in cmd.words:
        if not isinstance(node, click.Group):
            return None
        node = node.commands.get(word)
    return node


__all__ = ["EXIT_CODES", "REGISTRY", "add_generated", "cli_path", "context_for", "run_registered"]
