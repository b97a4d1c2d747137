"""The delaying relay of the partition harness (``tests/jepsen/relay.py``), in-process on
loopback: no namespace, no root.  It copies both ways, keeps the order of the bytes,
and delays each direction as its settings say, changed while connections are open."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from tests.jepsen.relay import serve


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
    began = time.monotonic()
    writer.write(b"ping\n")
    await writer.drain()
    assert await reader.readline() == b"ping\n"
    return time.monotonic() - began


def test_the_relay_delays_each_direction_as_told_and_keeps_the_order(tmp_path: Path) -> None:
    async def go() -> None:
        peer = await asyncio.start_server(echo, "127.0.0.1", 0)
        peer_port = peer.sockets[0].getsockname()[1]
        probe = await asyncio.start_server(echo, "127.0.0.1", 0)  # a free port for the relay
        listen = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        control = tmp_path / "relay.sock"
        relay = asyncio.ensure_future(serve(control, {listen: ("B", "127.0.0.1", peer_port)}))
        while not control.exists():
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", listen)
        await round_trip(reader, writer)  # no delay: a plain copy

        async def tell(up: float, down: float) -> None:
            r, w = await asyncio.open_unix_connection(str(control))
            w.write((json.dumps({"up": {"B": up}, "down": {"B": down}}) + "\n").encode())
            await w.drain()
            assert await r.readline() == b"ok\n"
            w.close()

        await tell(400, 300)  # on the open connection: both directions held
        assert await round_trip(reader, writer) >= 0.7
        payload = bytes(range(256)) * 2000  # many chunks: released in order
        writer.write(payload)
        await writer.drain()
        assert await reader.readexactly(len(payload)) == payload
        await tell(0, 0)
        assert await round_trip(reader, writer) < 0.7  # (a loaded machine's margin)
        writer.close()
        relay.cancel()
        peer.close()

    asyncio.run(asyncio.wait_for(go(), 20))
