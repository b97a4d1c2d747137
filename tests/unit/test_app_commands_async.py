"""Asynchronous application commands (G4): an ``async def`` command runs on the node's loop.

The node's service (``nonstop.node.app_commands``) over an embedded database: an
``async def`` command runs as a task of the loop that took the request (no worker
thread), and the loop keeps serving while it waits -- here a second command that
the first one waits for runs meanwhile; the same role and argument checks as a
plain command; committed when it returns, rolled back when it raises, ``Abort``
refused.  The real node (HTTP, CLI) is tests/cluster/test_admin_api.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import Field
from tests.bankmodel import Account
from tests.unit.test_app_commands import FakeConn

import nonstop
from nonstop.commands.application import AppCommand, Arguments
from nonstop.node.app_commands import AppCommandService


class Open(Arguments):
    number: str = Field(pattern=r"^[a-z0-9-]{1,16}$")
    wait: bool = False


GATE: dict[str, asyncio.Event] = {}
THREADS: list[int] = []


async def open_account(tx: Any, args: Open) -> list[dict[str, Any]]:
    THREADS.append(threading.get_ident())
    await tx.create(Account, number=args.number, balance=1)
    if args.wait:
        await asyncio.wait_for(GATE["go"].wait(), 10)  # the loop must run the releaser
    if args.number.startswith("fail"):
        raise RuntimeError("failed after the create")
    if args.number.startswith("abort"):
        raise nonstop.Abort("not today")
    return [{"number": args.number}]


async def release(tx: Any, args: Open) -> None:
    GATE["go"].set()


def command(name: str, function: Any, permission: str) -> AppCommand:
    return AppCommand(name, function, Open, permission, name, True, (), asynchronous=True)


COMMANDS = {
    "ledger.open": command("ledger.open", open_account, "role:ledger.clerk"),
    "ledger.release": command("ledger.release", release, "role:ledger.clerk"),
}


def test_an_async_command_runs_on_the_loop_without_blocking_it(tmp_path: Path) -> None:
    db = nonstop.open(str(tmp_path / "store"))

    @asynccontextmanager
    async def borrowed() -> AsyncIterator[Any]:
        yield db  # the embedded database stands for the node's asyncio client

    def no_threads() -> Any:
        raise AssertionError("an async command must not take the blocking opener")

    roles = {"clerk": ["ledger.clerk"], "mo": ["monitor"]}
    service = AppCommandService("A", no_threads, roles.get, COMMANDS, async_opener=borrowed)
    run = {"op": "app.run"}

    async def scenario() -> list[Any]:
        GATE["go"] = asyncio.Event()
        loop_thread = threading.get_ident()
        conns = [FakeConn(user) for user in ("clerk", "clerk", "mo", "clerk", "clerk", "clerk")]
        asks = [
            {"command": "ledger.open", "arguments": {"number": "w-1", "wait": True}},
            {"command": "ledger.release", "arguments": {"number": "x"}},
            {"command": "ledger.open", "arguments": {"number": "m-1"}},  # a monitor
            {"command": "ledger.open", "arguments": {"number": "BAD"}},
            {"command": "ledger.open", "arguments": {"number": "fail-1"}},
            {"command": "ledger.open", "arguments": {"number": "abort-1"}},
        ]
        for i, (conn, ask) in enumerate(zip(conns, asks, strict=True)):
            service.on_client(conn, i, {**run, **ask})  # type: ignore[arg-type]
        async with asyncio.timeout(20):
            while service.running:
                await asyncio.sleep(0.01)
        assert set(THREADS) == {loop_thread}  # every run on the loop's own thread
        return [conn.sent[-1] for conn in conns]

    waited, released, monitor, bad, failed, aborted = asyncio.run(scenario())
    assert waited == {
        "command": "ledger.open",
        "node": "A",
        "columns": ["number"],
        "rows": [["w-1"]],
    }
    assert released == {"command": "ledger.release", "node": "A", "columns": [], "rows": []}
    assert monitor["error"] == "NotAuthorized" and "role:ledger.clerk" in monitor["message"]
    assert bad["error"] == "BadArgument" and "number" in bad["message"]
    assert failed["error"] == "Failed" and "failed after the create" in failed["message"]
    assert aborted == {"error": "Abort", "message": "not today"}
    with db.transaction() as tx:  # committed once; the failure and the abort rolled back
        assert sorted(a.number for a in tx.query(Account).all()) == ["w-1"]
    assert service.counts == {"ran": 2, "failed": 1, "refused": 3}
    listing = service.commands["ledger.open"].describe()
    assert listing["asynchronous"] is True
    db.close()


def test_a_node_without_an_async_client_says_so(tmp_path: Path) -> None:
    service = AppCommandService("A", lambda: None, None, COMMANDS)
    conn = FakeConn("clerk")

    async def go() -> None:
        ask = {"op": "app.run", "command": "ledger.release", "arguments": {"number": "x"}}
        service.on_client(conn, 1, ask)  # type: ignore[arg-type]
        while service.running:
            await asyncio.sleep(0.01)

    asyncio.run(go())
    assert conn.sent[-1]["error"] == "Unavailable"
    assert "runs no asynchronous commands" in conn.sent[-1]["message"]
