"""Bound request bodies before they are read (ASGI middleware): 413 beyond ``limit`` bytes.

A declared ``Content-Length`` above the limit is answered 413 at once, nothing
read; a body without one (chunked) is read at most ``limit`` bytes into memory,
then 413, else replayed to the application.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("nonstop.adminapi")


async def too_large(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body larger than {limit} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        where = f"{scope.get('method')} {scope.get('path')} from {_peer(scope)}"
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = self.limit + 1
            if size > self.limit:
                log.warning(
                    "admin api: refused %s: body of %s bytes (limit %d)",
                    where,
                    declared,
                    self.limit,
                )
                await too_large(send, self.limit)
                return
            await self.app(scope, receive, send)
            return
        # No declared length: read at most the limit, then replay what was read.
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > self.limit:
                log.warning("admin api: refused %s: chunked body over %d bytes", where, self.limit)
                await too_large(send, self.limit)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)


def _peer(scope: Scope) -> Any:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


__all__ = ["BodyLimit"]
