"""Bulk requests to ONE node (data-path.md §6): what a Spark task sends.

A Spark task reads the ranges a node masters from that node, and writes a
row's batch to the node that is its home; so unlike a
:class:`~nonstop.client.handle.Client`, a :class:`BulkClient` talks to one
address and does not fail over (the Spark task fails instead, and Spark
retries it — every write carries a tag, so a retry is harmless).
:func:`cluster_nodes` asks any node of a cluster for the list of nodes.

Errors come back as the node raised them (:func:`nonstop.model.wire.raise_error`):
``UnknownType``, ``FieldError``, ``DuplicateKey``, ...; a node that cannot be
reached is :class:`~nonstop.errors.Unavailable`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from typing import Any

from nonstop.client.handle import parse_addresses
from nonstop.errors import ProtocolError, Unavailable
from nonstop.model.wire import raise_error
from nonstop.net.frames import FrameDecoder, FrameError, encode
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN, ROLE_CLIENT, Hello, check

MAX_FRAME = 256 * 1024 * 1024
DEFAULT_TIMEOUT = 300.0
"""A bulk request may scan or write a whole range: minutes, not seconds."""
CONNECT_TIMEOUT = 5.0


class BulkClient:
    """A blocking connection to one node for ``bulk.*`` requests (one at a time)."""

    def __init__(self, address: str, *, cluster: str = "", timeout: float = DEFAULT_TIMEOUT):
        self.address = parse_addresses(address)[0]
        self.cluster = cluster
        self.timeout = timeout
        self.node: Hello | None = None
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(MAX_FRAME)
        self._pending: list[Any] = []
        self._ids = itertools.count(1)

    def _connect(self) -> None:
        host, _, port = self.address.rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT)
        except OSError as exc:
            raise Unavailable(f"cannot reach node {self.address}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._decoder, self._pending = sock, FrameDecoder(MAX_FRAME), []
        ours = Hello(
            cluster=self.cluster,
            name=f"bulk-client-{os.getpid()}",
            location=0,
            timestamp=0,
            proto_min=PROTOCOL_MIN,
            proto_max=PROTOCOL_MAX,
            role=ROLE_CLIENT,
            pid=os.getpid(),
        )
        try:
            sock.sendall(encode(ours.to_wire(), MAX_FRAME))
            answer = self._recv(time.monotonic() + CONNECT_TIMEOUT)
            if isinstance(answer, dict) and answer.get("t") == "reject":
                raise ProtocolError(f"{self.address} refused: {answer.get('reason')}")
            theirs = Hello.from_wire(answer)
            _, rejection = check(ours, theirs)
            if rejection is not None:
                raise ProtocolError(f"{self.address}: {rejection.reason}")
            self.node = theirs
        except (OSError, EOFError, ValueError, FrameError) as exc:
            self.close()
            raise Unavailable(f"no handshake with node {self.address}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def _recv(self, deadline: float) -> Any:
        assert self._sock is not None
        while not self._pending:
            self._sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self._sock.recv(1 << 20)
            if not data:
                raise EOFError("the node closed the connection")
            self._pending.extend(self._decoder.feed(data))
        return self._pending.pop(0)

    def call(self, op: str, **payload: Any) -> Any:
        """Send ``{"op": op, **payload}``; the reply, or the node's error raised here."""
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        rid = next(self._ids)
        deadline = time.monotonic() + self.timeout
        try:
            self._sock.sendall(
                encode({"t": "req", "id": rid, "p": {"op": op, **payload}}, MAX_FRAME)
            )
            while True:
                value = self._recv(deadline)
                if isinstance(value, dict) and value.get("t") == "rep" and value.get("id") == rid:
                    return raise_error(value.get("p"))
        except (OSError, EOFError, FrameError) as exc:
            self.close()
            raise Unavailable(f"lost node {self.address} during {op}: {exc!r}") from exc

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None

    def __enter__(self) -> BulkClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cluster_nodes(addresses: str, *, cluster: str = "") -> list[dict[str, Any]]:
    """The cluster's nodes (``{"name", "address", "location", "up"}``), from the first
    address that answers; :class:`~nonstop.errors.Unavailable` when none does."""
    last: Exception | None = None
    for address in parse_addresses(addresses):
        try:
            with BulkClient(address, cluster=cluster, timeout=CONNECT_TIMEOUT * 2) as c:
                nodes = c.call("nodes")["nodes"]
        except Unavailable as exc:
            last = exc
            continue
        return sorted(nodes, key=lambda n: str(n["name"]))
    raise Unavailable(f"no node of the cluster answered at {addresses}: {last}")


__all__ = ["BulkClient", "cluster_nodes"]
