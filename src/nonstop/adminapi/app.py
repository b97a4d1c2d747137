"""The admin HTTP API as a FastAPI application, built from the command registry.

Routes (docs/operations.md "Admin API"):

* ``POST /api/v1/<group>/<command>`` for every registered command
  (``partition.enable`` → ``/api/v1/partition/enable``), JSON body = the
  command's arguments model, answer = the command's JSON result; the
  application commands of the node's modules among them (``/api/v1/app/...``);
  a command that answers per node takes ``?group=NAME``: it runs on every node
  of that group of nodes, one result each (``nonstop.commands.groups``);
* ``POST /api/v1/login`` ``{"user", "password"}`` → a session token;
* ``GET /api/v1/whoami``, ``GET /api/v1/commands`` (what the console shows);
* ``GET /api/v1/samples``, ``GET /api/v1/logs``: the console's views of this
  node's recent metrics and log (:mod:`.views`);
* ``GET /api/v1/openapi.json`` (and the Swagger page at ``/api/v1/docs``);
* ``GET /`` and ``/console/...``: the web console's static files.

Every command needs a user: HTTP basic (scripts) or ``Authorization: Bearer
<token>`` (the console, :mod:`.tokens`); 401 without a valid one, 403 when the
user's roles do not grant the command's permission (``nonstop.security.roles``).
A malformed body is 422, a body over the limit 413 (:mod:`.body_limit`), an
unknown command or file 404.  Every refusal is logged with who and what.

A command with a password among its arguments (``user.add``, ``user.passwd``:
:attr:`Command.secret_fields`) is taken only over TLS or on a loopback address of
the node (:func:`private_channel`), else 403: the password would cross a network
in clear text.  Passwords are never logged nor echoed (masked in the log line of
the command, left out of the 422 details).
"""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at run time,
# and they name closures (the authentication dependency) a string could not resolve.

import inspect
import ipaddress
import logging
from collections.abc import Callable
from importlib import resources
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from fastapi.security import (
    HTTPAuthorizationCredentials,
    HTTPBasic,
    HTTPBasicCredentials,
    HTTPBearer,
)
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from nonstop.adminapi.body_limit import BodyLimit
from nonstop.adminapi.principal import Directory, NotAuthenticated, Principal
from nonstop.adminapi.principal import authenticate as check_credentials
from nonstop.adminapi.tokens import SessionTokens
from nonstop.adminapi.views import NodeViews, add_view_routes
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.groups import GROUP_NAME, UnknownGroup, run_on_group
from nonstop.commands.registry import Command, NoArguments

log = logging.getLogger("nonstop.adminapi")

PREFIX = "/api/v1"
STATUS_OF_KIND = {
    "usage": 400,
    "refused": 409,
    "forbidden": 403,
    "unavailable": 503,
    "failed": 500,
}
DEFAULT_BODY_LIMIT = 64 * 1024
MASK = "**********"
SECRET_KEYS = frozenset({"password"})
"""Body fields never echoed in a 422 answer (the login's password, the commands' secrets)."""

basic = HTTPBasic(auto_error=False, description="A user of the cluster (scripts).")
bearer = HTTPBearer(auto_error=False, description="A session token from POST /api/v1/login.")


class Login(BaseModel):
    user: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=1024)


class Session(BaseModel):
    token: str
    user: str
    roles: list[str]
    expires: float


class Refusal(BaseModel):
    detail: str


def who(request: Request, principal: Principal | None = None) -> str:
    peer = request.client.host if request.client else "?"
    return f"{principal.user if principal else 'anonymous'}@{peer}"


def private_channel(request: Request) -> bool:
    """Whether this request came over TLS or to a loopback address of the node (the local
    end of the connection: a client on another host cannot reach a loopback address)."""
    if request.url.scheme == "https":
        return True
    server = request.scope.get("server")
    host = str(server[0]) if server else ""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def build_app(
    commands: dict[str, Command],
    directory: Directory,
    tokens: SessionTokens,
    context: Callable[[], CommandContext],
    allows: Callable[[list[str], str], bool],
    *,
    node: str = "",
    body_limit: int = DEFAULT_BODY_LIMIT,
    views: NodeViews | None = None,
) -> Any:
    """The ASGI application (FastAPI wrapped in the body limit); ``views``: the node's
    samples and logs for the console (:mod:`.views`; None: no such routes)."""
    app = FastAPI(
        title="nonstop admin API",
        version="1",
        description="Administrative commands of a nonstop cluster (docs/operations.md).",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=f"{PREFIX}/docs",
        redoc_url=None,
        # Any route may answer these: an unreadable body, no or a bad credential, too large.
        responses={
            400: {"model": Refusal, "description": "Unreadable body or bad arguments"},
            401: {"model": Refusal, "description": "No, or a bad, credential or token"},
            413: {"model": Refusal, "description": "Body over the limit (admin.max_body)"},
        },
    )

    def refuse(
        request: Request, status: int, detail: str, principal: Principal | None = None
    ) -> HTTPException:
        log.warning(
            "admin api: refused %s %s for %s: %s",
            request.method,
            request.url.path,
            who(request, principal),
            detail,
        )
        headers = {"WWW-Authenticate": 'Basic realm="nonstop", Bearer'} if status == 401 else None
        if status == 503:
            headers = {"Retry-After": "1"}
        return HTTPException(status_code=status, detail=detail, headers=headers)

    def authenticate(
        request: Request,
        basic_credentials: Annotated[HTTPBasicCredentials | None, Depends(basic)],
        bearer_credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        """The one authentication dependency: basic or bearer → :class:`Principal`, else 401
        (the check itself is :func:`nonstop.adminapi.principal.authenticate`)."""
        try:
            return check_credentials(
                directory,
                tokens,
                None
                if basic_credentials is None
                else (basic_credentials.username, basic_credentials.password),
                None if bearer_credentials is None else bearer_credentials.credentials,
            )
        except NotAuthenticated as exc:
            raise refuse(request, exc.status, str(exc)) from None

    @app.exception_handler(StarletteHTTPException)
    async def not_found(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 401/403 and the commands' refusals were logged where they were raised; log the
        # routing's own refusals here (an unknown command, a file outside the console).
        if exc.status_code in (404, 405):
            log.warning(
                "admin api: refused %s %s for %s: %s",
                request.method,
                request.url.path,
                who(request),
                exc.detail,
            )
        return JSONResponse(
            status_code=exc.status_code, content={"detail": exc.detail}, headers=exc.headers
        )

    secrets = SECRET_KEYS.union(*(cmd.secret_fields for cmd in commands.values()))

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        log.warning(
            "admin api: refused %s %s from %s: malformed request (%d problems)",
            request.method,
            request.url.path,
            who(request),
            len(errors),
        )
        return JSONResponse(status_code=422, content={"detail": _jsonable(errors, secrets)})

    @app.post(
        f"{PREFIX}/login",
        response_model=Session,
        tags=["session"],
        summary="Log in: a session token for the console",
    )
    def login(request: Request, body: Login) -> Session:
        roles = (
            directory.check_password(body.user, body.password) if directory.enabled else ["admin"]
        )
        if roles is None:
            raise refuse(request, 401, f"bad user or password (user {body.user!r})")
        token, expires = tokens.issue(body.user)
        log.info(
            "admin api: %s logged in (roles %s)",
            who(request, Principal(body.user, tuple(roles), "basic")),
            ",".join(roles),
        )
        return Session(token=token, user=body.user, roles=list(roles), expires=expires)

    @app.get(f"{PREFIX}/whoami", tags=["session"], summary="The user and roles of the request")
    def whoami(principal: Annotated[Principal, Depends(authenticate)]) -> dict[str, Any]:
        return {"user": principal.user, "roles": list(principal.roles), "node": node}

    @app.get(
        f"{PREFIX}/commands", tags=["session"], summary="The commands, and which this user may run"
    )
    def listing(principal: Annotated[Principal, Depends(authenticate)]) -> list[dict[str, Any]]:
        return [
            {
                "name": cmd.name,
                "path": f"{PREFIX}/{'/'.join(cmd.words)}",
                "summary": cmd.summary,
                "permission": cmd.permission,
                "changes": cmd.changes,
                "per_node": cmd.per_node,
                "allowed": allows(list(principal.roles), cmd.permission),
                "arguments": cmd.arguments.model_json_schema(),
            }
            for cmd in commands.values()
        ]

    for cmd in commands.values():
        _add_command_route(app, cmd, authenticate, refuse, context, allows)
    if views is not None:
        add_view_routes(app, views, PREFIX, authenticate, refuse, allows)

    console = resources.files("nonstop.adminapi") / "console"
    app.mount("/console", StaticFiles(directory=str(console), html=True), name="console")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/console/")

    return BodyLimit(app, body_limit)


def _add_command_route(
    app: FastAPI,
    cmd: Command,
    authenticate: Callable[..., Principal],
    refuse: Callable[..., HTTPException],
    context: Callable[[], CommandContext],
    allows: Callable[[list[str], str], bool],
) -> None:
    def run(request: Request, principal: Principal, body: Any, group: str | None = None) -> Any:
        if not allows(list(principal.roles), cmd.permission):
            raise refuse(
                request,
                403,
                f"{cmd.name} needs permission {cmd.permission!r}; "
                f"roles {','.join(principal.roles)} do not grant it",
                principal,
            )
        if cmd.secret_fields and not private_channel(request):
            raise refuse(
                request,
                403,
                f"{cmd.name} carries a password: send it over HTTPS (the node's TLS) or to "
                "a loopback address of the node, never plain HTTP across a network "
                "(docs/security.md)",
                principal,
            )
        if not cmd.per_node and "group" in request.query_params:
            raise refuse(
                request,
                400,
                f"{cmd.name} changes the cluster once, not per node: run it without a group",
                principal,
            )
        arguments = {} if body is None else body.model_dump(exclude_unset=True)
        # A change is logged as an event; a read at debug (the console asks for the
        # cluster status every 2 s: at info, that would be most of a node's log).
        log.log(
            logging.INFO if cmd.changes else logging.DEBUG,
            "admin api: %s runs %s %s%s",
            who(request, principal),
            cmd.name,
            arguments,
            f" on group {group}" if group else "",
        )
        try:
            if group is not None:
                parsed = cmd.arguments.model_validate(arguments)
                return run_on_group(
                    context(), group, lambda ctx: cmd.handler(ctx, parsed), cmd.name
                )
            return cmd.run(context(), arguments)
        except ValidationError as exc:  # only if the model changed between checks
            raise refuse(request, 422, str(exc), principal) from None
        except UnknownGroup as exc:
            raise refuse(request, 404, exc.message, principal) from None
        except CommandError as exc:
            raise refuse(request, STATUS_OF_KIND[exc.kind], exc.message, principal) from None

    optional = cmd.arguments is NoArguments or not any(
        f.is_required() for f in cmd.arguments.model_fields.values()
    )
    body_default = Body(default=None) if optional else Body()
    body_type: Any = cmd.arguments | None if optional else cmd.arguments

    def endpoint(request: Request, principal: Principal, body: Any, group: Any = None) -> Any:
        return run(request, principal, body, group)

    # A command whose answer depends on the node asked may run on every node of a group.
    grouping = (
        [
            inspect.Parameter(
                "group",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=str | None,
                default=Query(
                    default=None,
                    pattern=GROUP_NAME,
                    description="Run it on every node of this group (`all`: every member); "
                    "one result per node (docs/operations.md).",
                ),
            )
        ]
        if cmd.per_node
        else []
    )
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
            inspect.Parameter(
                "principal",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=Annotated[Principal, Depends(authenticate)],
            ),
            inspect.Parameter(
                "body",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=body_type,
                default=body_default,
            ),
            *grouping,
        ]
    )
    app.add_api_route(
        f"{PREFIX}/{'/'.join(cmd.words)}",
        endpoint,
        methods=["POST"],
        name=cmd.name,
        operation_id=cmd.name.replace(".", "_"),
        summary=cmd.summary,
        description=f"Permission: `{cmd.permission}`."
        + (" Changes the cluster." if cmd.changes else ""),
        tags=[cmd.words[0]],
        responses={
            403: {"model": Refusal},
            409: {"model": Refusal},
            413: {"model": Refusal},
            503: {"model": Refusal},
            **({404: {"model": Refusal, "description": "No such group"}} if cmd.per_node else {}),
        },
    )


def _jsonable(errors: Any, secrets: frozenset[str] = SECRET_KEYS) -> Any:
    """Validation errors without the raw input objects pydantic may attach (bytes,
    exceptions), and without any password they held (the fields named in ``secrets``)."""
    out = []
    for e in errors:
        out.append(
            {
                k: (v if k in ("loc", "msg", "type") else _masked(e.get("loc", ()), v, secrets))
                for k, v in e.items()
                if k in ("loc", "msg", "type", "input")
            }
        )
    return out


def _masked(loc: Any, value: Any, secrets: frozenset[str]) -> str:
    """The input of a validation error as text, a password in it masked."""
    if any(part in secrets for part in loc):
        return MASK
    if isinstance(value, dict):
        value = {k: (MASK if k in secrets else v) for k, v in value.items()}
    return str(value)


__all__ = ["PREFIX", "build_app"]
