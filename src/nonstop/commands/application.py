"""Application commands (G4): management commands an application module defines for itself.

In the application module (the one nodes load with ``--app``)::

    from pydantic import Field
    from nonstop.commands.application import Arguments, app_command

    class Rich(Arguments):
        minimum: int = Field(ge=0, description="Least balance listed.")

    @app_command("bank.rich", arguments=Rich, role="bank.auditor")
    def rich(tx, args):
        "The accounts holding at least MINIMUM."
        return [{"number": a.number, "balance": a.balance}
                for a in tx.query(Account) if a.balance >= args.minimum]

The name is ``TARGET.COMMAND`` (the seed's *target* groups an application's
commands); the command is ``app.TARGET.COMMAND`` of the one command model:
``POST /api/v1/app/bank/rich`` (in the OpenAPI description), a form in the
console, ``nonstop app run bank.rich minimum=5`` on the CLI.

Who may run it: ``role=`` an application role (granted by that role and by
``admin``: ``nonstop.security.roles.role_permission``), or ``permission=`` a
built-in permission (``status``, ``data``, ``admin``, ...).  The check happens
where the caller is known: the HTTP API checks the HTTP user before it sends the
command to its node; the node checks the user of a client connection (the CLI).

How it runs: on a node, in a transaction of the cluster (committed when the
function returns, rolled back when it raises, replayed on deadlock like
``@nonstop.transactional``), by ``nonstop.node.app_commands``.  An ``async def``
command is *asynchronous*: it runs on the node's event loop with an asyncio
transaction (``await tx.get(...)``, ``await tx.query(...).all()``), without a
thread and without blocking the node; a plain function runs in a worker
thread.  Both are checked, answered and listed alike (``"asynchronous"`` in
``nonstop app list``).  It returns rows:
a list of dicts (the columns are their keys, in order of first appearance), or,
as the seed puts it, a list of sequences whose first row holds the column names;
or None (no rows).  ``nonstop.Abort("why")`` refuses (HTTP 409, CLI exit 2).

This module is imported by application modules on the node (to register) and by
the front ends (to build the commands); it never imports the application.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError, ErrorKind
from nonstop.commands.registry import Arguments, Command, NoArguments
from nonstop.errors import Error
from nonstop.security.roles import GRANTS, NODE, role_permission

APP_PREFIX = "app."
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}\.[a-z][a-z0-9_]{0,31}$")
MAX_ROWS = 10_000
"""Rows one command may return (the reply is one frame; a console shows them all)."""
RUN_WAIT = 30.0
"""Seconds a front end waits for a node to run an application command."""

AppFunction = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class AppCommand:
    """One application command (module doc)."""

    name: str
    """``TARGET.COMMAND``."""
    function: AppFunction
    arguments: type[Arguments]
    permission: str
    summary: str
    changes: bool
    positional: tuple[str, ...]
    asynchronous: bool = False
    """An ``async def``: run on the node's event loop with an asyncio transaction."""

    @property
    def full_name(self) -> str:
        return APP_PREFIX + self.name

    def describe(self) -> dict[str, Any]:
        """What ``nonstop app list`` shows of it."""
        return {
            "name": self.name,
            "summary": self.summary,
            "permission": self.permission,
            "changes": self.changes,
            "asynchronous": self.asynchronous,
            "arguments": self.arguments.model_json_schema(),
        }


APP_COMMANDS: dict[str, AppCommand] = {}
"""The application commands of this process: those of the modules it imported (a node
imports its ``--app`` modules at start, so these are the node's)."""


def app_command(
    name: str,
    *,
    arguments: type[Arguments] = NoArguments,
    role: str | None = None,
    permission: str | None = None,
    changes: bool = True,
    positional: tuple[str, ...] = (),
) -> Callable[[AppFunction], AppFunction]:
    """Register ``function(tx, arguments) -> rows`` as application command ``name``
    (module doc).  Exactly one of ``role`` (an application role) and ``permission``
    (a built-in permission); ``changes``: the console asks before running it."""

    def add(function: AppFunction) -> AppFunction:
        if not NAME.match(name):
            raise ValueError(
                f"application command {name!r}: a name is TARGET.COMMAND "
                "(lower case letters, digits, _)"
            )
        if name in APP_COMMANDS:
            raise ValueError(f"application command {name!r} is defined twice")
        if (role is None) == (permission is None):
            raise ValueError(f"application command {name!r}: give role= or permission=")
        needed = role_permission(role) if role is not None else str(permission)
        if permission is not None and (
            permission == NODE or not any(permission in g for g in GRANTS.values())
        ):
            raise ValueError(f"application command {name!r}: unknown permission {permission!r}")
        if not (isinstance(arguments, type) and issubclass(arguments, Arguments)):
            raise ValueError(f"application command {name!r}: arguments must be an Arguments")
        for field in positional:
            if field not in arguments.model_fields:
                raise ValueError(f"{name}: positional {field!r} is not an argument")
        APP_COMMANDS[name] = AppCommand(
            name=name,
            function=function,
            arguments=arguments,
            permission=needed,
            summary=(function.__doc__ or name).strip().splitlines()[0],
            changes=changes,
            positional=positional,
            asynchronous=inspect.iscoroutinefunction(function),
        )
        return function

    return add


# ------------------------------------------------------------ rows
def as_rows(result: Any) -> tuple[list[str], list[list[Any]]]:
    """A command's return value → ``(columns, rows)`` (module doc); ``ValueError``."""
    if result is None:
        return [], []
    if isinstance(result, dict | str | bytes) or not hasattr(result, "__iter__"):
        raise ValueError(f"an application command returns rows (a list), not {type(result)}")
    items = list(result)
    if not items:
        return [], []
    if all(isinstance(row, dict) for row in items):
        _bounded(len(items))
        columns: list[str] = []
        for row in items:
            columns.extend(str(k) for k in row if str(k) not in columns)
        return columns, [[plain(row.get(c)) for c in columns] for row in items]
    if all(isinstance(row, list | tuple) for row in items):
        _bounded(len(items) - 1)
        columns = [str(c) for c in items[0]]
        rows = []
        for row in items[1:]:
            if len(row) != len(columns):
                raise ValueError(f"a row has {len(row)} columns, the names {len(columns)}")
            rows.append([plain(v) for v in row])
        return columns, rows
    raise ValueError("rows are all dicts, or all sequences (the first holds the column names)")


def _bounded(n: int) -> None:
    if n > MAX_ROWS:
        raise ValueError(f"returned {n} rows, more than {MAX_ROWS}")


def plain(value: Any) -> Any:
    """A cell as JSON has it: numbers, text, booleans and null as they are, else its text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# ------------------------------------------------------------ the front ends' side
REFUSALS: dict[str, ErrorKind] = {
    "BadArgument": "usage",
    "NotAuthorized": "forbidden",
    "Abort": "refused",
    "Unavailable": "unavailable",
}


def run_on_node(context: CommandContext, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Ask a node of ``context`` to run application command ``name`` (op ``app.run``); its
    answer ``{"command", "node", "columns", "rows"}``, or a :class:`CommandError`."""
    return request(context, {"op": "app.run", "command": name, "arguments": arguments})


def request(context: CommandContext, payload: dict[str, Any]) -> dict[str, Any]:
    """One application op to a node of ``context``; its answer or a :class:`CommandError`."""
    from dataclasses import replace

    # No ping first: a user with only an application role may not ping (`status`).
    with replace(context, timeout=max(context.timeout, RUN_WAIT)).client(ping=False) as client:
        try:
            reply = client.request(payload)
        except (Error, OSError) as exc:
            raise CommandError(f"{payload.get('command', 'app')}: {exc}", "unavailable") from None
    if not isinstance(reply, dict):
        raise CommandError(f"{payload['op']}: odd reply {reply!r:.80}")
    if "error" in reply:
        message = str(reply.get("message") or reply["error"])
        if reply.get("error") == "BadRequest" and "unknown op" in message:
            message = "the node does not serve application commands (an older node?)"
        raise CommandError(message, REFUSALS.get(str(reply["error"]), "failed"))
    return reply


def registry_command(app: AppCommand) -> Command:
    """``app`` as a command of the one command model: the HTTP API and the console show
    it with its arguments and permission; running it asks the node (:func:`run_on_node`)."""

    def handler(context: CommandContext, args: Arguments) -> dict[str, Any]:
        return run_on_node(context, app.name, args.model_dump(mode="json", exclude_unset=True))

    return Command(
        name=app.full_name,
        arguments=app.arguments,
        permission=app.permission,
        handler=handler,
        summary=app.summary,
        changes=app.changes,
        positional=app.positional,
        per_node=True,
    )


def application_commands() -> dict[str, Command]:
    """Every application command of this process as registry commands, by full name."""
    return {c.full_name: registry_command(c) for c in APP_COMMANDS.values()}


__all__ = [
    "APP_COMMANDS",
    "MAX_ROWS",
    "AppCommand",
    "Arguments",
    "app_command",
    "application_commands",
    "as_rows",
    "registry_command",
    "request",
    "run_on_node",
]
