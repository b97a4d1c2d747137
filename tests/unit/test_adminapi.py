"""The admin HTTP API without a cluster: authentication, roles and bad input (G2, G5).

A registry of two fake commands, a directory of two users; the real app, tokens,
body limit and static files (Starlette's test client drives the ASGI app).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import Field

from nonstop.adminapi.app import build_app
from nonstop.adminapi.principal import Directory
from nonstop.adminapi.tokens import BadToken, SessionTokens, session_key
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import REGISTRY, Arguments, Command, NoArguments

USERS = {"ann": ("pw-ann", ["admin"]), "mo": ("pw-mo", ["monitor"])}
GRANTS = {"admin": {"status", "admin"}, "monitor": {"status"}}


class Flip(Arguments):
    name: str = Field(pattern=r"^[a-z]{1,8}$")
    on: list[str] = Field(default_factory=list, max_length=4)


def look(_: CommandContext, __: NoArguments) -> dict[str, Any]:
    return {"nodes": ["A", "B"]}


def flip(_: CommandContext, args: Flip) -> dict[str, Any]:
    if args.name == "nope":
        raise CommandError("partition 'nope' is not defined", "usage")
    return {"flipped": args.name, "on": args.on}


COMMANDS = {
    "thing.look": Command("thing.look", NoArguments, "status", look, "Look."),
    "thing.flip": Command("thing.flip", Flip, "admin", flip, "Flip.", changes=True),
}


def check_password(user: str, password: str) -> list[str] | None:
    entry = USERS.get(user)
    return entry[1] if entry and entry[0] == password else None


def roles_of(user: str) -> list[str] | None:
    entry = USERS.get(user)
    return entry[1] if entry else None


KEY = session_key(b"k" * 32)


@pytest.fixture
def api() -> TestClient:
    return client_of(COMMANDS)


def client_of(commands: dict[str, Command]) -> TestClient:
    """The real app over ``commands``, USERS and GRANTS, a 1 KiB body limit."""
    app = build_app(
        commands,
        Directory(check_password, roles_of),
        SessionTokens(KEY, 60.0),
        lambda: CommandContext(addresses=["127.0.0.1:1"]),
        lambda roles, perm: any(perm in GRANTS.get(r, set()) for r in roles),
        body_limit=1024,
    )
    return TestClient(app)


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_command_runs_with_basic_and_with_a_token(api: TestClient) -> None:
    r = api.post("/api/v1/thing/look", headers=basic("mo", "pw-mo"))
    assert (r.status_code, r.json()) == (200, {"nodes": ["A", "B"]})
    login = api.post("/api/v1/login", json={"user": "ann", "password": "pw-ann"})
    assert login.status_code == 200 and login.json()["roles"] == ["admin"]
    r = api.post("/api/v1/thing/flip", json={"name": "px"}, headers=bearer(login.json()["token"]))
    assert (r.status_code, r.json()) == (200, {"flipped": "px", "on": []})


def test_refusals_have_the_status_a_client_expects(
    api: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    assert api.post("/api/v1/thing/look").status_code == 401
    assert api.post("/api/v1/thing/look", headers=basic("mo", "wrong")).status_code == 401
    assert api.post("/api/v1/thing/look", headers=basic("nobody", "x")).status_code == 401
    bad_login = api.post("/api/v1/login", json={"user": "ann", "password": "wrong"})
    assert bad_login.status_code == 401
    r = api.post("/api/v1/thing/flip", json={"name": "px"}, headers=basic("mo", "pw-mo"))
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    admin = basic("ann", "pw-ann")
    assert api.post("/api/v1/thing/flip", json={"name": "PX!"}, headers=admin).status_code == 422
    assert api.post("/api/v1/thing/flip", json={"nam": "px"}, headers=admin).status_code == 422
    assert (
        api.post(
            "/api/v1/thing/flip",
            content=b"{not json",
            headers={**admin, "Content-Type": "application/json"},
        ).status_code
        == 422
    )
    r = api.post("/api/v1/thing/flip", json={"name": "nope"}, headers=admin)
    assert r.status_code == 400 and "not defined" in r.json()["detail"]
    assert api.post("/api/v1/thing/nothing", headers=admin).status_code == 404
    huge = api.post("/api/v1/thing/flip", content=b"x" * 5000, headers=admin)
    assert huge.status_code == 413

    def chunks() -> Any:
        for _ in range(10):
            yield b"y" * 500

    assert api.post("/api/v1/thing/flip", content=chunks(), headers=admin).status_code == 413
    text = caplog.text
    assert "refused POST /api/v1/thing/flip for mo@" in text
    assert "bad user or password (user 'nobody')" in text
    assert "refused POST /api/v1/thing/nothing for anonymous@" in text


def test_forged_expired_and_foreign_tokens_are_401(api: TestClient) -> None:
    tokens = SessionTokens(KEY, 60.0)
    good, _ = tokens.issue("ann")
    assert (
        api.post("/api/v1/thing/flip", json={"name": "a"}, headers=bearer(good)).status_code == 200
    )
    version, payload, mac = good.split(".")
    forged_payload = (
        base64.urlsafe_b64encode(b'{"u": "ann", "exp": 9999999999}').decode().rstrip("=")
    )
    for token in (
        f"{version}.{forged_payload}.{mac}",  # a longer expiry, same signature
        f"{version}.{payload}.{mac[:-2]}AA",  # a changed signature
        SessionTokens(session_key(b"other cluster secret"), 60.0).issue("ann")[0],
        tokens.issue("ann", now=0.0)[0],  # expired in 1970
        "garbage",
    ):
        r = api.post("/api/v1/thing/look", headers=bearer(token))
        assert r.status_code == 401, token
    with pytest.raises(BadToken, match="expired"):
        tokens.verify(tokens.issue("ann", now=100.0)[0], now=161.0)


def test_static_files_and_traversal(api: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    page = api.get("/console/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    for path in (
        "/console/../app.py",
        "/console/%2e%2e/app.py",
        "/console/..%2f..%2fpyproject.toml",
        "/console/%2e%2e%2f%2e%2e%2f%2e%2e%2fetc/passwd",
        "/console//etc/passwd",
    ):
        r = api.get(path)
        assert r.status_code == 404, path
        assert "import" not in r.text and "root:" not in r.text
    assert "refused GET /console/../../../etc/passwd for anonymous@" in caplog.text


def test_openapi_describes_every_command(api: TestClient) -> None:
    spec = api.get("/api/v1/openapi.json").json()
    assert {"/api/v1/thing/look", "/api/v1/thing/flip", "/api/v1/login"} <= set(spec["paths"])
    flip_body = spec["paths"]["/api/v1/thing/flip"]["post"]["requestBody"]
    assert flip_body["required"] is True
    schemes = spec["components"]["securitySchemes"]
    assert {"HTTPBasic", "HTTPBearer"} <= set(schemes)


def test_commands_listing_says_what_the_user_may_run(api: TestClient) -> None:
    r = api.get("/api/v1/commands", headers=basic("mo", "pw-mo"))
    allowed = {c["name"]: c["allowed"] for c in r.json()}
    assert allowed == {"thing.look": True, "thing.flip": False}


def test_registry_is_untouched_by_the_fake_commands() -> None:
    assert "thing.look" not in REGISTRY
