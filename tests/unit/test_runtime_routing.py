"""Who serves a client op or a peer message: the runtime, the node's router, or the machine.

The runtime knows no service above the network: it offers requests and messages
to the router it was given (``nonstop.runtime.routing``), and what the router does
not take goes to the machine.  The node's own router (``nonstop.node.router``)
sends the data path's ops and messages to the data service, and answers them
clearly on a node that has none.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_transport import client_hello, free_port, hello_for

from nonstop.net.connection import Connection, dial
from nonstop.net.tls import TLSConfig
from nonstop.node.router import NodeRouter
from nonstop.runtime.interface import ALIVE, ALIVE_EVERY, Action, Event, Received
from nonstop.runtime.probe import ProbeMachine
from nonstop.runtime.real import RealRuntime, RuntimeConfig, new_rng
from nonstop.runtime.routing import Router
from nonstop.runtime.storage import ClusterStore

pytestmark = pytest.mark.timeout(30)


class RecordingMachine(ProbeMachine):
    """The probe machine, remembering every message it received."""

    def __init__(self, name: str, recovered: dict[bytes, bytes]) -> None:
        super().__init__(name, recovered, new_rng())
        self.received: list[tuple[str, Any]] = []

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Received):
            self.received.append((event.sender, event.payload))
        return super().handle(event)


class ServiceRouter:
    """Takes ops and messages named ``svc.*``; answers ops with ``{"svc": op}``."""

    def __init__(self) -> None:
        self.ops: list[Any] = []
        self.messages: list[tuple[str, Any]] = []
        self.closed: list[Connection] = []
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def on_client(self, conn: Connection, client_id: Any, payload: Any) -> bool:
        op = payload.get("op") if isinstance(payload, dict) else None
        if not (isinstance(op, str) and op.startswith("svc.")):
            return False
        self.ops.append(op)
        conn.send({"t": "rep", "id": client_id, "p": {"svc": op}})
        return True

    def connection_closed(self, conn: Connection) -> None:
        self.closed.append(conn)

    def on_peer(self, sender: str, payload: Any) -> bool:
        if isinstance(payload, dict) and str(payload.get("t", "")).startswith("svc."):
            self.messages.append((sender, payload))
            return True
        return False

    def stats(self) -> dict[str, Any]:
        return {"svc": {"ops": len(self.ops)}}


async def _runtime(tmp: Path, router: Router | None) -> tuple[RealRuntime, RecordingMachine]:
    port = free_port()
    machine: list[RecordingMachine] = []

    def factory(recovered: dict[bytes, bytes]) -> RecordingMachine:
        machine.append(RecordingMachine("A", recovered))
        return machine[0]

    rt = RealRuntime(
        hello=hello_for("A", port),
        store=ClusterStore(str(tmp / "A"), sync=False),
        machine_factory=factory,
        config=RuntimeConfig(listen=f"127.0.0.1:{port}", tls=TLSConfig()),
        router=router,
    )
    await rt.start()
    return rt, machine[0]


async def _client(rt: RealRuntime) -> Connection:
    host, port = rt.config.listen.split(":")
    return await dial(host, int(port), client_hello("t"))


async def _ask(conn: Connection, rid: int, payload: Any) -> Any:
    conn.send({"t": "req", "id": rid, "p": payload})
    reply = await asyncio.wait_for(conn.recv(), 5)
    assert reply["t"] == "rep" and reply["id"] == rid
    return reply["p"]


async def _settle(predicate: Any) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_without_a_router_every_op_reaches_the_machine(tmp_path: Path) -> None:
    async def main() -> None:
        rt, _ = await _runtime(tmp_path, None)
        try:
            conn = await _client(rt)
            # A data op on a runtime composed without any service: the machine's clear error.
            reply = await _ask(conn, 1, {"op": "tx.begin"})
            assert reply == {"error": "BadRequest", "message": "unknown op 'tx.begin'"}
            assert (await _ask(conn, 2, {"op": "status"}))["name"] == "A"
            assert "stats" in await _ask(conn, 3, {"op": "runtime_stats"})
            conn.close()
        finally:
            await rt.stop()
            rt.store.close()

    asyncio.run(main())


def test_the_router_takes_its_ops_and_the_machine_gets_the_rest(tmp_path: Path) -> None:
    router = ServiceRouter()

    async def main() -> None:
        rt, _ = await _runtime(tmp_path, router)
        assert router.started
        try:
            conn = await _client(rt)
            assert await _ask(conn, 1, {"op": "svc.get"}) == {"svc": "svc.get"}
            assert (await _ask(conn, 2, {"op": "status"}))["name"] == "A"
            assert (await _ask(conn, 3, {"op": "ping"}))["name"] == "A"  # the runtime's own
            stats = await _ask(conn, 4, {"op": "runtime_stats"})
            assert stats["svc"] == {"ops": 1}  # the router's extras
            assert router.ops == ["svc.get"]
            conn.close()
            await _settle(lambda: len(router.closed) == 1)  # it took a request of that one
            quiet = await _client(rt)
            await _ask(quiet, 1, {"op": "status"})
            quiet.close()
            await asyncio.sleep(0.05)
            assert len(router.closed) == 1  # never told of a connection it served nothing on
        finally:
            await rt.stop()
            rt.store.close()
        assert router.stopped

    asyncio.run(main())


def test_peer_messages_go_to_the_router_first_then_to_the_machine(tmp_path: Path) -> None:
    router = ServiceRouter()

    async def main() -> None:
        rt, machine = await _runtime(tmp_path, router)
        try:
            # The node's messages to itself take the same path as a peer's.
            rt.send("A", {"t": "svc.note", "n": 1})
            rt.send("A", {"k": "other"})
            await _settle(lambda: router.messages and ("A", {"k": "other"}) in machine.received)
            assert router.messages == [("A", {"t": "svc.note", "n": 1})]
            assert ("A", {"t": "svc.note", "n": 1}) not in machine.received
        finally:
            await rt.stop()
            rt.store.close()

    asyncio.run(main())


class HearingMachine(RecordingMachine):
    """A machine that asks for the runtime's liveness notes (as ``ClusterNode`` does)."""

    hears_bare_messages = True


def test_a_machine_that_asks_hears_of_the_messages_it_does_not_get(tmp_path: Path) -> None:
    """Messages the router takes, and bare ones (no envelope: replication records), are
    noted to the machine as ``{"k": "alive"}``, at most once per ``ALIVE_EVERY`` per
    sender: the failure detector's sign of life when keep-alives queue behind them."""
    router = ServiceRouter()

    async def main() -> None:
        rt, _ = await _runtime(tmp_path, router)
        machine = HearingMachine("A", {})
        rt.machine = machine
        try:
            started = asyncio.get_running_loop().time()
            for n in range(50):
                rt.send("A", {"t": "svc.note", "n": n})
            await _settle(lambda: len(router.messages) == 50)
            took = asyncio.get_running_loop().time() - started
            alive = [m for m in machine.received if m == ("A", {"k": ALIVE})]
            assert 1 <= len(alive) <= 1 + int(took / ALIVE_EVERY) < 50
            await asyncio.sleep(ALIVE_EVERY * 1.5)
            notes = len(alive)
            rt.send("A", {"t": "rep.x"})  # bare, for the machine itself
            await _settle(lambda: ("A", {"t": "rep.x"}) in machine.received)
            assert machine.received.count(("A", {"k": ALIVE})) == notes + 1
            await asyncio.sleep(ALIVE_EVERY * 1.5)
            rt.send("A", {"k": "fd", "en": True, "b": {}})  # an envelope: no note needed
            await _settle(lambda: ("A", {"k": "fd", "en": True, "b": {}}) in machine.received)
            assert machine.received.count(("A", {"k": ALIVE})) == notes + 1
        finally:
            await rt.stop()
            rt.store.close()

    asyncio.run(main())


def test_a_machine_that_does_not_ask_gets_no_notes(tmp_path: Path) -> None:
    router = ServiceRouter()

    async def main() -> None:
        rt, machine = await _runtime(tmp_path, router)
        try:
            rt.send("A", {"t": "svc.note", "n": 1})
            rt.send("A", {"t": "rep.x"})
            await _settle(lambda: router.messages and ("A", {"t": "rep.x"}) in machine.received)
            assert ("A", {"k": ALIVE}) not in machine.received
        finally:
            await rt.stop()
            rt.store.close()

    asyncio.run(main())


# ------------------------------------------------------------ the node's router
class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.closed = False

    def send(self, value: Any) -> bool:
        self.sent.append(value)
        return True


class FakeDataService:
    def __init__(self) -> None:
        self.stats = {"client_ops": 0}
        self.calls: list[tuple[str, Any]] = []

    def start(self) -> None:
        self.calls.append(("start", None))

    async def stop(self) -> None:
        self.calls.append(("stop", None))

    def on_client(self, conn: Any, client_id: Any, payload: dict[str, Any]) -> None:
        self.stats["client_ops"] += 1
        self.calls.append(("client", payload["op"]))

    def connection_closed(self, conn: Any) -> None:
        self.calls.append(("closed", conn))

    def on_peer(self, sender: str, payload: dict[str, Any]) -> None:
        self.calls.append(("peer", payload["t"]))


class FakeDb:
    """What the router reads of the object store: its commit stats and its object count."""

    def __init__(self, objects: int = 3) -> None:
        self.objects = objects

    def stats(self) -> dict[str, int]:
        return {"commits": 7}

    def object_count(self) -> int:
        return self.objects


def test_the_node_router_sends_the_data_path_to_the_data_service() -> None:
    data = FakeDataService()
    router = NodeRouter("A", data, FakeDb())
    conn = FakeConn()
    router.start()
    for op in ("tx.begin", "bulk.scan", "nodes", "request.result"):
        assert router.on_client(conn, 1, {"op": op})  # type: ignore[arg-type]
    assert not router.on_client(conn, 2, {"op": "status"})  # type: ignore[arg-type]
    assert not router.on_client(conn, 3, "not a dict")  # type: ignore[arg-type]
    assert router.on_peer("B", {"t": "data.req", "id": 1})
    assert not router.on_peer("B", {"k": "fd"})
    router.connection_closed(conn)  # type: ignore[arg-type]
    asyncio.run(router.stop())
    assert data.calls == [
        ("start", None),
        ("client", "tx.begin"),
        ("client", "bulk.scan"),
        ("client", "nodes"),
        ("client", "request.result"),
        ("peer", "data.req"),
        ("closed", conn),
        ("stop", None),
    ]
    assert conn.sent == []  # the service answers itself
    assert router.stats() == {
        "data": {"client_ops": 4},
        "store": {"commits": 7},
        "objects": 3,
        "locks": {},
    }


def test_a_node_without_a_data_service_answers_data_ops_with_a_clear_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    router = NodeRouter("A", None)
    conn = FakeConn()
    assert router.on_client(conn, 5, {"op": "tx.begin"})  # type: ignore[arg-type]
    [reply] = conn.sent
    assert reply["t"] == "rep" and reply["id"] == 5
    assert reply["p"]["error"] == "Unavailable"
    assert "no object store" in reply["p"]["message"] and "tx.begin" in reply["p"]["message"]
    # The machine's ops are not the router's business.
    assert not router.on_client(conn, 6, {"op": "status"})  # type: ignore[arg-type]
    # A data message nobody here can serve: dropped, with one log line per kind.
    with caplog.at_level(logging.WARNING, logger="nonstop.node"):
        assert router.on_peer("B", {"t": "data.req", "id": 1})
        assert router.on_peer("B", {"t": "data.req", "id": 2})
    lines = [r.getMessage() for r in caplog.records if "data.req" in r.getMessage()]
    assert len(lines) == 1 and "from B" in lines[0] and "no data service" in lines[0]
    assert not router.on_peer("B", {"k": "fd"})
    assert router.stats() == {"data": {}, "store": {}, "objects": None, "locks": {}}
