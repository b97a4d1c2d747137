"""The console's views of the node that serves it: recent metric samples and log lines.

Two ``GET`` routes beside the commands (they are not registered commands: they
read this node's process, not the cluster, like ``nonstop logs`` reads local
files):

* ``GET /api/v1/samples?since=T`` (permission ``status``): the node's samples
  taken after ``T`` (epoch seconds), one a second for the last five minutes at
  most (``nonstop.node.metrics_samples``); ``&node=B``: member B's samples,
  which this node asks B for over the node port (op ``samples``), so that one
  console charts every node through the node that serves it;
* ``GET /api/v1/logs?level=L&limit=N&contains=S`` (permission ``admin``): the
  newest ``N`` (at most 500) events of the node's log file at level ``L`` or
  above containing ``S`` (``nonstop.node.log_tail``).

Why ``admin`` for logs: a node's log says who ran which command with which
arguments (``config.load`` carries whole configuration files), who failed to
log in from where, and the peers' addresses; ``status`` is the monitor role's,
meant for dashboards and scrapers, which need the numbers, not that.

The node supplies the readers (:class:`NodeViews`); this module only checks
the caller, bounds the query and answers JSON.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at run time.

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request

from nonstop.adminapi.principal import Principal
from nonstop.commands.failure import CommandError
from nonstop.security.roles import ADMIN_OPS, STATUS

NODE_NAME = r"^[A-Za-z0-9_.@-]{1,64}$"
SAMPLES_PERMISSION = STATUS
LOGS_PERMISSION = ADMIN_OPS
MAX_LOG_LINES = 500
MAX_FILTER = 200

REFUSED: dict[int | str, dict[str, Any]] = {
    403: {"description": "The user's roles do not grant the permission"},
    404: {"description": "No such member (samples of another node)"},
    503: {"description": "The member does not answer, or keeps no samples"},
}

Level = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@dataclass(frozen=True)
class NodeViews:
    """What the node gives the console to read (each runs in a worker thread)."""

    samples: Callable[[float], dict[str, Any]]
    """``since`` → ``{"node", "interval", "capacity", "samples": [...]}``."""
    logs: Callable[[str | None, int, str], dict[str, Any]]
    """``(level, limit, contains)`` → ``{"available", "file", "events": [...]}``."""
    samples_of: Callable[[str, float], dict[str, Any]] | None = None
    """``(node, since)`` → another member's samples, fetched by this node (None: only its
    own); raises :class:`~nonstop.commands.failure.CommandError` when it cannot."""


def add_view_routes(
    app: FastAPI,
    views: NodeViews,
    prefix: str,
    authenticate: Callable[..., Principal],
    refuse: Callable[..., HTTPException],
    allows: Callable[[list[str], str], bool],
) -> None:
    """The two routes of the module doc, on ``app``."""

    def check(request: Request, principal: Principal, permission: str, what: str) -> None:
        if not allows(list(principal.roles), permission):
            raise refuse(
                request,
                403,
                f"{what} needs permission {permission!r}; "
                f"roles {','.join(principal.roles)} do not grant it",
                principal,
            )

    @app.get(
        f"{prefix}/samples",
        tags=["console"],
        summary="This node's recent metric samples (commits/s, latency, group commits)",
        description=f"Permission: `{SAMPLES_PERMISSION}`.",
        responses=REFUSED,
    )
    def samples(
        request: Request,
        principal: Annotated[Principal, Depends(authenticate)],
        since: Annotated[float, Query(ge=0, le=1e11, description="epoch seconds")] = 0.0,
        node: Annotated[
            str | None,
            Query(pattern=NODE_NAME, description="another member: its samples, through this node"),
        ] = None,
    ) -> dict[str, Any]:
        check(request, principal, SAMPLES_PERMISSION, "samples")
        if node is None or views.samples_of is None:
            return views.samples(since)
        try:
            return views.samples_of(node, since)
        except CommandError as exc:
            status = 404 if exc.kind == "usage" else 503
            raise refuse(request, status, exc.message, principal) from None

    @app.get(
        f"{prefix}/logs",
        tags=["console"],
        summary="The newest events of this node's log",
        description=f"Permission: `{LOGS_PERMISSION}` (logs name users, commands and "
        "their arguments).",
        responses=REFUSED,
    )
    def logs(
        request: Request,
        principal: Annotated[Principal, Depends(authenticate)],
        level: Annotated[Level | None, Query(description="least level shown")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LOG_LINES)] = 100,
        contains: Annotated[str, Query(max_length=MAX_FILTER)] = "",
    ) -> dict[str, Any]:
        check(request, principal, LOGS_PERMISSION, "logs")
        return views.logs(level, limit, contains)


__all__ = ["LOGS_PERMISSION", "MAX_LOG_LINES", "SAMPLES_PERMISSION", "NodeViews", "add_view_routes"]
