"""An in-process fake of the node side of the data path (data-path.md §3), for client tests.

It answers the ``tx.*`` ops with an embedded :class:`nonstop.Database` (one
embedded transaction per session) and plugs into the real clients through
their ``_dial`` hook, so the client code under test is the real one, minus
the sockets.  It is deliberately small: one store for every fake "node", no
scopes, no two-phase commit.  Knobs let tests lose a commit reply, kill the
node, inject an error, or change what types the node knows.

:class:`FakeServer` puts a fake node on a real loopback socket behind the real
handshake, for what happens before any request: refusals, refused ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
from typing import Any

import nonstop
from nonstop.errors import (
    BadArgument,
    Conflict,
    Error,
    TransactionClosed,
    TypeVersionMismatch,
    UnknownType,
)
from nonstop.model.codec import pack, unpack
from nonstop.model.managed import Managed, TypeInfo, lookup_type
from nonstop.model.ref import Ref
from nonstop.model.wire import error_out, obj_out, write_in
from nonstop.net.connection import Connection, accept
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN, ROLE_NODE, Hello, location_code
from nonstop.net.tls import TLSConfig, server_context


class FakeHello:
    def __init__(self, name: str) -> None:
        self.name = name


class FakeNode:
    """One fake node serving the data ops over ``db``."""

    def __init__(self, db: nonstop.Database, name: str, address: str, names: list[str]) -> None:
        self.db = db
        self.name = name
        self.address = address
        self.names = names
        self.up = True
        self.sessions: dict[int, tuple[Any, nonstop.Transaction]] = {}
        self.results: dict[tuple[str, int], dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.log: list[dict[str, Any]] = []
        self.commits = 0
        self.drop_commit_reply = False
        self.running_polls = 0  # answer "running" to this many request.result polls
        self.inject: dict[str, list[Error]] = {}  # op -> errors to raise, in order
        self.hidden_types: set[str] = set()
        self.versions: dict[str, int] = {}
        self.dials = 0
        self.delay: dict[str, float] = {}  # op -> seconds before the next one is answered

    # ---------------------------------------------------------- serving
    def handle(self, conn: Any, p: dict[str, Any]) -> Any:
        self.log.append(p)
        try:
            errs = self.inject.get(p.get("op", ""))
            if errs:
                if p.get("op") == "tx.commit":  # a refused commit rolls the session back
                    entry = self.sessions.pop(p["s"], None)
                    if entry is not None:
                        entry[1].rollback()
                    error = error_out(errs[0])  # recorded as the node does
                    self.results[tuple(p["req"])] = {
                        "state": "aborted",
                        "result": [error["error"], error["message"]],
                    }
                raise errs.pop(0)
            return self._op(conn, p)
        except Exception as exc:
            return error_out(exc)

    def lost(self, conn: Any) -> None:
        """A connection closed: its sessions roll back (B8)."""
        for s, (owner, tx) in list(self.sessions.items()):
            if owner is conn:
                tx.rollback()
                del self.sessions[s]

    def ops(self, name: str) -> list[dict[str, Any]]:
        return [p for p in self.log if p.get("op") == name]

    def _info(self, p: dict[str, Any]) -> TypeInfo:
        name = p["type"]
        if name in self.hidden_types:
            raise UnknownType(f"{name} is not known on {self.name}")
        info = lookup_type(name)
        version = self.versions.get(name, info.version)
        if p.get("tv") != version:
            raise TypeVersionMismatch(f"{name}: node has version {version}, client {p.get('tv')}")
        return info

    def _tx(self, conn: Any, p: dict[str, Any]) -> nonstop.Transaction:
        entry = self.sessions.get(p.get("s"))  # type: ignore[arg-type]
        if entry is None or entry[0] is not conn or not entry[1].active:
            raise TransactionClosed(f"no session {p.get('s')}")
        return entry[1]

    def _handles(self, tx: nonstop.Transaction, info: TypeInfo, state: dict[str, Any]) -> Any:
        out = dict(state)
        for name in info.ref_fields:
            if isinstance(out.get(name), Ref):
                out[name] = tx.by_ref(out[name])
        return out

    def _apply(self, tx: nonstop.Transaction, p: dict[str, Any]) -> None:
        for w in p.get("w") or []:
            ref, type_name, version, changes = write_in(w)
            obj = tx.by_ref(Ref(ref), lock="write")
            if obj is None:
                raise Conflict(f"{type_name} object was deleted")
            if version and obj._e.version != version:
                raise Conflict(f"{type_name} changed since the client read it")
            for name, value in self._handles(tx, obj._e.info, changes).items():
                setattr(obj, name, value)

    @staticmethod
    def _out(obj: Managed | None) -> Any:
        if obj is None:
            return None
        e = obj._e
        return obj_out(e.ref, e.info.name, e.version, e.state)

    def _op(self, conn: Any, p: dict[str, Any]) -> Any:
        op = p.get("op")
        if op != "tx.begin" and p.get("s") is None and "begin" in p:
            s = self._op(conn, {"op": "tx.begin", "iso": p["begin"]})["s"]
            try:
                reply = self._op(conn, {**p, "s": s})
            except Error as exc:
                reply = error_out(exc)
            return {**reply, "s": s}
        if op == "tx.begin":
            iso = {"serializable": "serializable", "read_committed": "snapshot"}[p["iso"]]
            tx = self.db.transaction(iso, lock_timeout=0.3).__enter__()
            s = next(self.ids)
            self.sessions[s] = (conn, tx)
            return {"s": s}
        if op == "ping":
            return {"name": self.name}
        if op == "request.result":
            if self.running_polls > 0:
                self.running_polls -= 1
                return {"state": "running", "result": None}
            return self.results.get(tuple(p["req"]), {"state": "unknown", "result": None})
        if op == "nodes":
            nodes = [{"name": n, "address": "", "location": 0, "up": True} for n in self.names]
            return {"nodes": nodes}
        tx = self._tx(conn, p)
        if op == "tx.get":
            info = self._info(p)
            self._apply(tx, p)
            return {"o": self._out(tx.find(info.cls, lock=p.get("lock"), **unpack(p["key"])))}
        if op == "tx.ref":
            return {"o": self._out(tx.by_ref(Ref(p["ref"]), lock=p.get("lock")))}
        if op == "tx.create":
            info = self._info(p)
            if p.get("node") is not None and p["node"] not in self.names:
                raise BadArgument(f"no node {p['node']!r}")
            state = self._handles(tx, info, unpack(p["st"]))
            return {"o": self._out(tx.create(info.cls, **state))}
        if op == "tx.query":
            info = self._info(p)
            self._apply(tx, p)
            scope = p.get("scope")
            if isinstance(scope, list) and set(scope) - set(self.names):
                raise BadArgument(f"unknown node in scope {scope}")
            q = tx.query(info.cls).where(**unpack(p["where"]))
            if p.get("range") is not None:
                field, lo, hi, lo_inc, hi_inc = unpack(p["range"])
                q.range(field, lo, hi, inclusive=(lo_inc, hi_inc))
            if p.get("order") is not None:
                q.order_by(p["order"][0], descending=p["order"][1])
            q.lock(p.get("lock"))
            if p.get("limit") is not None:
                q.limit(p["limit"])
            found = [self._out(o) for o in q.all()]
            if scope == "cluster" and len(self.names) > 1:
                found = found + found  # two nodes answered for every object
            return {"os": found}
        if op == "tx.count":
            return {"n": tx.count(self._info(p).cls)}
        if op == "tx.delete":
            self._apply(tx, p)
            tx.delete(tx.by_ref(Ref(p["ref"])))  # type: ignore[arg-type]
            return {}
        if op == "tx.call":
            self._apply(tx, p)
            obj = tx.by_ref(Ref(p["ref"]))
            args, kwargs = unpack(p["a"])
            result = getattr(obj, p["m"])(*args, **kwargs)
            touched = [self._out(e.handle) for e in list(tx._entries.values()) if e.handle]
            return {"r": pack(result), "os": touched}
        if op == "tx.commit":
            req = tuple(p["req"]) if p.get("req") else None
            try:
                self._apply(tx, p)
                tx.commit()
            except Error as exc:
                tx.rollback()
                if req:
                    error = error_out(exc)
                    self.results[req] = {
                        "state": "aborted",
                        "result": [error["error"], error["message"]],
                    }
                raise
            finally:
                self.sessions.pop(p["s"], None)
            self.commits += 1
            if req:
                self.results[req] = {"state": "committed", "result": None}
            return {"ok": True}
        if op == "tx.rollback":
            tx.rollback()
            self.sessions.pop(p["s"], None)
            return {}
        raise BadArgument(f"unknown op {op!r}")


class FakeSyncChannel:
    """Stands in for :class:`nonstop.client.channel.SyncChannel`."""

    def __init__(self, node: FakeNode) -> None:
        if not node.up:
            raise ConnectionRefusedError(f"{node.address} is down")
        node.dials += 1
        self.fake = node
        self.address = node.address
        self.node = FakeHello(node.name)
        self.closed = False

    def call(self, payload: Any, timeout: float) -> Any:
        if self.closed or not self.fake.up:
            self.close()
            raise ConnectionResetError(f"{self.address} is gone")
        reply = self.fake.handle(self, payload)
        if not self.fake.up:  # died before the reply left
            self.close()
            raise ConnectionResetError(f"{self.address} died")
        if payload.get("op") == "tx.commit" and self.fake.drop_commit_reply:
            self.fake.drop_commit_reply = False
            self.close()
            raise ConnectionResetError("reply lost")
        return reply

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fake.lost(self)

    def gone_while_idle(self) -> bool:
        return self.closed


class FakeAsyncChannel:
    """Stands in for :class:`nonstop.client.channel.AsyncChannel` (replies after a loop turn)."""

    def __init__(self, node: FakeNode) -> None:
        if not node.up:
            raise ConnectionRefusedError(f"{node.address} is down")
        node.dials += 1
        self.fake = node
        self.address = node.address
        self.node = FakeHello(node.name)
        self.closed = False
        self.in_flight = 0
        self.max_in_flight = 0

    async def call(self, payload: Any, timeout: float) -> Any:
        if self.closed or not self.fake.up:
            self.close()
            raise ConnectionResetError(f"{self.address} is gone")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            # Other tasks' requests are in flight meanwhile.
            async with asyncio.timeout(timeout):  # as AsyncChannel: no reply in time
                await asyncio.sleep(self.fake.delay.pop(payload.get("op"), 0.001))
        finally:
            self.in_flight -= 1
        if self.closed or not self.fake.up:
            self.close()
            raise ConnectionResetError(f"{self.address} is gone")
        reply = self.fake.handle(self, payload)
        if not self.fake.up:  # died before the reply left
            self.close()
            raise ConnectionResetError(f"{self.address} died")
        if payload.get("op") == "tx.commit" and self.fake.drop_commit_reply:
            self.fake.drop_commit_reply = False
            self.close()
            raise ConnectionResetError("reply lost")
        return reply

    def send_nowait(self, payload: Any) -> None:
        if not self.closed and self.fake.up:
            self.fake.handle(self, payload)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.fake.lost(self)

    async def aclose(self) -> None:
        self.close()


class FakeCluster:
    """Fake nodes sharing one store; ``client()`` / ``async_client()`` talk to them."""

    def __init__(self, db: nonstop.Database, names: list[str]) -> None:
        self.nodes = {
            n: FakeNode(db, n, f"127.0.0.1:{7100 + i}", names) for i, n in enumerate(names)
        }
        self.by_address = {node.address: node for node in self.nodes.values()}

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes.values()]

    def client(self, **options: Any) -> nonstop.Client:
        """A blocking client of the fake nodes; n1 first (``balance="first"``: the tests
        watch n1 and fail over from it) unless ``balance`` says otherwise."""
        by_address = self.by_address
        options.setdefault("balance", "first")

        class _Client(nonstop.Client):
            def _dial(self, address: str) -> Any:
                return FakeSyncChannel(by_address[address])

        return _Client(self.addresses, **options)

    def async_client(self, **options: Any) -> nonstop.AsyncClient:
        """The asyncio twin of :meth:`client` (n1 first unless ``balance`` says otherwise)."""
        by_address = self.by_address
        options.setdefault("balance", "first")
        made: list[FakeAsyncChannel] = []

        class _AsyncClient(nonstop.AsyncClient):
            channels = made

            async def _dial(self, address: str) -> Any:
                chan = FakeAsyncChannel(by_address[address])
                made.append(chan)
                return chan

        return _AsyncClient(self.addresses, **options)


class FakeServer:
    """A fake node on a real loopback socket: the node's handshake
    (:func:`nonstop.net.connection.accept`), then requests answered by ``node``.

    It runs its own event loop on a thread, so blocking and asyncio clients
    alike dial it.  ``accepted`` counts the connections that reached it
    (with ``tls``: that completed the TLS handshake).
    """

    def __init__(
        self,
        node: FakeNode,
        *,
        cluster: str = "c1",
        protocol: tuple[int, int] = (PROTOCOL_MIN, PROTOCOL_MAX),
        tls: TLSConfig | None = None,
    ) -> None:
        self.node = node
        self.tls = tls
        self.hello = Hello(
            cluster=cluster,
            name=node.name,
            location=location_code(node.name),
            timestamp=1,
            proto_min=protocol[0],
            proto_max=protocol[1],
            role=ROLE_NODE,
        )
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.address = ""

    def __enter__(self) -> FakeServer:
        self._thread.start()
        self.address = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _listen(self) -> str:
        context = None if self.tls is None else server_context(self.tls)
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        conn = Connection(reader, writer)
        with contextlib.suppress(Exception):
            await accept(conn, self.hello)
            while True:
                frame = await conn.recv()
                if isinstance(frame, dict) and frame.get("t") == "req":
                    reply = self.node.handle(conn, frame["p"])
                    conn.send({"t": "rep", "id": frame["id"], "p": reply})
        await conn.aclose()


def refused_address() -> str:
    """A loopback address nobody listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"
