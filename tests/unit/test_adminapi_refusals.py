"""Issue 11's "Bad input and attacks" on the admin HTTP API, one by one (G2, G5).

Each is refused with the status a client expects, logged (what, which path, who),
nothing applied (the changing command never ran), and the API keeps serving.
The app is the real one (tests/unit/test_adminapi.py's users and grants), with a
changing command that records every run.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tests.unit.test_adminapi import COMMANDS, KEY, basic, bearer, client_of

from nonstop.adminapi.tokens import SessionTokens, session_key
from nonstop.commands.context import CommandContext
from nonstop.commands.registry import Command

RAN: list[dict[str, Any]] = []


def recorded_flip(_: CommandContext, args: Any) -> dict[str, Any]:
    RAN.append(args.model_dump())
    return {"flipped": args.name}


@pytest.fixture
def api() -> TestClient:
    RAN.clear()
    flip = COMMANDS["thing.flip"]
    commands = {
        **COMMANDS,
        "thing.flip": Command(flip.name, flip.arguments, "admin", recorded_flip, "Flip.", True),
    }
    return client_of(commands)


ADMIN = basic("ann", "pw-ann")
FLIP = "/api/v1/thing/flip"


def token(issued_at: float | None = None, key: bytes = KEY) -> str:
    return SessionTokens(key, 60.0).issue("ann", now=issued_at)[0]


def forged() -> str:
    version, _, mac = token().split(".")
    longer = base64.urlsafe_b64encode(b'{"u": "ann", "exp": 9999999999}').decode().rstrip("=")
    return f"{version}.{longer}.{mac}"


def chunks() -> Any:
    for _ in range(10):
        yield b"y" * 500


ATTEMPTS: list[tuple[str, Callable[[TestClient], Any], int, str]] = [
    (
        "wrong password",
        lambda c: c.post(FLIP, json={"name": "a"}, headers=basic("ann", "nope")),
        401,
        "refused POST /api/v1/thing/flip for anonymous@",
    ),
    (
        "unknown user",
        lambda c: c.post(FLIP, json={"name": "a"}, headers=basic("mallory", "x")),
        401,
        "bad user or password (user 'mallory')",
    ),
    (
        "expired token",
        lambda c: c.post(FLIP, json={"name": "a"}, headers=bearer(token(issued_at=0.0))),
        401,
        "expired",
    ),
    (
        "forged token",
        lambda c: c.post(FLIP, json={"name": "a"}, headers=bearer(forged())),
        401,
        "refused POST /api/v1/thing/flip for anonymous@",
    ),
    (
        "token of another cluster",
        lambda c: c.post(
            FLIP, json={"name": "a"}, headers=bearer(token(key=session_key(b"o" * 32)))
        ),
        401,
        "refused POST /api/v1/thing/flip for anonymous@",
    ),
    (
        "a monitor runs an admin command",
        lambda c: c.post(FLIP, json={"name": "a"}, headers=basic("mo", "pw-mo")),
        403,
        "refused POST /api/v1/thing/flip for mo@",
    ),
    (
        "malformed body",
        lambda c: c.post(
            FLIP, content=b"{not json", headers={**ADMIN, "Content-Type": "application/json"}
        ),
        422,
        "refused POST /api/v1/thing/flip from anonymous@testclient: malformed request",
    ),
    (
        "huge body",
        lambda c: c.post(FLIP, content=b"x" * 5000, headers=ADMIN),
        413,
        "admin api: refused",
    ),
    (
        "huge chunked body",
        lambda c: c.post(FLIP, content=chunks(), headers=ADMIN),
        413,
        "chunked body over 1024 bytes",
    ),
    (
        "path traversal on the console",
        lambda c: c.get("/console/%2e%2e/%2e%2e/pyproject.toml"),
        404,
        "refused GET /console/../../pyproject.toml for anonymous@",
    ),
]


@pytest.mark.parametrize(
    ("what", "attempt", "status", "logged"), ATTEMPTS, ids=[a[0] for a in ATTEMPTS]
)
def test_each_attempt_is_refused_logged_and_changes_nothing(
    api: TestClient,
    caplog: pytest.LogCaptureFixture,
    what: str,
    attempt: Callable[[TestClient], Any],
    status: int,
    logged: str,
) -> None:
    caplog.set_level("INFO", logger="nonstop")
    answer = attempt(api)
    assert answer.status_code == status, (what, answer.text)
    assert "detail" in answer.json(), what  # a reason a client can show
    assert logged in caplog.text, (what, caplog.text)
    assert RAN == [], what  # nothing applied
    served = api.post(FLIP, json={"name": "ok"}, headers=ADMIN)  # and it keeps serving
    assert served.status_code == 200 and RAN == [{"name": "ok", "on": []}]
