"""Dynamic location discovery by UDP announcements (C2).

Every ``interval`` seconds a node announces ``{cluster, name, address, proto}``
and listens for the announcements of others; a node of the same cluster heard
this way becomes known at its address (the runtime feeds it to the machine as
a discovery announcement).  Static addresses always win over announced ones
(the runtime ranks address sources).

Two modes, both off by default because neither works everywhere:

* ``multicast``: one datagram to ``group:port`` on ``interface`` with the
  given TTL (0 keeps it on the host, 1 on the local network segment).  Needs
  an interface with multicast enabled; many container and cloud networks
  drop multicast.
* ``loopback``: for clusters on one machine.  Each node receives on UDP
  ``127.0.0.1:<its TCP listen port>`` and sends its announcement to every
  port of ``ports`` (a ``[first, last]`` range) on 127.0.0.1 — nothing leaves
  the host, and no multicast support is needed.

Announcements are one msgpack value per datagram; anything else is ignored
(with a debug log line), as are announcements of other clusters.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

log = logging.getLogger("nonstop.discovery")

MAX_DATAGRAM = 1400


@dataclass
class DiscoveryConfig:
    """The ``[discovery]`` section of a node config; ``enabled`` is false by default."""

    enabled: bool = False
    mode: str = "multicast"
    group: str = "239.255.77.77"
    port: int = 7199
    interface: str = "127.0.0.1"
    ttl: int = 0
    interval: float = 1.0
    ports: list[int] = field(default_factory=lambda: [7101, 7120])
    """Loopback mode: the inclusive range of listen ports to announce to."""


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: Discovery) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.owner.on_datagram(data)

    def error_received(self, exc: Exception) -> None:
        log.debug("discovery socket error: %r", exc)


class Discovery:
    """Announce ourselves and report the nodes we hear: ``on_found(name, address)``."""

    def __init__(
        self,
        config: DiscoveryConfig,
        *,
        cluster: str,
        name: str,
        address: str,
        protocol: tuple[int, int],
        on_found: Callable[[str, str], None],
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.name = name
        self.address = address
        self.on_found = on_found
        self._message = msgpack.packb(
            {
                "t": "announce",
                "cluster": cluster,
                "name": name,
                "address": address,
                "proto": list(protocol),
            }
        )
        self._transport: asyncio.DatagramTransport | None = None
        self._task: asyncio.Task[None] | None = None
        self.heard: dict[str, str] = {}

    def _socket(self) -> socket.socket:
        cfg = self.config
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if cfg.mode == "loopback":
                port = int(self.address.rpartition(":")[2])
                sock.bind(("127.0.0.1", port))
            elif cfg.mode == "multicast":
                if hasattr(socket, "SO_REUSEPORT"):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind(("", cfg.port))
                group, iface = socket.inet_aton(cfg.group), socket.inet_aton(cfg.interface)
                mreq = struct.pack("4s4s", group, iface)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
                sock.setsockopt(
                    socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(cfg.interface)
                )
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, cfg.ttl)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            else:
                raise ValueError(f"unknown discovery mode {cfg.mode!r}")
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def _targets(self) -> list[tuple[str, int]]:
        cfg = self.config
        if cfg.mode == "loopback":
            first, last = cfg.ports[0], cfg.ports[-1]
            return [("127.0.0.1", p) for p in range(first, last + 1)]
        return [(cfg.group, cfg.port)]

    async def start(self) -> bool:
        """Open the socket and start announcing; False (logged) where it cannot work."""
        loop = asyncio.get_running_loop()
        try:
            sock = self._socket()
            transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
        except OSError as exc:
            log.warning("dynamic discovery (%s) unavailable here: %s", self.config.mode, exc)
            return False
        self._transport = transport
        self._task = asyncio.ensure_future(self._announce())
        log.info("dynamic discovery on (%s)", self.config.mode)
        return True

    async def _announce(self) -> None:
        while True:
            assert self._transport is not None
            for target in self._targets():
                try:
                    self._transport.sendto(self._message, target)
                except OSError as exc:
                    log.debug("announce to %s failed: %r", target, exc)
            await asyncio.sleep(self.config.interval)

    def on_datagram(self, data: bytes) -> None:
        if len(data) > MAX_DATAGRAM:
            return
        try:
            msg = msgpack.unpackb(data, raw=False)
        except Exception:
            log.debug("ignoring a datagram that is not an announcement")
            return
        if not isinstance(msg, dict) or msg.get("t") != "announce":
            return
        name, address = msg.get("name"), msg.get("address")
        if msg.get("cluster") != self.cluster or not isinstance(name, str):
            return
        if name == self.name or not isinstance(address, str):
            return
        if self.heard.get(name) != address:
            self.heard[name] = address
            self.on_found(name, address)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.close()
