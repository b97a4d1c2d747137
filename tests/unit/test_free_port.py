"""``free_port``: ports for local nodes that no outgoing connection can take meanwhile."""

from __future__ import annotations

import socket

from nonstop.admin.local import _ephemeral_low, free_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)  # never the same port twice in one process
    low = _ephemeral_low()
    assert all(1024 <= p < low for p in ports), (low, ports)
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free when handed out


def test_a_port_someone_listens_on_is_never_handed_out() -> None:
    taken = []
    for _ in range(20):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        taken.append(s)
    try:
        busy = {s.getsockname()[1] for s in taken}
        assert not busy & {free_port() for _ in range(200)}
    finally:
        for s in taken:
            s.close()
