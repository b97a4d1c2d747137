"""``user.add`` / ``user.passwd`` over the admin HTTP API without a cluster (G2, G5).

The real commands and app; the node is replaced by a recorder of what the handler
would send (``user_commands.ask``).  A password is taken only over TLS or on a
loopback address, turned into a verifier of that very password, refused when weak,
and never logged nor echoed.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

import nonstop.commands.user_commands as user_commands
from nonstop.adminapi.app import build_app
from nonstop.adminapi.principal import Directory
from nonstop.adminapi.tokens import SessionTokens, session_key
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import load_all
from nonstop.net.auth import Verifier, salted_password, server_key_of

USERS = {"ann": ("pw-ann", ["admin"]), "mo": ("pw-mo", ["monitor"])}
GRANTS = {"admin": {"status", "users"}, "monitor": {"status"}}
SECRET = "correct horse battery"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the commands ask the node; an unknown user is refused as the users table does."""
    asked: list[dict[str, Any]] = []

    def ask(_: CommandContext, payload: dict[str, Any]) -> dict[str, Any]:
        if payload["op"] == "user.passwd" and payload["user"] != "bob":
            raise CommandError(f"no user {payload['user']!r}", "usage")
        asked.append(payload)
        return {"ok": True}

    monkeypatch.setattr(user_commands, "ask", ask)
    return asked


def client(base_url: str) -> TestClient:
    commands = {name: cmd for name, cmd in load_all().items() if name.startswith("user.")}
    app = build_app(
        commands,
        Directory(
            lambda u, p: USERS[u][1] if USERS.get(u, ("",))[0] == p else None,
            lambda u: USERS[u][1] if u in USERS else None,
        ),
        SessionTokens(session_key(b"k" * 32), 60.0),
        lambda: CommandContext(addresses=["127.0.0.1:1"]),
        lambda roles, perm: any(perm in GRANTS.get(r, set()) for r in roles),
    )
    return TestClient(app, base_url=base_url)


def basic(user: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{USERS[user][0]}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def proves(wire: Any, password: str) -> bool:
    v = Verifier.from_wire(wire)
    return server_key_of(salted_password(password, v.salt, v.n, v.r, v.p)) == v.server_key


ADD = {"name": "bob", "roles": ["operator"], "password": SECRET}


@pytest.mark.parametrize("base_url", ["http://127.0.0.1", "http://[::1]", "https://10.1.2.3"])
def test_add_and_passwd_over_tls_or_loopback(
    base_url: str, sent: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    api = client(base_url)
    with caplog.at_level(logging.DEBUG):
        added = api.post("/api/v1/user/add", json=ADD, headers=basic("ann"))
        changed = api.post(
            "/api/v1/user/passwd",
            json={"name": "bob", "password": SECRET + "!"},
            headers=basic("ann"),
        )
    assert (added.status_code, added.json()) == (200, {"user": "bob", "roles": ["operator"]})
    assert changed.status_code == 200, changed.text
    assert [(p["op"], p["user"]) for p in sent] == [("user.add", "bob"), ("user.passwd", "bob")]
    assert sent[0]["roles"] == ["operator"] and set(sent[0]) == {"op", "user", "roles", "verifier"}
    assert proves(sent[0]["verifier"], SECRET) and not proves(sent[0]["verifier"], SECRET + "!")
    assert proves(sent[1]["verifier"], SECRET + "!")
    assert "runs user.add" in caplog.text and SECRET not in caplog.text
    assert SECRET not in added.text + changed.text


def test_a_password_over_plain_http_across_a_network_is_refused(
    sent: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    api = client("http://10.1.2.3")
    with caplog.at_level(logging.DEBUG):
        r = api.post("/api/v1/user/add", json=ADD, headers=basic("ann"))
    assert r.status_code == 403 and "HTTPS" in r.json()["detail"], r.text
    assert (
        sent == [] and SECRET not in caplog.text and "refused POST /api/v1/user/add" in caplog.text
    )
    # The other user commands carry no password: plain HTTP is as good as for the rest.
    assert api.post("/api/v1/user/remove", json={"name": "bob"}, headers=basic("ann")).is_success


def test_refusals_are_clear_and_never_echo_the_password(
    sent: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    api = client("http://127.0.0.1")
    cases = [
        ("mo", "user/add", ADD, 403, "needs permission 'users'"),
        ("ann", "user/add", {**ADD, "password": "short"}, 400, "too short: at least 8"),
        ("ann", "user/add", {**ADD, "password": ""}, 400, "too short"),
        ("ann", "user/add", {**ADD, "password": "BOB"}, 400, "too short"),
        ("ann", "user/passwd", {"name": "nobody", "password": SECRET}, 400, "no user 'nobody'"),
        ("ann", "user/passwd", {"name": "bob", "password": "Bob@Example"}, 200, ""),
    ]
    with caplog.at_level(logging.DEBUG):
        for user, path, body, status, detail in cases:
            r = api.post(f"/api/v1/{path}", json=body, headers=basic(user))
            assert r.status_code == status and detail in r.text, (body, r.text)
        same = api.post(
            "/api/v1/user/add",
            json={**ADD, "name": "longname", "password": "LongName"},
            headers=basic("ann"),
        )
        assert same.status_code == 400 and "must not be the user name" in same.json()["detail"]
        # 422: a missing name, an unknown field, a password not a string -- not echoed.
        for body in [
            {"password": SECRET, "roles": ["app"]},
            {**ADD, "extra": 1},
            {**ADD, "name": "bad name!"},
            {"name": "bob", "password": [SECRET]},
        ]:
            r = api.post("/api/v1/user/add", json=body, headers=basic("ann"))
            assert r.status_code == 422 and SECRET not in r.text, r.text
        login = api.post("/api/v1/login", json={"user": "ann", "password": SECRET * 60})
        assert login.status_code == 422 and SECRET not in login.text
    assert SECRET not in caplog.text and "Bob@Example" not in caplog.text


def test_the_console_gets_a_password_input() -> None:
    r = client("http://127.0.0.1").get("/api/v1/commands", headers=basic("ann"))
    forms = {c["name"]: c["arguments"]["properties"] for c in r.json()}
    assert forms["user.add"]["password"]["format"] == "password"
    assert forms["user.passwd"]["password"]["writeOnly"] is True
    assert set(forms["user.add"]) == {"name", "roles", "password"}
    spec = client("http://127.0.0.1").get("/api/v1/openapi.json").json()
    assert {"/api/v1/user/add", "/api/v1/user/passwd"} <= set(spec["paths"])
