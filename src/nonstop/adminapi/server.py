"""Serve the admin API with uvicorn on the node's own event loop (:class:`AdminServer`).

Why uvicorn's ``Server.serve()`` in the node's loop rather than a thread or a
process: the API is asyncio code like the node and shares its lifetime (started
after the runtime, stopped before it); the command handlers, which are
blocking client code, run in the API's worker threads, so the loop never waits
for them.  :class:`EmbeddedServer` leaves the process's signals to the node
(uvicorn would otherwise install its own SIGTERM/SIGINT handlers).

Bounds: at most ``MAX_CONCURRENT`` connections at once (more get 503), request
heads bounded by h11's limit, idle keep-alive connections closed after 5 s,
bodies bounded by :mod:`.body_limit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

log = logging.getLogger("nonstop.adminapi")

MAX_CONCURRENT = 32
HEAD_LIMIT = 16 * 1024


class EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the node owns SIGTERM/SIGINT


class AdminServer:
    def __init__(self, server: EmbeddedServer, task: asyncio.Task[None]) -> None:
        self._server = server
        self._task = task
        self._companions: list[asyncio.Future[Any]] = []

    def companion(self, task: asyncio.Future[Any]) -> None:
        """A task that lives as long as the API (the console's sampler): cancelled by stop."""
        self._companions.append(task)

    @property
    def port(self) -> int:
        return int(self._server.servers[0].sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for task in self._companions:
            task.cancel()
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 5.0)


async def serve_admin(app: Any, address: str, cert: tuple[str, str] | None = None) -> AdminServer:
    """Listen on ``address`` (``host:port``; HTTPS with ``cert`` = (certfile, keyfile));
    ``OSError`` when it cannot (the socket is bound here: uvicorn would exit the process)."""
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), int(port)))
    except OSError:
        sock.close()
        raise
    config = uvicorn.Config(
        app,
        host=host,
        port=int(port),
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        # No X-Forwarded-* rewriting: the scheme and addresses are the connection's own
        # (the API trusts a password only over TLS or loopback, app.private_channel).
        proxy_headers=False,
        limit_concurrency=MAX_CONCURRENT,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=HEAD_LIMIT,
        ssl_certfile=cert[0] if cert else None,
        ssl_keyfile=cert[1] if cert else None,
        loop="none",
        http="h11",
        ws="none",
    )
    server = EmbeddedServer(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # re-raises why it could not start
            raise OSError(f"the admin API could not listen on {address}")
        await asyncio.sleep(0.01)
    scheme = "https" if cert else "http"
    admin = AdminServer(server, task)
    log.info("admin API and console at %s://%s:%d/", scheme, host, admin.port)
    return admin


__all__ = ["AdminServer", "EmbeddedServer", "serve_admin"]
