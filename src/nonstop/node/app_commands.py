"""Run application commands on this node (G4): the ops ``app.run`` and ``app.commands``.

The commands are those the node's application modules registered
(``nonstop.commands.application``).  ``app.run {command, arguments}``:

1. the command must exist on this node (else ``BadArgument`` naming those that do);
2. the connection's user must hold its permission -- an application role, or a
   built-in permission (``nonstop.security.roles.allows``); else ``NotAuthorized``,
   logged with who and what.  The op itself needs only a role (``application``):
   this is the check that matters;
3. the arguments must validate against its model (else ``BadArgument`` with
   pydantic's one-line reasons);
4. the function runs in a transaction of the cluster opened through this
   node's own address as the node's bootstrap admin (the command, not its
   caller, decides what it reads and writes, as a stored procedure would):
   committed when it returns, rolled back when it raises, replayed on
   deadlock; ``nonstop.Abort`` is answered as ``Abort`` (refused), any other
   exception as a failure with its one line.  A plain function runs in a
   worker thread with a blocking client (it may block); an ``async def`` runs
   as a task on the node's own event loop with an asyncio client (it must not
   block: it awaits its reads and writes, and the node serves everything else
   meanwhile) -- same roles, same transaction, same answers.

At most :data:`MAX_RUNNING` commands run at once on a node; another is answered
``Unavailable`` (busy) rather than queued without bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from pydantic import ValidationError

from nonstop import errors
from nonstop.commands.application import APP_COMMANDS, AppCommand, as_rows
from nonstop.model.wire import error_out
from nonstop.net.auth import SCHEME_NODE, SCHEME_USER
from nonstop.net.connection import Connection
from nonstop.security.roles import allows
from nonstop.tx.runner import run_with_retries, run_with_retries_async

log = logging.getLogger("nonstop.node")

MAX_RUNNING = 4
MAX_RETRIES = 20
"""Replays of a command's transaction on deadlock or conflict before it fails."""

Opener = Callable[[], Any]
"""A new blocking client of the cluster through this node (closed after the command)."""
AsyncOpener = Callable[[], AbstractAsyncContextManager[Any]]
"""A new asyncio client of the cluster through this node, for ``async with`` (closed after
the command): what an ``async def`` command's transaction runs on."""


class AppCommandService:
    """Answers ``app.run`` and ``app.commands`` (module doc)."""

    def __init__(
        self,
        node: str,
        opener: Opener,
        roles_of: Callable[[str], list[str] | None] | None,
        commands: dict[str, AppCommand] | None = None,
        async_opener: AsyncOpener | None = None,
    ) -> None:
        self.node = node
        self.opener = opener
        self.async_opener = async_opener
        self.roles_of = roles_of
        """None: this node authenticates no one (every caller may run every command)."""
        self.commands = APP_COMMANDS if commands is None else commands
        self.running = 0
        self.counts = {"ran": 0, "failed": 0, "refused": 0}
        self._tasks: set[asyncio.Task[None]] = set()

    def on_client(self, conn: Connection, client_id: Any, payload: dict[str, Any]) -> None:
        op = payload.get("op")
        if op == "app.commands":
            listing = [c.describe() for c in sorted(self.commands.values(), key=lambda c: c.name)]
            self._reply(conn, client_id, {"node": self.node, "commands": listing})
            return
        try:
            cmd, arguments = self._admit(conn, payload)
        except errors.Error as exc:
            self.counts["refused"] += 1
            self._reply(conn, client_id, error_out(exc))
            return
        self.running += 1
        task = asyncio.ensure_future(self._run(conn, client_id, cmd, arguments))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _admit(self, conn: Connection, payload: dict[str, Any]) -> tuple[AppCommand, Any]:
        name = payload.get("command")
        cmd = self.commands.get(name) if isinstance(name, str) else None
        if cmd is None:
            known = ", ".join(sorted(self.commands)) or "none: it loads no application commands"
            raise errors.BadArgument(
                f"unknown application command {str(name)[:80]!r} on node {self.node} "
                f"(its commands: {known})"
            )
        who, roles = self._caller(conn)
        if roles is not None and not allows(roles, cmd.permission):
            log.warning(
                "refused application command %s to %s (roles %s) at %s: it needs %s",
                cmd.name,
                who,
                ",".join(roles) or "none",
                conn.remote,
                cmd.permission,
            )
            raise errors.NotAuthorized(
                f"user {who!r} (roles {', '.join(roles) or 'none'}) may not run "
                f"{cmd.name}: it needs {cmd.permission!r}"
            )
        raw = payload.get("arguments") or {}
        try:
            arguments = cmd.arguments.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise errors.BadArgument(f"{cmd.name}: {problems}") from None
        if self.running >= MAX_RUNNING:
            raise errors.Unavailable(
                f"node {self.node} runs {self.running} application commands already: retry"
            )
        log.info("%s runs application command %s %s", who, cmd.name, raw)
        return cmd, arguments

    def _caller(self, conn: Connection) -> tuple[str, list[str] | None]:
        """Who sent it, and their roles (None: no check -- a member, or no authentication)."""
        principal = conn.principal
        if self.roles_of is None or principal.kind in (SCHEME_NODE, "open"):
            return principal.name or "anonymous", None
        if principal.kind == SCHEME_USER:
            return principal.name, self.roles_of(principal.name) or []
        return principal.name, []

    async def _run(self, conn: Connection, client_id: Any, cmd: AppCommand, arguments: Any) -> None:
        try:
            if cmd.asynchronous:
                reply = await self.execute_async(cmd, arguments)
            else:
                reply = await asyncio.to_thread(self.execute, cmd, arguments)
        finally:
            self.running -= 1
        self._reply(conn, client_id, reply)

    def execute(self, cmd: AppCommand, arguments: Any) -> dict[str, Any]:
        """Run ``cmd`` in a transaction (worker thread); the reply payload."""
        try:
            with self.opener() as cluster:
                result = run_with_retries(cluster, cmd.function, arguments, max_retries=MAX_RETRIES)
            columns, rows = as_rows(result)
        except Exception as exc:
            return self._failure(cmd, exc)
        return self._ran(cmd, columns, rows)

    async def execute_async(self, cmd: AppCommand, arguments: Any) -> dict[str, Any]:
        """Run ``async def`` command ``cmd`` in a transaction on this loop; the reply payload."""
        try:
            if self.async_opener is None:
                raise errors.Unavailable(f"node {self.node} runs no asynchronous commands")
            async with self.async_opener() as cluster:
                result = await run_with_retries_async(
                    cluster, cmd.function, arguments, max_retries=MAX_RETRIES
                )
            columns, rows = as_rows(result)
        except Exception as exc:
            return self._failure(cmd, exc)
        return self._ran(cmd, columns, rows)

    def _failure(self, cmd: AppCommand, exc: Exception) -> dict[str, Any]:
        """The reply to a command that raised ``exc`` (its transaction rolled back)."""
        if isinstance(exc, errors.Abort):
            self.counts["refused"] += 1
            return error_out(exc)
        self.counts["failed"] += 1
        log.warning("application command %s failed (rolled back): %r", cmd.name, exc)
        if isinstance(exc, errors.Error):
            return error_out(exc)
        return {"error": "Failed", "message": f"{cmd.name}: {type(exc).__name__}: {exc}"}

    def _ran(self, cmd: AppCommand, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
        self.counts["ran"] += 1
        return {"command": cmd.name, "node": self.node, "columns": columns, "rows": rows}

    @staticmethod
    def _reply(conn: Connection, client_id: Any, payload: dict[str, Any]) -> None:
        conn.send({"t": "rep", "id": client_id, "p": payload})


__all__ = ["MAX_RUNNING", "AppCommandService"]
