"""The node port's listening socket: plain TCP, or TLS that answers plain clients plainly.

A plain listener is asyncio's own server.  A TLS listener accepts the TCP
connection itself and looks at its first byte before any TLS: a TLS client
opens with a handshake record (0x16), a plain nonstop client with a frame
header (0x00 for any frame it may send).  A plain client gets a plain
``reject`` frame with code :data:`~nonstop.net.tls.TLS_REQUIRED` — one line
for its user ("node requires TLS") instead of a closed connection — and a
TLS client gets its TLS handshake, whose failure is logged with the reason
(an untrusted certificate, no certificate...).  Connections in their TLS
handshake count against the handshaking cap of the
:class:`~nonstop.runtime.limits.ConnectionBounds`, and have
``handshake_timeout`` to finish it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from nonstop.net.frames import encode
from nonstop.net.handshake import Rejection
from nonstop.net.tls import TLS_REQUIRED, looks_like_tls
from nonstop.runtime.limits import ConnectionBounds

log = logging.getLogger("nonstop.runtime")

STREAM_LIMIT = 256 * 1024
"""The stream reader's buffer limit of an accepted connection (as ``start_server``'s)."""

OnAccept = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Listener:
    """Accepts connections on ``host:port`` and hands their streams to ``on_accept``."""

    def __init__(
        self,
        on_accept: OnAccept,
        bounds: ConnectionBounds,
        server_ssl: ssl.SSLContext | None,
        name: str,
    ) -> None:
        self.on_accept = on_accept
        self.bounds = bounds
        self.server_ssl = server_ssl
        self.name = name
        self._server: asyncio.AbstractServer | None = None
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        """Bind (``OSError`` on a port conflict) and start accepting."""
        if self.server_ssl is None:
            self._server = await asyncio.start_server(
                self.on_accept, host, port, limit=STREAM_LIMIT, reuse_address=True
            )
            return
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._sock = socket.create_server((host, port), family=family, backlog=1024)
        self._sock.setblocking(False)
        self._accepting = asyncio.ensure_future(self._accept_forever(self._sock))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._sock is not None:
            self._sock.close()

    # ------------------------------------------------------------ TLS
    async def _accept_forever(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(listening)
            except OSError as exc:  # out of file descriptors, ...: keep the port alive
                log.warning("accept failed: %r", exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.ensure_future(self._open_tls(sock, _remote(addr)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _open_tls(self, sock: socket.socket, remote: str) -> None:
        """Tell TLS from plain, then hand a TLS connection's streams on (or refuse it)."""
        bounds = self.bounds
        refused = bounds.over_handshaking_cap()
        if refused is not None:
            log.warning("refusing connection from %s: %s", remote, refused)
            sock.close()
            return
        loop = asyncio.get_running_loop()
        owned: socket.socket | None = sock
        bounds.tls_pending += 1
        try:
            async with asyncio.timeout(bounds.limits.handshake_timeout):
                head = await _peek(sock)
                if not head:
                    return
                if not looks_like_tls(head):
                    log.warning(
                        "refusing connection from %s: it speaks plain TCP, this node TLS only",
                        remote,
                    )
                    reason = (
                        f"node {self.name} requires TLS: connect with TLS "
                        "(a client's tls.ca, the CLI's --tls-ca)"
                    )
                    await _refuse(sock, Rejection(TLS_REQUIRED, reason))
                    return
                owned = None  # the transport owns it from here
                await loop.connect_accepted_socket(
                    self._protocol,
                    sock,
                    ssl=self.server_ssl,
                    ssl_handshake_timeout=bounds.limits.handshake_timeout,
                )
        except TimeoutError:
            bounds.handshake_timed_out(remote)
        except (ssl.SSLError, OSError) as exc:
            log.warning("TLS handshake with %s failed: %s", remote, exc)
        finally:
            bounds.tls_pending -= 1
            if owned is not None:
                owned.close()

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        # What asyncio.start_server builds for each connection: on_accept runs once
        # the TLS handshake is done.
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        return asyncio.StreamReaderProtocol(reader, self.on_accept)


async def _peek(sock: socket.socket) -> bytes:
    """The first byte the other side sent, left in the socket ('' if it closed)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            pass
        readable: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, _wake, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)


def _wake(readable: asyncio.Future[None]) -> None:
    if not readable.done():
        readable.set_result(None)


async def _refuse(sock: socket.socket, rejection: Rejection) -> None:
    """Send a plain ``reject`` frame and close, so that the client can read it.

    What the client sent is read first: closing a socket with unread data
    resets the connection, and the reset may destroy our frame in flight.
    """
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(1.0):
            with contextlib.suppress(BlockingIOError):
                sock.recv(65536)
            await loop.sock_sendall(sock, encode(rejection.to_wire()))
            sock.shutdown(socket.SHUT_WR)
            while await loop.sock_recv(sock, 65536):
                pass


def _remote(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)


__all__ = ["Listener"]
