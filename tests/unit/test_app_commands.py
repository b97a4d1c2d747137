"""Application commands (G4), groups of nodes (G3) and the console's member samples, without
a node process.

The registration rules of ``app_command``; a command's rows; the permissions of
application roles; the node's service answering ``app.run`` (unknown command,
refused role, bad arguments, a transaction committed or rolled back, ``Abort``)
over an embedded database; the ``nonstop.group`` audit; the replication lag a
sample carries; ``?node=`` on the samples route.  The real cluster's surfaces (HTTP,
CLI, console) are tests/cluster/test_admin_api.py and test_console_browser.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import Field
from tests.bankmodel import Account

import nonstop
from nonstop.commands.application import AppCommand, Arguments, app_command, as_rows
from nonstop.commands.failure import CommandError
from nonstop.configuration.groups import Group
from nonstop.configuration.types import TYPES, Change, run_audits
from nonstop.net.auth import Principal
from nonstop.node.app_commands import AppCommandService
from nonstop.node.metrics_samples import Reading, SampleRing, replication_pending
from nonstop.security.roles import APPLICATION, allows, permission_of, role_permission


# ------------------------------------------------------------ registration and rows
def test_app_command_registration_rules() -> None:
    def fn(tx: Any, args: Any) -> None:
        """Doc."""

    for kwargs, message in (
        ({"role": "x"}, "a name is TARGET.COMMAND"),
        ({}, "give role= or permission="),
        ({"role": "a", "permission": "status"}, "give role= or permission="),
        ({"permission": "node"}, "unknown permission"),
        ({"permission": "root"}, "unknown permission"),
        ({"role": "Bad Role"}, "bad role name"),
    ):
        name = "nodot" if message.startswith("a name") else "t.cmd"
        with pytest.raises(ValueError, match=message):
            app_command(name, **kwargs)(fn)


def test_rows_are_dicts_or_sequences_with_a_header() -> None:
    assert as_rows(None) == ([], [])
    assert as_rows([{"a": 1}, {"b": Path("/x"), "a": 2}]) == (["a", "b"], [[1, None], [2, "/x"]])
    assert as_rows([("n", "v"), ("x", 1)]) == (["n", "v"], [["x", 1]])
    for bad, message in (
        ({"a": 1}, "returns rows"),
        ([("n", "v"), ("x",)], "a row has 1 columns"),
        ([{"a": 1}, ("x",)], "all dicts, or all sequences"),
        ([{"a": i} for i in range(10_001)], "more than 10000"),
    ):
        with pytest.raises(ValueError, match=message):
            as_rows(bad)


def test_application_roles_grant_their_commands_and_admin_grants_all() -> None:
    need = role_permission("ledger.clerk")
    assert need == "role:ledger.clerk"
    assert allows(["ledger.clerk"], need) and allows(["admin"], need)
    assert not allows(["monitor", "operator", "ledger.boss"], need)
    assert permission_of("app.run") == permission_of("app.commands") == APPLICATION
    assert allows(["ledger.clerk"], APPLICATION) and not allows([], APPLICATION)
    assert not allows(["ledger.clerk"], "status")


# ------------------------------------------------------------ the node's service
class OpenArguments(Arguments):
    number: str = Field(pattern=r"^[a-z0-9-]{1,32}$")
    balance: int = Field(ge=0)


def open_account(tx: Any, args: OpenArguments) -> list[dict[str, Any]]:
    tx.create(Account, number=args.number, balance=args.balance)
    if args.number.startswith("fail"):
        raise RuntimeError("failed after the create")
    if args.number.startswith("abort"):
        raise nonstop.Abort("closed today")
    return [{"number": args.number}]


COMMAND = AppCommand(
    "ledger.open", open_account, OpenArguments, "role:ledger.clerk", "Open.", True, ()
)


class FakeConn:
    def __init__(self, user: str) -> None:
        self.principal = Principal("user", user)
        self.remote = "127.0.0.1:1"
        self.sent: list[Any] = []

    def send(self, value: Any) -> bool:
        self.sent.append(value["p"])
        return True


def ask(service: AppCommandService, user: str, payload: dict[str, Any]) -> Any:
    conn = FakeConn(user)

    async def go() -> None:
        service.on_client(conn, 1, payload)  # type: ignore[arg-type]
        while service.running:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    return conn.sent[-1]


def test_the_node_checks_the_command_the_role_and_the_arguments_then_runs_a_transaction(
    tmp_path: Path,
) -> None:
    db = nonstop.open(str(tmp_path / "store"))
    roles = {"clerk": ["ledger.clerk"], "mo": ["monitor"]}
    service = AppCommandService("A", lambda: _Borrowed(db), roles.get, {"ledger.open": COMMAND})
    run = {"op": "app.run", "command": "ledger.open"}
    unknown = ask(service, "clerk", {**run, "command": "ledger.nope"})
    assert unknown["error"] == "BadArgument" and "its commands: ledger.open" in unknown["message"]
    refused = ask(service, "mo", {**run, "arguments": {"number": "x", "balance": 1}})
    assert refused["error"] == "NotAuthorized" and "role:ledger.clerk" in refused["message"]
    bad = ask(service, "clerk", {**run, "arguments": {"number": "x", "balance": -1}})
    assert bad["error"] == "BadArgument" and "balance: Input should be greater" in bad["message"]
    ok = ask(service, "clerk", {**run, "arguments": {"number": "ok-1", "balance": 3}})
    assert ok == {"command": "ledger.open", "node": "A", "columns": ["number"], "rows": [["ok-1"]]}
    failed = ask(service, "clerk", {**run, "arguments": {"number": "fail-1", "balance": 3}})
    assert failed["error"] == "Failed" and "failed after the create" in failed["message"]
    aborted = ask(service, "clerk", {**run, "arguments": {"number": "abort-1", "balance": 3}})
    assert aborted == {"error": "Abort", "message": "closed today"}
    with db.transaction() as tx:  # committed once, both failures rolled back
        assert sorted(a.number for a in tx.query(Account).all()) == ["ok-1"]
    assert service.counts == {"ran": 1, "failed": 1, "refused": 4}
    listing = ask(service, "mo", {"op": "app.commands"})
    assert [c["name"] for c in listing["commands"]] == ["ledger.open"]
    db.close()


class _Borrowed:
    """The embedded database as the service's opener gives a client: closed by ``with``
    (here: left open for the next command)."""

    def __init__(self, db: Any) -> None:
        self.db = db

    def __enter__(self) -> Any:
        return self.db

    def __exit__(self, *exc: object) -> None:
        return None


# ------------------------------------------------------------ groups, lag
def test_the_group_type_is_declared_and_its_audit_refuses_bad_groups() -> None:
    declared = TYPES.get("nonstop.group")
    assert declared is not None

    def verdict(name: str, nodes: list[str]) -> str | None:
        return run_audits(declared, Change("load", "nonstop.group", name, "1", Group(nodes=nodes)))

    assert verdict("east", ["A", "B"]) is None
    assert "reserved" in str(verdict("all", ["A"]))
    assert "at least one node" in str(verdict("east", []))
    assert "listed twice" in str(verdict("east", ["A", "A"]))
    assert "bad node name" in str(verdict("east", ["A B"]))


def test_a_sample_carries_the_replication_lag_of_each_active_partition() -> None:
    streams = {"p.1": {"pending": 3, "last": 9}, "p.0": {"pending": 0, "last": 2}}
    machine = SimpleNamespace(replication_status=lambda: {"replication": {"streams": streams}})
    assert replication_pending(machine) == {"p.0": 0, "p.1": 3}
    assert replication_pending(SimpleNamespace()) is None
    ring = SampleRing()
    for at, pending in ((1.0, None), (2.0, {"p.0": 4})):
        ring.add(Reading(at, 0, 0, (), (0,), 0, 0, (), (0,), pending))
    assert ring.rows_after(0)[0]["replication_pending"] == {"p.0": 4}


def test_member_samples_come_through_the_serving_node() -> None:
    from tests.unit.test_adminapi import basic
    from tests.unit.test_console_views import make_api

    from nonstop.adminapi.views import NodeViews

    asked: list[Any] = []

    def samples_of(node: str, since: float) -> dict[str, Any]:
        asked.append((node, since))
        if node == "Z":
            raise CommandError("Z is no node of this cluster", "usage")
        if node == "C":
            raise CommandError("node C does not answer", "unavailable")
        return {"node": node, "samples": []}

    views = NodeViews(samples=lambda s: {"node": "A"}, logs=lambda *a: {}, samples_of=samples_of)
    api = make_api(views)
    monitor = basic("mo", "pw-mo")
    r = api.get("/api/v1/samples?node=B&since=2", headers=monitor)
    assert r.status_code == 200 and r.json()["node"] == "B"
    assert api.get("/api/v1/samples?node=Z", headers=monitor).status_code == 404
    assert api.get("/api/v1/samples?node=C", headers=monitor).status_code == 503
    assert api.get("/api/v1/samples?node=../x", headers=monitor).status_code == 422
    assert asked == [("B", 2.0), ("Z", 0.0), ("C", 0.0)]
