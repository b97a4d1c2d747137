"""The connection bounds's deadlines and caps (runtime/limits.py), on a virtual clock.

The real-process attacks are in ``tests/cluster/test_resource_bounds.py``; this
checks the rules one by one with connections whose clocks the test sets.
"""

from __future__ import annotations

import asyncio
from typing import Any

from nonstop.net.connection import Connection
from nonstop.runtime.limits import CLIENT, PEER, ConnectionBounds, ConnectionLimits


class FakeWriter:
    def __init__(self) -> None:
        self.closing = False
        self.transport: Any = None

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 5000) if key == "peername" else None

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def write(self, data: bytes) -> None:
        pass


LOOP = asyncio.new_event_loop()
"""The readers' loop: the bounds never reads, and no loop runs in these tests."""


def teardown_module() -> None:
    LOOP.close()


def connection(opened: float) -> Connection:
    conn = Connection(asyncio.StreamReader(loop=LOOP), FakeWriter())  # type: ignore[arg-type]
    conn.opened_at = conn.last_activity = opened
    return conn


LIMITS = ConnectionLimits(
    handshake_timeout=5,
    frame_timeout=10,
    client_idle_timeout=60,
    max_handshaking_connections=2,
    max_client_connections=1,
)


def test_each_deadline_closes_and_counts() -> None:
    bounds = ConnectionBounds(
        ConnectionLimits(handshake_timeout=5, frame_timeout=10, client_idle_timeout=60)
    )
    silent, slow, idle, busy, peer = (connection(0.0) for _ in range(5))
    assert bounds.opened(silent) is None and bounds.opened(slow) is None
    bounds.handshaken(slow, CLIENT)
    slow.partial_since = 1.0
    for conn in (idle, busy, peer):
        assert bounds.opened(conn) is None
    bounds.handshaken(idle, CLIENT)
    bounds.handshaken(busy, CLIENT)
    busy.frames_in = 3  # a request still waiting for its reply: not idle
    busy.frames_out = 2
    bounds.handshaken(peer, PEER)  # node links have their own keep-alives
    assert bounds.sweep(4.9) == []
    assert bounds.sweep(5.1) == [silent]
    assert bounds.sweep(11.1) == [slow]
    assert bounds.sweep(61.0) == [idle]
    assert not busy.closed and not peer.closed
    assert bounds.refusals.as_dict() == {
        "frame_too_large": 0,
        "budget_exceeded": 0,
        "too_many_connections": 0,
        "handshake_timeout": 1,
        "idle_timeout": 1,
        "slow_sender": 1,
        "slow_reader": 0,
    }
    assert silent.close_reason is not None and "handshake_timeout" in silent.close_reason


def test_caps_refuse_and_count() -> None:
    bounds = ConnectionBounds(LIMITS)
    first, second, third = (connection(0.0) for _ in range(3))
    assert bounds.opened(first) is None and bounds.opened(second) is None
    refused = bounds.opened(third)
    assert refused is not None and "max_handshaking_connections" in refused
    assert bounds.admit(CLIENT) is None
    bounds.handshaken(first, CLIENT)
    rejection = bounds.admit(CLIENT)
    assert rejection is not None and rejection.code == "TooManyConnections"
    assert "max_client_connections" in rejection.reason
    assert bounds.admit(PEER) is None  # nodes have their own cap
    bounds.closed(first)
    assert bounds.admit(CLIENT) is None
    assert bounds.refusals.too_many_connections == 2
    assert bounds.snapshot()["connections"] == {"handshaking": 1, "client": 0, "peer": 0}
