"""A delaying TCP relay inside one node's namespace: delay faults without ``netem``.

The kernel of the CI VM has no ``netem`` qdisc, so :class:`~tests.jepsen.netns.Network`
delays links with this relay instead (``Network(..., relay_port=...)``).  One relay
process runs in every node's namespace (``python -m tests.jepsen.relay``).  An
nftables ``redirect`` rule there sends every new connection the node opens to a
peer's port ``relay_port`` to the relay's listener for that peer on 127.0.0.1; the
relay opens the real connection to the peer from the same namespace (its socket
marked, so the rule skips it) and copies the bytes both ways.  So the bytes still
cross the bridge with the node's own address, and the cut and loss rules apply to
them as before.

Each direction of each connection is a queue of chunks, each released ``delay`` ms
after it was read (never before the chunk ahead of it: order is kept), the delay
read from the relay's settings when the chunk arrives.  The settings come over a
Unix socket (namespaces do not separate Unix sockets): one JSON line
``{"up": {peer: ms}, "down": {peer: ms}, "jitter": ms}`` replaces them and is
answered ``ok``; ``up`` delays what this node sends to ``peer``, ``down`` what it
receives from ``peer`` (the other end of a connection the node opened: a peer's
bytes on a connection the peer opened cross the peer's own relay as its ``up``).
All zero: a plain copy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

MARK = 0x77
"""The mark of the relay's own connections (the redirect rule skips marked packets)."""
SO_MARK = getattr(socket, "SO_MARK", 36)
BUFFERED = 16 << 20
"""Bytes one direction may hold before the relay stops reading from its source."""


@dataclass
class Settings:
    up: dict[str, float] = field(default_factory=dict)
    down: dict[str, float] = field(default_factory=dict)
    jitter: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    def delay(self, peer: str, upward: bool) -> float:
        ms = (self.up if upward else self.down).get(peer, 0.0)
        if ms <= 0:
            return 0.0
        return (ms + self.rng.uniform(-self.jitter, self.jitter) if self.jitter else ms) / 1000


async def pump(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_of: Callable[[], float]
) -> None:
    """Copy ``reader`` to ``writer``, each chunk held ``delay_of()`` seconds from its
    arrival, never released before the chunk ahead of it (module doc)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    held = 0
    last = 0.0

    async def write() -> None:
        nonlocal held
        while True:
            release, data = await queue.get()
            if not data:
                break
            wait = release - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            held -= len(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    writing = asyncio.ensure_future(write())
    try:
        while data := await reader.read(65536):
            last = max(last, loop.time() + delay_of())
            held += len(data)
            queue.put_nowait((last, data))
            while held > BUFFERED and not writing.done():
                await asyncio.sleep(0.01)
        queue.put_nowait((0.0, b""))
        await writing
    finally:
        writing.cancel()


async def relay(
    settings: Settings,
    peer: str,
    target: tuple[str, int],
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """One connection the node opened to ``peer``: open the real one, copy both ways."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with contextlib.suppress(PermissionError):  # needs CAP_NET_ADMIN; only the rule needs it
        sock.setsockopt(socket.SOL_SOCKET, SO_MARK, MARK)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, target)
        out_reader, out_writer = await asyncio.open_connection(sock=sock)
    except OSError:
        sock.close()
        writer.close()
        return
    directions = [
        asyncio.ensure_future(pump(reader, out_writer, lambda: settings.delay(peer, True))),
        asyncio.ensure_future(pump(out_reader, writer, lambda: settings.delay(peer, False))),
    ]
    try:
        # Both directions end (each at its EOF), or one fails (a reset): then both go.
        await asyncio.wait(directions, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in directions:
            task.cancel()
        for task in directions:
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        for w in (writer, out_writer):
            with contextlib.suppress(OSError):
                w.close()


async def serve(control: Path, routes: dict[int, tuple[str, str, int]]) -> None:
    """Listen on 127.0.0.1:<port> for each route (port -> peer, host, port), then on the
    control socket (its existence says the relay is ready)."""
    settings = Settings()
    for port, (peer, host, target_port) in routes.items():

        async def accepted(
            r: asyncio.StreamReader,
            w: asyncio.StreamWriter,
            peer: str = peer,
            target: tuple[str, int] = (host, target_port),
        ) -> None:
            await relay(settings, peer, target, r, w)

        await asyncio.start_server(accepted, "127.0.0.1", port)

    async def controlled(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while line := await r.readline():
            asked = json.loads(line)
            settings.up = {str(k): float(v) for k, v in asked.get("up", {}).items()}
            settings.down = {str(k): float(v) for k, v in asked.get("down", {}).items()}
            settings.jitter = float(asked.get("jitter", 0.0))
            w.write(b"ok\n")
            await w.drain()
        w.close()

    server = await asyncio.start_unix_server(controlled, str(control))
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m tests.jepsen.relay", description=__doc__)
    p.add_argument("--control", required=True, help="the Unix socket for the settings")
    p.add_argument(
        "--route", action="append", default=[], help="PORT=PEER@HOST:PORT (listen -> peer)"
    )
    args = p.parse_args()
    routes: dict[int, tuple[str, str, int]] = {}
    for route in args.route:
        listen, _, rest = route.partition("=")
        peer, _, address = rest.partition("@")
        host, _, port = address.rpartition(":")
        routes[int(listen)] = (peer, host, int(port))
    asyncio.run(serve(Path(args.control), routes))


if __name__ == "__main__":
    main()
