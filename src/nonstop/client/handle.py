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

Transactions (``cluster.transaction()``, ``@nonstop.transactional``) run on
the node the client is attached to (``nonstop.client.remote``).  A new
transaction goes to the first reachable node, starting with the current one;
a transaction whose node dies fails with :class:`~nonstop.errors.Unavailable`
(B8) and the next one goes to another node.  Commits are exactly once (H1):
each client has an id (``client_id``) and numbers its commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import ssl
import threading
import time
import uuid
from typing import Any

from nonstop.client.channel import NETWORK_ERRORS, AsyncChannel, SyncChannel
from nonstop.client.lanes import RequestLanes
from nonstop.client.remote import RemoteTransaction
from nonstop.client.remote_async import AsyncRemoteTransaction
from nonstop.errors import (
    Aborted,
    ClusterError,
    NotLeader,
    ProtocolError,
    QuorumLost,
    Unavailable,
)
from nonstop.model.wire import raise_error
from nonstop.net.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN, ROLE_CLIENT, Hello, check
from nonstop.net.tls import TLSConfig, client_context

DEFAULT_TIMEOUT = 5.0
DEFAULT_OP_TIMEOUT = 30.0
"""How long a data request may take (it may wait for locks on the node)."""
POOL_SIZE = 16
_SWITCH_NODE = ("QuorumLost", "NotLeader")


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


def _settled(reply: Any, address: str, cause: BaseException) -> bool:
    """Interpret a ``request.result`` reply: True committed, False running, else raise."""
    raise_error(reply)
    state = reply.get("state") if isinstance(reply, dict) else None
    if state == "committed":
        return True
    if state == "running":
        return False
    if state == "aborted":
        # The node records an aborted commit as [error class name, message].
        result = reply.get("result")
        if isinstance(result, list | tuple) and len(result) == 2:
            raise_error({"error": result[0], "message": result[1]})
        if isinstance(result, dict) and "error" in result:
            raise_error(result)
        raise Aborted(f"the transaction was rolled back ({result!r})")
    # "unknown": the node never recorded the commit, so it rolled the session back.
    raise Unavailable(
        f"lost the commit's connection to {address} ({cause!r}); the node has no record "
        "of the commit: it was not committed"
    )


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
        op_timeout: float = DEFAULT_OP_TIMEOUT,
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
        self.op_timeout = op_timeout
        self.client_id = uuid.uuid4().hex
        """This client's id in exactly-once commit requests (H1; see ``client.lanes``)."""
        self._lanes = RequestLanes(self.client_id)
        self._pool: list[SyncChannel] = []
        self._pool_lock = threading.Lock()
        self._type_cache: dict[str, Any] = {}

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

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes: ``[{"name", "address", "location", "up"}, ...]``."""
        return raise_error(self.request({"op": "nodes"}))["nodes"]  # type: ignore[no-any-return]

    # -------------------------------------------------------------- data
    def transaction(self, isolation: str = "serializable") -> RemoteTransaction:
        """A new transaction on the cluster: ``with cluster.transaction() as tx``.

        The same API as an embedded transaction (see :mod:`nonstop.client.remote`);
        it begins on the node with its first operation.
        """
        return RemoteTransaction(self, isolation)

    def _dial(self, address: str) -> SyncChannel:
        return SyncChannel(
            address,
            _client_hello(self.cluster),
            timeout=self.timeout,
            ssl_context=self._ssl,
            max_frame=self.max_frame,
        )

    def _checkout(self, address: str) -> Any:
        with self._pool_lock:
            while self._pool:
                chan = self._pool.pop()
                if chan.address == address and not chan.broken:
                    return chan
                chan.close()
        return self._dial(address)

    def _release(self, chan: Any) -> None:
        """A transaction is over; its connection may carry the next one."""
        if chan.broken:
            return
        with self._pool_lock:
            if len(self._pool) < POOL_SIZE and chan.address == self.address:
                self._pool.append(chan)
                return
        chan.close()

    def _discard(self, chan: Any) -> None:
        """A connection failed: drop it, and make new transactions try the next node."""
        chan.close()
        with self._pool_lock:
            if chan.address == self.address:
                self._index = (self._index + 1) % len(self.addresses)

    def _next_request(self) -> list[Any]:
        return self._lanes.take()

    def _request_done(self, req: list[Any]) -> None:
        self._lanes.done(req)

    def _open_session(self, first: dict[str, Any]) -> tuple[Any, Any]:
        """Send a transaction's first op (it carries ``begin``) to the first node that
        takes it: (channel, raw reply).  Trying another node is safe: a session whose
        connection is closed is rolled back by its node."""
        last: BaseException | None = None
        for _ in range(self.rounds):
            for _ in range(len(self.addresses)):
                address = self.address
                try:
                    chan = self._checkout(address)
                except NETWORK_ERRORS as exc:
                    last = exc
                    self._switch(address)
                    continue
                try:
                    reply = chan.call(first, self.op_timeout)
                except NETWORK_ERRORS as exc:
                    last = exc
                    chan.close()
                    self._switch(address)
                    if isinstance(exc, TimeoutError):
                        # Slow or stopped: the op may be waiting for a lock, which
                        # another node would wait for too.  Fail this transaction only.
                        raise Unavailable(f"no answer from {address} in time: {exc!r}") from exc
                    continue
                if isinstance(reply, dict) and reply.get("error") in _SWITCH_NODE:
                    last = ClusterError(f"{address}: {reply.get('message')}")
                    chan.close()
                    self._switch(address)
                    continue
                return chan, reply
            time.sleep(0.05)
        raise Unavailable(f"no node took a transaction at {', '.join(self.addresses)}: {last!r}")

    def _switch(self, address: str) -> None:
        with self._pool_lock:
            if address == self.address:
                self._index = (self._index + 1) % len(self.addresses)

    def _request_result(self, address: str, req: list[Any], cause: BaseException) -> None:
        """After a lost commit reply: ask ``address`` for the outcome (H1); see commit()."""
        deadline = time.monotonic() + self.op_timeout
        delay = 0.01
        while True:
            try:
                chan = self._dial(address)
                try:
                    reply = chan.call({"op": "request.result", "req": req}, self.timeout)
                finally:
                    chan.close()
            except NETWORK_ERRORS as exc:
                raise Unavailable(
                    f"the reply to a commit was lost ({cause!r}) and {address} cannot be asked "
                    f"({exc!r}): the outcome is unknown"
                ) from exc
            if _settled(reply, address, cause):
                return
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"the commit on {address} is still running after {self.op_timeout}s: "
                    "the outcome is unknown"
                )
            time.sleep(delay)
            delay = min(0.2, delay * 2)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None
        self._pending = []
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for chan in pool:
            chan.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The asyncio twin of :class:`Client` (same fail-over rules).

    It keeps one connection to its current node, multiplexed: admin requests
    and the requests of every running transaction share it, replies matched by
    id, so many tasks' transactions are in flight at once.
    """

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
        op_timeout: float = DEFAULT_OP_TIMEOUT,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        self.cluster = cluster
        self.timeout = timeout
        self.rounds = rounds
        self.max_frame = max_frame
        self.protocol = protocol
        self.op_timeout = op_timeout
        self._ssl: ssl.SSLContext | None = client_context(tls) if tls and tls.enabled else None
        self._index = 0
        self._chan: AsyncChannel | None = None
        self._lock = asyncio.Lock()
        self._dial_lock = asyncio.Lock()
        self.client_id = uuid.uuid4().hex
        """This client's id in exactly-once commit requests (H1; see ``client.lanes``)."""
        self._lanes = RequestLanes(self.client_id)
        self._type_cache: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return self.addresses[self._index]

    @property
    def node(self) -> Hello | None:
        return self._chan.node if self._chan is not None else None

    async def _dial(self, address: str) -> Any:
        return await AsyncChannel.open(
            address,
            _client_hello(self.cluster, self.protocol),
            timeout=self.timeout,
            ssl_context=self._ssl,
            max_frame=self.max_frame,
        )

    async def _channel(self) -> Any:
        """The connection to the current node, dialled if there is none (one dial at a time)."""
        chan = self._chan
        if chan is not None and not chan.closed:
            return chan
        async with self._dial_lock:
            if self._chan is None or self._chan.closed:
                self._chan = await self._dial(self.address)
            return self._chan

    async def _roundtrip(self, payload: Any) -> Any:
        try:
            chan = await self._channel()
        except NETWORK_ERRORS:
            self._switch(self.address)
            raise
        try:
            return await chan.call(payload, self.timeout)
        except NETWORK_ERRORS:
            self._discard(chan)
            raise

    async def _failed(self, chan: Any, exc: BaseException) -> None:
        """A transaction's request failed on ``chan``: drop the connection unless it is
        only slow.  Every task's transaction shares it, so a timeout (a long lock wait,
        a busy node) closes it only if the node does not even answer a ping."""
        if isinstance(exc, TimeoutError) and not chan.closed:
            try:
                await chan.call({"op": "ping"}, self.timeout)
                return
            except BaseException:
                pass
        self._discard(chan)

    def _discard(self, chan: Any) -> None:
        """A connection failed: close it and make new requests try the next node (once)."""
        if self._chan is chan:
            self._chan = None
            self._index = (self._index + 1) % len(self.addresses)
        with contextlib.suppress(Exception):
            chan.close()

    async def request(self, payload: Any) -> Any:
        async with self._lock:
            last: BaseException | None = None
            quorum_lost: QuorumLost | None = None
            for _ in range(self.rounds):
                for _ in range(len(self.addresses)):
                    try:
                        reply = await self._roundtrip(payload)
                    except NETWORK_ERRORS as exc:
                        last = exc
                        continue
                    if isinstance(reply, dict) and reply.get("error") == "QuorumLost":
                        quorum_lost = QuorumLost(str(reply.get("message")))
                        if self._chan is not None:
                            self._discard(self._chan)
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

    async def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes: ``[{"name", "address", "location", "up"}, ...]``."""
        return raise_error(await self.request({"op": "nodes"}))["nodes"]  # type: ignore[no-any-return]

    # -------------------------------------------------------------- data
    def transaction(self, isolation: str = "serializable") -> AsyncRemoteTransaction:
        """A new transaction on the cluster: ``async with cluster.transaction() as tx``."""
        return AsyncRemoteTransaction(self, isolation)

    def _next_request(self) -> list[Any]:
        return self._lanes.take()

    def _request_done(self, req: list[Any]) -> None:
        self._lanes.done(req)

    async def _open_session(self, first: dict[str, Any]) -> tuple[Any, Any]:
        """Send a transaction's first op (it carries ``begin``) to the first node that
        takes it: (channel, raw reply); see :meth:`Client._open_session`."""
        last: BaseException | None = None
        for _ in range(self.rounds):
            for _ in range(len(self.addresses)):
                try:
                    chan = await self._channel()
                except NETWORK_ERRORS as exc:
                    last = exc
                    self._switch(self.address)
                    continue
                try:
                    reply = await chan.call(first, self.op_timeout)
                except NETWORK_ERRORS as exc:
                    last = exc
                    if isinstance(exc, TimeoutError):
                        # Slow or stopped (see Client._open_session): this transaction only.
                        await self._failed(chan, exc)
                        raise Unavailable(
                            f"no answer from {chan.address} in time: {exc!r}"
                        ) from exc
                    self._discard(chan)
                    continue
                if isinstance(reply, dict) and reply.get("error") in _SWITCH_NODE:
                    last = ClusterError(f"{chan.address}: {reply.get('message')}")
                    self._discard(chan)
                    continue
                return chan, reply
            await asyncio.sleep(0.05)
        raise Unavailable(f"no node took a transaction at {', '.join(self.addresses)}: {last!r}")

    def _switch(self, address: str) -> None:
        if address == self.address and (self._chan is None or self._chan.closed):
            self._index = (self._index + 1) % len(self.addresses)

    async def _request_result(self, address: str, req: list[Any], cause: BaseException) -> None:
        """After a lost commit reply: ask ``address`` for the outcome (H1); see commit()."""
        deadline = time.monotonic() + self.op_timeout
        delay = 0.01
        while True:
            try:
                chan = await self._dial(address)
                try:
                    reply = await chan.call({"op": "request.result", "req": req}, self.timeout)
                finally:
                    await chan.aclose()
            except NETWORK_ERRORS as exc:
                raise Unavailable(
                    f"the reply to a commit was lost ({cause!r}) and {address} cannot be asked "
                    f"({exc!r}): the outcome is unknown"
                ) from exc
            if _settled(reply, address, cause):
                return
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"the commit on {address} is still running after {self.op_timeout}s: "
                    "the outcome is unknown"
                )
            await asyncio.sleep(delay)
            delay = min(0.2, delay * 2)

    async def aclose(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            await chan.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
