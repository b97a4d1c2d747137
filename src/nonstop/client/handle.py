"""Client handles: talk to a cluster through any of its nodes, fail over when one dies.

``nonstop.connect("h:p,h:p")`` returns a :class:`Client` (blocking sockets, no
event loop needed, safe to use from scripts and the CLI);
``await nonstop.connect_async(...)`` returns an :class:`AsyncClient` (asyncio).
Both speak the client role of the wire protocol (``docs/design/wire.md``).

Fail-over: a request goes to the node the handle is connected to; when that
node cannot be reached or stops answering within ``timeout``, the handle tries
the next address, and so on for at most ``rounds`` passes over the list, then
raises :class:`nonstop.errors.Unavailable`.  A node that answers
``QuorumLost`` (it is Disabled, D16) is skipped the same way: another node may
still have quorum.  Requests here are admin requests, which are idempotent
(status) or checked by the cluster (join/leave of a known name), so sending
one again to another node is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import ssl
import time
from typing import Any

from nonstop.errors import ClusterError, NotLeader, ProtocolError, QuorumLost, Unavailable
from nonstop.net.connection import Connection, dial
from nonstop.net.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN, ROLE_CLIENT, Hello, check
from nonstop.net.tls import TLSConfig, client_context

DEFAULT_TIMEOUT = 5.0


def parse_addresses(addresses: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"a:1,b:2"`` or a sequence → a non-empty list of ``host:port``."""
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise ValueError("no node address given")
    for a in out:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"not a host:port address: {a!r}")
    return out


def _client_hello(cluster: str, protocol: tuple[int, int] = (PROTOCOL_MIN, PROTOCOL_MAX)) -> Hello:
    return Hello(
        cluster=cluster,
        name=f"client-{os.getpid()}",
        location=0,
        timestamp=0,
        proto_min=protocol[0],
        proto_max=protocol[1],
        role=ROLE_CLIENT,
        pid=os.getpid(),
    )


def raise_for_error(reply: Any) -> Any:
    """Turn an ``{"error": ...}`` reply into the matching :mod:`nonstop.errors` exception."""
    if isinstance(reply, dict) and "error" in reply:
        name = reply.get("error")
        message = str(reply.get("message") or name)
        if name == "QuorumLost":
            raise QuorumLost(message)
        if name == "NotLeader":
            raise NotLeader(message, reply.get("leader"))
        if name == "Unavailable":
            raise Unavailable(message)
        raise ClusterError(f"{name}: {message}")
    return reply


class _Fatal(Exception):
    """Not worth trying another node (the request itself is wrong)."""


class Client:
    """A blocking handle on a cluster (see module docstring)."""

    def __init__(
        self,
        addresses: str | list[str],
        *,
        cluster: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        rounds: int = 2,
        tls: TLSConfig | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.cluster = cluster
        self.timeout = timeout
        self.rounds = rounds
        self.max_frame = max_frame
        self._ssl: ssl.SSLContext | None = client_context(tls) if tls and tls.enabled else None
        self._index = 0
        self._sock: socket.socket | None = None
        self._decoder: FrameDecoder | None = None
        self._ids = itertools.count(1)
        self.node: Hello | None = None
        """The hello of the node currently connected to."""

    # ------------------------------------------------------------ plumbing
    @property
    def address(self) -> str:
        """The address of the node requests go to now."""
        return self.addresses[self._index]

    def _connect(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=host.strip("[]"))
            self._sock = sock
            self._decoder = FrameDecoder(self.max_frame)
            ours = _client_hello(self.cluster)
            sock.sendall(encode(ours.to_wire(), self.max_frame))
            answer = self._recv()
            if isinstance(answer, dict) and answer.get("t") == "reject":
                raise _Fatal(f"{answer.get('code')}: {answer.get('reason')}")
            try:
                theirs = Hello.from_wire(answer)
            except ValueError as exc:
                raise ProtocolError(f"{address}: {exc}") from exc
            _, rejection = check(ours, theirs)
            if rejection is not None:
                raise _Fatal(f"{rejection.code}: {rejection.reason}")
            self.node = theirs
        except BaseException:
            self.close()
            raise

    def _recv(self) -> Any:
        assert self._sock is not None and self._decoder is not None
        pending: list[Any] = getattr(self, "_pending", [])
        self._pending = pending
        while not pending:
            data = self._sock.recv(256 * 1024)
            if not data:
                raise EOFError("node closed the connection")
            pending.extend(self._decoder.feed(data))
        return pending.pop(0)

    def _roundtrip(self, payload: Any) -> Any:
        if self._sock is None:
            self._connect(self.address)
        assert self._sock is not None
        rid = next(self._ids)
        self._sock.sendall(encode({"t": "req", "id": rid, "p": payload}, self.max_frame))
        deadline = time.monotonic() + self.timeout
        while True:
            self._sock.settimeout(max(0.01, deadline - time.monotonic()))
            value = self._recv()
            if isinstance(value, dict) and value.get("t") == "rep" and value.get("id") == rid:
                return value.get("p")

    def request(self, payload: Any) -> Any:
        """Send one request, failing over across the addresses; the raw reply payload."""
        last: BaseException | None = None
        quorum_lost: QuorumLost | None = None
        for _ in range(self.rounds):
            for _ in range(len(self.addresses)):
                try:
                    reply = self._roundtrip(payload)
                except _Fatal as exc:
                    raise ProtocolError(f"{self.address} refused the connection: {exc}") from exc
                except (OSError, EOFError, FrameError, ProtocolError, TimeoutError) as exc:
                    last = exc
                    self.close()
                    self._index = (self._index + 1) % len(self.addresses)
                    continue
                if isinstance(reply, dict) and reply.get("error") == "QuorumLost":
                    quorum_lost = QuorumLost(str(reply.get("message")))
                    self.close()
                    self._index = (self._index + 1) % len(self.addresses)
                    continue
                return reply
            time.sleep(0.1)
        if quorum_lost is not None:
            raise quorum_lost
        raise Unavailable(f"no node answered at {', '.join(self.addresses)}: {last!r}")

    def call(self, payload: Any) -> Any:
        """:meth:`request`, raising the matching exception for an error reply."""
        return raise_for_error(self.request(payload))

    # ------------------------------------------------------------- admin
    def status(self) -> dict[str, Any]:
        """The cluster status as seen by the node answering (view, quorum, leader, nodes)."""
        return raise_for_error(self.request({"op": "status"}))  # type: ignore[no-any-return]

    def ping(self) -> dict[str, Any]:
        """The answering node's name, cluster, address, pid and protocol range."""
        return raise_for_error(self.request({"op": "ping"}))  # type: ignore[no-any-return]

    def join(self, name: str, address: str) -> dict[str, Any]:
        """Add node ``name`` at ``address`` to the cluster membership."""
        return self.call({"op": "join", "name": name, "address": address})  # type: ignore[no-any-return]

    def leave(self, name: str) -> dict[str, Any]:
        """Remove node ``name`` from the cluster membership."""
        return self.call({"op": "leave", "name": name})  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._pending = []

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of :class:`Client` (same fail-over rules)."""

    def __init__(
        self,
        addresses: str | list[str],
        *,
        cluster: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        rounds: int = 2,
        tls: TLSConfig | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        protocol: tuple[int, int] = (PROTOCOL_MIN, PROTOCOL_MAX),
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.cluster = cluster
        self.timeout = timeout
        self.rounds = rounds
        self.max_frame = max_frame
        self.protocol = protocol
        self._ssl: ssl.SSLContext | None = client_context(tls) if tls and tls.enabled else None
        self._index = 0
        self._conn: Connection | None = None
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @property
    def address(self) -> str:
        return self.addresses[self._index]

    @property
    def node(self) -> Hello | None:
        return self._conn.peer if self._conn is not None else None

    async def _roundtrip(self, payload: Any) -> Any:
        if self._conn is None or self._conn.closed:
            host, _, port = self.address.rpartition(":")
            self._conn = await dial(
                host.strip("[]"),
                int(port),
                _client_hello(self.cluster, self.protocol),
                ssl_context=self._ssl,
                timeout=self.timeout,
                max_frame=self.max_frame,
            )
        conn = self._conn
        rid = next(self._ids)
        conn.send({"t": "req", "id": rid, "p": payload})
        async with asyncio.timeout(self.timeout):
            while True:
                value = await conn.recv()
                if isinstance(value, dict) and value.get("t") == "rep" and value.get("id") == rid:
                    return value.get("p")

    async def request(self, payload: Any) -> Any:
        async with self._lock:
            last: BaseException | None = None
            quorum_lost: QuorumLost | None = None
            for _ in range(self.rounds):
                for _ in range(len(self.addresses)):
                    try:
                        reply = await self._roundtrip(payload)
                    except (OSError, EOFError, FrameError, ProtocolError, TimeoutError) as exc:
                        last = exc
                        await self.aclose()
                        self._index = (self._index + 1) % len(self.addresses)
                        continue
                    if isinstance(reply, dict) and reply.get("error") == "QuorumLost":
                        quorum_lost = QuorumLost(str(reply.get("message")))
                        await self.aclose()
                        self._index = (self._index + 1) % len(self.addresses)
                        continue
                    return reply
                await asyncio.sleep(0.1)
            if quorum_lost is not None:
                raise quorum_lost
            raise Unavailable(f"no node answered at {', '.join(self.addresses)}: {last!r}")

    async def call(self, payload: Any) -> Any:
        return raise_for_error(await self.request(payload))

    async def status(self) -> dict[str, Any]:
        return await self.call({"op": "status"})  # type: ignore[no-any-return]

    async def ping(self) -> dict[str, Any]:
        return await self.call({"op": "ping"})  # type: ignore[no-any-return]

    async def join(self, name: str, address: str) -> dict[str, Any]:
        return await self.call({"op": "join", "name": name, "address": address})  # type: ignore[no-any-return]

    async def leave(self, name: str) -> dict[str, Any]:
        return await self.call({"op": "leave", "name": name})  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.aclose()
        self._conn = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
