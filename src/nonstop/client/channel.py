"""Connections that carry a client's data requests to one node.

A session transaction belongs to the connection that began it (data-path.md
§3), so a transaction keeps its connection from ``tx.begin`` to its end:

* :class:`SyncChannel` — one blocking socket, one request at a time; the
  blocking :class:`~nonstop.client.handle.Client` keeps a small pool of them
  so that threads can run transactions side by side.
* :class:`AsyncChannel` — one asyncio connection multiplexed by request id:
  many transactions (tasks) of one :class:`~nonstop.client.handle.AsyncClient`
  have requests in flight on it at once, and replies come back in any order.

Both raise ``OSError`` / ``EOFError`` / ``TimeoutError`` (:data:`NETWORK_ERRORS`)
when the node cannot be reached or does not answer in time; callers turn that
into :class:`~nonstop.errors.Unavailable`.  A node that refuses the client when
it connects (cluster name, protocol range, TLS credentials) raises
:class:`~nonstop.client.failures.NodeRefused` instead: see that module.

:class:`SyncChannel` is the one blocking handshake (the bulk client uses it
too); the asyncio one is :func:`nonstop.net.connection.dial`.  Both check the
node's answer with :func:`nonstop.net.connection.hello_from_answer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import socket
import ssl
import time
from typing import Any

from nonstop.client.failures import NETWORK_ERRORS, refusal
from nonstop.errors import TooLarge
from nonstop.net.address import split_address
from nonstop.net.auth import Credential
from nonstop.net.challenge import ProofError, Prover
from nonstop.net.connection import Connection, HandshakeRejected, dial, hello_from_answer
from nonstop.net.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameTooLarge, encode
from nonstop.net.handshake import (
    AUTHENTICATION_FAILED,
    PROTOCOL_MAX,
    PROTOCOL_MIN,
    ROLE_CLIENT,
    Hello,
)

READ_CHUNK = 256 * 1024


def client_hello(
    cluster: str,
    protocol: tuple[int, int] = (PROTOCOL_MIN, PROTOCOL_MAX),
    name: str = "client",
) -> Hello:
    """The hello a client sends (an empty ``cluster`` talks to whatever cluster answers)."""
    return Hello(
        cluster=cluster,
        name=f"{name}-{os.getpid()}",
        location=0,
        timestamp=0,
        proto_min=protocol[0],
        proto_max=protocol[1],
        role=ROLE_CLIENT,
        pid=os.getpid(),
    )


class SyncChannel:
    """A blocking connection to one node; ``call`` sends a request and waits for its reply."""

    def __init__(
        self,
        address: str,
        hello: Hello,
        *,
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        read_chunk: int = READ_CHUNK,
        credential: Credential | None = None,
    ) -> None:
        self.address = address
        self.max_frame = max_frame
        self.closed = False
        self._read_chunk = read_chunk
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(max_frame)
        self._pending: list[Any] = []
        host, port = split_address(address)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is not None:
                sock = ssl_context.wrap_socket(sock, server_hostname=host)
            self._sock = sock
            prover = Prover(hello, credential)
            sock.sendall(encode(prover.first(), max_frame))
            answer = self._recv()
            try:
                reply = prover.on_answer(answer)
                if reply is None:
                    prover.check_open(answer)
                else:
                    sock.sendall(encode(reply, max_frame))
                    answer = self._recv()
                    prover.on_final(answer)
            except ProofError as exc:
                raise HandshakeRejected(AUTHENTICATION_FAILED, str(exc)) from None
            self.node: Hello | None = hello_from_answer(
                prover.hello, answer, address, prover.trusted
            )
        except BaseException as exc:
            with contextlib.suppress(OSError):
                sock.close()
            refused = refusal(address, exc)
            if refused is not None and refused is not exc:
                raise refused from exc
            raise

    def _recv(self) -> Any:
        while not self._pending:
            data = self._sock.recv(self._read_chunk)
            if not data:
                raise EOFError(f"{self.address} closed the connection")
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)

    def call(self, payload: Any, timeout: float) -> Any:
        """Send one request and return its reply payload; network errors mark the channel broken."""
        if self.closed:
            raise ConnectionResetError(f"connection to {self.address} is broken")
        rid = next(self._ids)
        frame = request_frame(rid, payload, self.max_frame)  # TooLarge: nothing sent
        try:
            self._sock.settimeout(timeout)
            self._sock.sendall(frame)
            deadline = time.monotonic() + timeout
            while True:
                self._sock.settimeout(max(0.001, deadline - time.monotonic()))
                value = self._recv()
                if isinstance(value, dict) and value.get("t") == "rep" and value.get("id") == rid:
                    return value.get("p")
        except BaseException:
            # A reply may still be on its way: the stream is out of step, never reuse it.
            self.close()
            raise

    def gone_while_idle(self) -> bool:
        """Between requests nothing is due from the node: a readable socket means it
        closed the connection (idle timeout, restart) -- or broke the protocol."""
        if self.closed:
            return True
        if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
            return True
        try:
            readable, _, _ = select.select([self._sock], [], [], 0)
        except (OSError, ValueError):
            return True
        if readable:
            self.close()
        return bool(readable)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()


class AsyncChannel:
    """An asyncio connection to one node, multiplexed: requests wait for replies by id."""

    def __init__(self, conn: Connection, address: str) -> None:
        self.conn = conn
        self.address = address
        self.node = conn.peer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._closed = False
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(
        cls,
        address: str,
        hello: Hello,
        *,
        timeout: float,
        ssl_context: ssl.SSLContext | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        credential: Credential | None = None,
    ) -> AsyncChannel:
        host, port = split_address(address)
        try:
            conn = await dial(
                host,
                port,
                hello,
                ssl_context=ssl_context,
                timeout=timeout,
                max_frame=max_frame,
                credential=credential,
            )
        except Exception as exc:
            refused = refusal(address, exc)
            if refused is not None:
                raise refused from exc
            raise
        return cls(conn, address)

    @property
    def closed(self) -> bool:
        return self._closed or self.conn.closed

    async def _read(self) -> None:
        try:
            while True:
                for value in await self.conn.recv_many():
                    if not (isinstance(value, dict) and value.get("t") == "rep"):
                        continue
                    future = self._waiting.pop(value.get("id"), None)  # type: ignore[arg-type]
                    if future is not None and not future.done():
                        future.set_result(value.get("p"))
                    else:
                        self._abandoned(value.get("p"))
        except (Exception, asyncio.CancelledError):
            pass
        finally:
            self._fail_all()

    def _abandoned(self, reply: Any) -> None:
        """A late reply nobody waits for (timed out, cancelled).  If it opened a session
        (a first op carrying ``begin``), nobody will ever end it: roll it back now,
        because the connection, which would end it, stays open for other requests."""
        s = reply.get("s") if isinstance(reply, dict) else None
        if isinstance(s, int) and not isinstance(s, bool):
            self.send_nowait({"op": "tx.rollback", "s": s})

    def _fail_all(self) -> None:
        self._closed = True
        self.conn.close()
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(ConnectionResetError(f"connection to {self.address} lost"))

    async def call(self, payload: Any, timeout: float) -> Any:
        """Send one request and await its reply (other requests may be in flight)."""
        if self.closed:
            raise ConnectionResetError(f"connection to {self.address} is closed")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = future
        try:
            try:
                sent = self.conn.send({"t": "req", "id": rid, "p": payload})
            except FrameTooLarge as exc:  # refused before anything was sent
                raise too_large(payload, exc) from None
            if not sent:
                raise ConnectionResetError(f"connection to {self.address} is closed")
            async with asyncio.timeout(timeout):
                return await future
        finally:
            self._waiting.pop(rid, None)

    def close(self) -> None:
        """Close now; requests waiting for replies fail with ConnectionResetError."""
        self._fail_all()

    def send_nowait(self, payload: Any) -> None:
        """Fire and forget (best-effort rollback of an abandoned session)."""
        if not self.closed:
            self.conn.send({"t": "req", "id": next(self._ids), "p": payload})

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(BaseException):
            await self._reader
        self._fail_all()
        await self.conn.aclose()


def too_large(payload: Any, exc: FrameTooLarge) -> TooLarge:
    """The client's refusal of a request over the frame limit (never a network error)."""
    op = payload.get("op") if isinstance(payload, dict) else None
    return TooLarge(
        f"request {op!r} of {exc.size:,} bytes exceeds the frame limit of {exc.limit:,} bytes "
        "(max_frame_bytes): a value, a write set or a commit too large; nothing was sent",
        exc.size,
        exc.limit,
    )


def request_frame(rid: int, payload: Any, max_frame: int) -> bytes:
    """The request's frame; :class:`~nonstop.errors.TooLarge` if over ``max_frame``."""
    try:
        return encode({"t": "req", "id": rid, "p": payload}, max_frame)
    except FrameTooLarge as exc:
        raise too_large(payload, exc) from None


__all__ = ["NETWORK_ERRORS", "READ_CHUNK", "AsyncChannel", "SyncChannel", "client_hello"]
