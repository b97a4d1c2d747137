"""The node's metrics endpoint: ``GET /metrics`` in Prometheus text, on the node's event loop.

Served by :func:`serve_metrics` on the ``metrics.listen`` address.  A scrape
needs a user allowed ``status`` (HTTP basic or a session token, checked by
:class:`nonstop.node.metrics_auth.MetricsGate`): 401 with
``WWW-Authenticate: Basic realm="nonstop"`` without or with a bad credential,
403 for a user without ``status``; open only with ``[auth] enabled = false``
(docs/security.md "Metrics endpoint").  The body is the ``prometheus_client``
library's own exposition (:func:`prometheus_client.exposition.choose_encoder`:
the text format 0.0.4, or OpenMetrics when the scraper asks for it in
``Accept``) of the node's registry (:mod:`nonstop.node.metrics`).

Why a small asyncio handler rather than the library's servers:
``start_http_server`` serves from a thread of its own, which would read the
machines while the event loop changes them (a dict changing size under
iteration, a half-applied event); its ASGI app needs an ASGI server, another
dependency, in the node process.  Here the request is read and the registry
collected on the loop thread, between two events, so every scrape sees a
consistent node; a scrape of the ~100 series of a node costs well under a
millisecond of loop time (bench/results/metrics.md).

HTTPS when the node's TLS has a certificate (``[tls] cert``, ``key``), as on the
admin port: the same certificate, TLS 1.2 at least, no client certificate asked
(the scraper proves a user, as above); a plain HTTP request then gets nothing.

Bounds: requests of at most 8 KiB of head, read within 5 s (a TLS handshake
within 5 s too), at most 8 scrapes at once (more are answered 503), connections
closed after each answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from nonstop.node.metrics_auth import MetricsGate, Refused

log = logging.getLogger("nonstop.metrics")

HEAD_LIMIT = 8192
READ_TIMEOUT = 5.0
MAX_CONCURRENT = 8
PATHS = frozenset({"/metrics", "/"})


REASONS = {401: "401 Unauthorized", 403: "403 Forbidden"}
CHALLENGE = 'WWW-Authenticate: Basic realm="nonstop"\r\n'


def _response(
    status: str, content_type: str, body: bytes, head_only: bool = False, extra: str = ""
) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{extra}"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


def _plain(status: str, message: str, extra: str = "") -> bytes:
    return _response(status, "text/plain; charset=utf-8", (message + "\n").encode(), extra=extra)


class MetricsServer:
    """Answers scrapes of ``registry`` admitted by ``gate`` (module doc; None: open)."""

    def __init__(self, registry: CollectorRegistry, gate: MetricsGate | None = None) -> None:
        self.registry = registry
        self.gate = gate
        self.scrapes = 0
        self._busy = 0
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            host,
            port,
            limit=HEAD_LIMIT,
            ssl=tls,
            ssl_handshake_timeout=READ_TIMEOUT if tls is not None else None,
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self._busy >= MAX_CONCURRENT:
                writer.write(_plain("503 Service Unavailable", "too many scrapes at once"))
                return
            self._busy += 1
            peer = writer.get_extra_info("peername")
            where = str(peer[0]) if isinstance(peer, tuple) else "?"
            try:
                answer = await asyncio.wait_for(self._answer(reader, where), READ_TIMEOUT)
            except (TimeoutError, ValueError, asyncio.LimitOverrunError, ConnectionError):
                answer = _plain("400 Bad Request", "bad or slow request")
            except Exception:  # a collector failed: say so, keep serving
                log.exception("metrics scrape failed")
                answer = _plain("500 Internal Server Error", "the scrape failed: see the node log")
            finally:
                self._busy -= 1
            writer.write(answer)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, peer: str) -> bytes:
        request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        lines = request.split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _plain("400 Bad Request", "not an HTTP request")
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if target.partition("?")[0] not in PATHS:
            return _plain("404 Not Found", "the metrics are at /metrics")
        if method not in ("GET", "HEAD"):
            return _plain("405 Method Not Allowed", "GET /metrics")
        if self.gate is not None:
            try:
                await self.gate.admit(headers.get("authorization"), peer)
            except Refused as exc:
                extra = CHALLENGE if exc.status == 401 else ""
                return _plain(REASONS[exc.status], str(exc), extra)
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        self.scrapes += 1
        body = encoder(self.registry)
        return _response("200 OK", content_type, body, head_only=method == "HEAD")


def server_tls(cert: tuple[str, str]) -> ssl.SSLContext:
    """HTTPS with the node's certificate, as the admin port has it: the scraper checks
    the node; the node checks the scraper's credential, not a client certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert[0], cert[1])
    return context


async def serve_metrics(
    registry: CollectorRegistry,
    address: str,
    gate: MetricsGate | None = None,
    cert: tuple[str, str] | None = None,
) -> MetricsServer:
    """Listen on ``address`` (``host:port``; port 0: any free one) and answer scrapes
    admitted by ``gate`` (None, or a gate of a node without authentication: anyone);
    HTTPS with ``cert`` = (certfile, keyfile)."""
    host, _, port = address.rpartition(":")
    server = MetricsServer(registry, gate)
    await server.start(host, int(port), server_tls(cert) if cert else None)
    log.info("metrics at %s://%s:%d/metrics", "https" if cert else "http", host, server.port)
    if gate is None or gate.open:
        log.warning(
            "metrics on %s are open ([auth] enabled = false): anyone who reaches it may scrape",
            address,
        )
    return server


__all__ = ["MetricsServer", "serve_metrics", "server_tls"]
