"""Client connections of the real runtime: who answers each request.

A client connection (after its handshake, ``docs/design/wire.md``) carries
``{"t": "req", "id": n, "p": payload}`` frames.  Every request is first checked
against what the connection's principal (the user or node it proved to be,
``Connection.principal``) may do: the host's ``authorize`` answers a refusal
(``NotAuthorized``) that is sent instead.  Then it goes to the first of these
that takes it:

1. the runtime itself: ``ping`` and ``runtime_stats``, answered even when the
   machine is stuck;
2. the node's :class:`~nonstop.runtime.routing.Router` (the data plane's ops),
   which answers on the connection itself;
3. the machine, as a ``ClientRequest`` whose ``Reply`` comes back here
   (:meth:`ClientServer.reply`); a ``status`` reply is completed with what
   only the runtime knows (pids, addresses).

When the connection ends, the machine's requests from it are forgotten (their
replies are dropped) and the router hears of it if it took any request.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Protocol

from nonstop.net.connection import Connection
from nonstop.net.frames import FrameError
from nonstop.net.handshake import Hello
from nonstop.runtime.limits import ConnectionBounds
from nonstop.runtime.routing import Router

log = logging.getLogger("nonstop.runtime")


class ClientHost(Protocol):
    """What client serving needs of the runtime."""

    name: str
    hello: Hello
    peers: dict[str, Hello]
    addresses: dict[str, tuple[str, int]]
    router: Router | None
    bounds: ConnectionBounds
    """Counts the frames refused on client connections (``runtime/limits.py``)."""

    def new_request_id(self) -> int:
        """A request id no other request of the machine has."""
        ...

    def request_machine(self, request_id: int, payload: Any) -> None:
        """Hand ``payload`` to the machine as a ``ClientRequest``."""
        ...

    def runtime_stats(self) -> dict[str, Any]:
        """The ``runtime_stats`` reply."""
        ...

    def authorize(self, conn: Connection, payload: Any) -> Any:
        """None when ``conn``'s principal may send ``payload``, else the error reply."""
        ...


class ClientServer:
    """Serves client connections for a :class:`ClientHost` (module doc)."""

    def __init__(self, host: ClientHost) -> None:
        self.host = host
        self._requests: dict[int, tuple[Connection, Any, Any]] = {}
        """The machine's request id → (connection, the client's id, op)."""

    async def serve(self, conn: Connection) -> None:
        """Read requests from ``conn`` until it ends."""
        host = self.host
        mine: set[int] = set()
        routed = False
        backlog = host.bounds.limits.reply_backlog_bytes
        try:
            while True:
                try:
                    values = await conn.recv_many()
                except FrameError as exc:
                    host.bounds.frame_error(conn, exc, f"client {conn.remote}")
                    return
                except (OSError, EOFError, asyncio.IncompleteReadError):
                    return
                for value in values:
                    if not (isinstance(value, dict) and value.get("t") == "req"):
                        log.warning(
                            "closing client connection from %s: unknown message", conn.remote
                        )
                        return
                    client_id = value.get("id")
                    payload = value.get("p")
                    refused = host.authorize(conn, payload)
                    if refused is not None:
                        conn.send({"t": "rep", "id": client_id, "p": refused})
                        continue
                    local = self._local_request(payload)
                    if local is not None:
                        conn.send({"t": "rep", "id": client_id, "p": local})
                        continue
                    router = host.router
                    if router is not None and router.on_client(conn, client_id, payload):
                        routed = True
                        continue
                    op = payload.get("op") if isinstance(payload, dict) else None
                    rid = host.new_request_id()
                    # Registered first: the machine may reply within its handle().
                    self._requests[rid] = (conn, client_id, op)
                    mine.add(rid)
                    host.request_machine(rid, payload)
                if conn.unsent > backlog and not await host.bounds.replies_taken(conn):
                    return
        finally:
            for rid in mine:
                self._requests.pop(rid, None)
            if routed and host.router is not None:
                host.router.connection_closed(conn)

    def reply(self, request_id: int, payload: Any) -> None:
        """The machine's ``Reply``: to the connection that asked (dropped if it is gone)."""
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        conn, client_id, op = entry
        if op == "status" and isinstance(payload, dict):
            payload = self._enrich_status(payload)
            # This node's connection limits and refusal counters (issue 11).
            payload["limits"] = self.host.bounds.snapshot()
        try:
            conn.send({"t": "rep", "id": client_id, "p": payload})
        except FrameError as exc:
            log.error("reply too large: %s", exc)
            conn.send({"t": "rep", "id": client_id, "p": {"error": "ProtocolError"}})

    def _enrich_status(self, status: dict[str, Any]) -> dict[str, Any]:
        """Add what only the runtime knows (pids, addresses) to the machine's status."""
        host = self.host
        nodes = status.get("nodes")
        if isinstance(nodes, list):
            for node in nodes:
                if not isinstance(node, dict):
                    continue
                name = node.get("name")
                if name == host.name:
                    node.setdefault("pid", os.getpid())
                    if not node.get("address"):
                        node["address"] = host.hello.address
                elif name in host.peers:
                    node.setdefault("pid", host.peers[name].pid)
                    if not node.get("address") and name in host.addresses:
                        node["address"] = host.addresses[name][0]
                else:
                    node.setdefault("pid", None)
        return status

    def _local_request(self, payload: Any) -> Any:
        """Requests the runtime answers itself (they must work even if the machine is stuck)."""
        if not isinstance(payload, dict):
            return None
        op = payload.get("op")
        if op == "ping":
            hello = self.host.hello
            return {
                "name": self.host.name,
                "cluster": hello.cluster,
                "address": hello.address,
                "pid": os.getpid(),
                "protocol": [hello.proto_min, hello.proto_max],
            }
        if op == "runtime_stats":
            return self.host.runtime_stats()
        return None
