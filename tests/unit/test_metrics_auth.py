"""Who may scrape the metrics endpoint (nonstop.node.metrics_auth through metrics_http).

A directory of three users (a monitor, an admin, a user whose only role is an
application role, which grants no ``status``), real session tokens, the real
HTTP handler on a loopback port.  The scrape of a real node with the cluster
folder's credential is tests/cluster/test_metrics_logs.py.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from tests.unit.test_metrics import BOUNDS, http

from nonstop.adminapi.principal import Directory, parse_authorization
from nonstop.adminapi.tokens import SessionTokens, session_key
from nonstop.node.metrics import DataObserver, node_registry
from nonstop.node.metrics_auth import CACHE_SECONDS, MetricsGate
from nonstop.node.metrics_http import serve_metrics

USERS: dict[str, tuple[str, list[str]]] = {
    "mo": ("pw-mo", ["monitor"]),
    "ann": ("pw-ann", ["admin"]),
    "rep": ("pw-rep", ["reports"]),  # an application role: grants nothing built in
}
TOKENS = SessionTokens(session_key(b"k" * 32), 60.0)


class Users:
    """The directory's backing store, counting password checks (the scrypt a node pays)."""

    def __init__(self) -> None:
        self.users = {name: (pw, list(roles)) for name, (pw, roles) in USERS.items()}
        self.checks = 0

    def check_password(self, user: str, password: str) -> list[str] | None:
        self.checks += 1
        entry = self.users.get(user)
        return entry[1] if entry and entry[0] == password else None

    def roles_of(self, user: str) -> list[str] | None:
        entry = self.users.get(user)
        return entry[1] if entry else None

    def directory(self, enabled: bool = True) -> Directory:
        return Directory(
            self.check_password,
            self.roles_of,
            enabled=enabled,
            password_version=lambda user: self.users.get(user, ("",))[0],
        )


def basic(user: str, password: str) -> bytes:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"Authorization: Basic {raw}\r\n".encode()


def get(auth: bytes = b"") -> bytes:
    return b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"


def run(gate: MetricsGate | None, scenario: Any) -> None:
    runtime = SimpleNamespace(router=None, machine=None, stats={})
    registry = node_registry(runtime, DataObserver(BOUNDS), process=False)

    async def main() -> None:
        server = await serve_metrics(registry, "127.0.0.1:0", gate)
        try:
            await scenario(server.port)
        finally:
            await server.stop()

    asyncio.run(main())


def test_scrapes_need_a_user_allowed_status(caplog: pytest.LogCaptureFixture) -> None:
    gate = MetricsGate(Users().directory(), TOKENS)

    async def scenario(port: int) -> None:
        status, headers, _ = await http(port, get())
        assert status == "HTTP/1.1 401 Unauthorized"
        assert headers["www-authenticate"] == 'Basic realm="nonstop"'
        status, headers, _ = await http(port, get(basic("mo", "wrong")))
        assert status.endswith("401 Unauthorized") and "www-authenticate" in headers
        assert (await http(port, get(basic("nobody", "x"))))[0].endswith("401 Unauthorized")
        junk = b"Authorization: Basic !!!\r\n"
        assert (await http(port, get(junk)))[0].endswith("401 Unauthorized")
        status, headers, _ = await http(port, get(basic("rep", "pw-rep")))
        assert status == "HTTP/1.1 403 Forbidden" and "www-authenticate" not in headers
        for user in ("mo", "ann"):
            status, _, body = await http(port, get(basic(user, f"pw-{user}")))
            assert status == "HTTP/1.1 200 OK" and b"nonstop_transactions_committed" in body
        token, _ = TOKENS.issue("mo")
        bearer = f"Authorization: Bearer {token}\r\n".encode()
        assert (await http(port, get(bearer)))[0] == "HTTP/1.1 200 OK"
        forged = f"Authorization: Bearer {token[:-2]}xx\r\n".encode()
        assert (await http(port, get(forged)))[0].endswith("401 Unauthorized")
        rep_token = f"Authorization: Bearer {TOKENS.issue('rep')[0]}\r\n".encode()
        assert (await http(port, get(rep_token)))[0].endswith("403 Forbidden")

    with caplog.at_level(logging.WARNING, logger="nonstop.metrics"):
        run(gate, scenario)
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 7
    assert any("anonymous@127.0.0.1" in m and "authentication required" in m for m in refusals)
    assert any("bad user or password (user 'mo')" in m for m in refusals)
    assert any("rep@127.0.0.1" in m and "do not grant status" in m for m in refusals)


def test_a_good_basic_credential_is_checked_once_per_minute() -> None:
    users = Users()
    now = [1000.0]
    gate = MetricsGate(users.directory(), TOKENS, clock=lambda: now[0])
    mo = basic("mo", "pw-mo")

    async def scenario(port: int) -> None:
        for _ in range(4):  # a 15 s scrape interval: one check a minute
            assert (await http(port, get(mo)))[0].endswith("200 OK")
            now[0] += 14.0
        assert users.checks == 1
        now[0] += CACHE_SECONDS
        assert (await http(port, get(mo)))[0].endswith("200 OK")
        assert users.checks == 2
        # A wrong password is never remembered, nor lets the right one's entry answer.
        for _ in range(2):
            assert (await http(port, get(basic("mo", "bad"))))[0].endswith("401 Unauthorized")
        assert users.checks == 4
        # A changed password drops the entry at once; the old password is refused.
        users.users["mo"] = ("pw-new", ["monitor"])
        assert (await http(port, get(mo)))[0].endswith("401 Unauthorized")
        assert (await http(port, get(basic("mo", "pw-new"))))[0].endswith("200 OK")
        checks = users.checks
        # A revoked role is read afresh on a hit: 403 without a new password check.
        users.users["mo"] = ("pw-new", ["reports"])
        assert (await http(port, get(basic("mo", "pw-new"))))[0].endswith("403 Forbidden")
        assert users.checks == checks
        # A removed user is refused at once.
        del users.users["mo"]
        assert (await http(port, get(basic("mo", "pw-new"))))[0].endswith("401 Unauthorized")

    run(gate, scenario)


def test_without_authentication_the_endpoint_is_open_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = MetricsGate(Users().directory(enabled=False), TOKENS)
    assert gate.open

    async def scenario(port: int) -> None:
        assert (await http(port, get()))[0] == "HTTP/1.1 200 OK"

    with caplog.at_level(logging.WARNING, logger="nonstop.metrics"):
        run(gate, scenario)
    assert any("are open ([auth] enabled = false)" in r.getMessage() for r in caplog.records)


def test_authorization_headers_are_parsed_strictly() -> None:
    raw = base64.b64encode(b"mo:pw:with:colons").decode()
    assert parse_authorization(f"Basic {raw}") == (("mo", "pw:with:colons"), None)
    assert parse_authorization("Bearer abc.def.ghi") == (None, "abc.def.ghi")
    assert parse_authorization(None) == (None, None)
    assert parse_authorization("Basic") == (None, None)
    assert parse_authorization("Basic bm9jb2xvbg==") == (None, None)  # "nocolon"
    assert parse_authorization("Digest x") == (None, None)
