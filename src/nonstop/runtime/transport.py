"""The real runtime's network: listener, handshakes, peer links, address book, discovery.

* One persistent outbound TCP (or TLS) connection per peer (:class:`PeerLink`),
  dialed on demand and re-dialed with a short back-off; messages sent while it
  is (re)connecting wait in a small bounded backlog, beyond it they are
  dropped (``Send`` is best effort by contract).  Messages *from* a peer
  arrive on the connection it dialed to us.
* The address book: where each node name listens, from the configuration
  (static), a peer's hello, a dialed address's answer, peers' address books
  or UDP announcements; a higher source wins (C2: static beats dynamic).
  Every connected peer is told the addresses we know (peer-assisted discovery).
* Authentication (``config.guard``, :mod:`nonstop.net.challenge`): a peer is a
  member only once it proved the cluster secret, on both directions of a link;
  a client connection carries the principal it proved (a user, or a node asking
  to join).  A connection refused before its proof changes nothing here.
* Identity checks: a second live process claiming a name we talk to is
  refused; a refusal because of a proven peer's identity or protocol range is
  handed to the host so the failure detector can classify the peer (C3).

The transport knows nothing of machines: it tells its :class:`TransportHost`
(the runtime) what it sees, and hands it the handshake'd client connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from nonstop.errors import ProtocolError
from nonstop.net import handshake
from nonstop.net.address import split_address
from nonstop.net.auth import NodeKey
from nonstop.net.connection import Connection, HandshakeRejected, accept, dial
from nonstop.net.discovery import Discovery
from nonstop.net.frames import FrameError
from nonstop.net.handshake import Hello
from nonstop.net.tls import (
    TLS_NOT_ENABLED,
    TLSSetupError,
    certificate_names,
    client_context,
    looks_like_tls,
    server_context,
)
from nonstop.runtime.config import RuntimeConfig
from nonstop.runtime.limits import CLIENT, PEER, TOO_MANY_CONNECTIONS, ConnectionBounds
from nonstop.runtime.listener import Listener

log = logging.getLogger("nonstop.runtime")

SOURCE_STATIC = 3
SOURCE_HELLO = 2
SOURCE_DISCOVERY = 1
"""Where an address came from; a higher source wins (C2: static beats dynamic)."""

IDENTITY_CODES = frozenset(
    {handshake.UNSUPPORTED_PROTOCOL, handshake.DUPLICATE_LOCATION, handshake.DUPLICATE_TIMESTAMP}
)
"""Refusals the failure detector turns into C3 node states."""

PEER_SLICE = 0.005
"""Seconds of a peer's frames handled in one loop turn before the loop gets a turn."""
BACKLOG = 1024
"""Messages kept for a peer while its connection is being (re)established."""


class TransportHost(Protocol):
    """What the transport tells the runtime."""

    def now(self) -> float: ...

    def on_message(self, sender: str, payload: Any) -> None:
        """A peer's message (a ``{"t": "m"}`` frame)."""

    def on_discovered(self, name: str, address: str) -> None:
        """Node ``name`` was found listening at ``address``."""

    def on_refused_identity(self, peer: Hello) -> None:
        """A connection with ``peer`` was refused for its identity or protocol range."""

    def on_startup_refusal(self, exc: HandshakeRejected) -> None:
        """Right after start a peer refused *us* (duplicate name, wrong cluster)."""

    def serve_client(self, conn: Connection) -> Awaitable[None]:
        """Serve a handshake'd client connection until it ends."""
        ...


class PeerLink:
    """The outbound connection to one address, re-dialed until the runtime stops."""

    def __init__(self, transport: Transport, address: str, source: int) -> None:
        self.transport = transport
        self.address = address
        self.source = source
        self.name: str | None = None
        self.conn: Connection | None = None
        self.backlog: collections.deque[Any] = collections.deque(maxlen=BACKLOG)
        self.refused: str | None = None
        self.first_attempt = asyncio.Event()
        """Set once the first dial finished, whatever its outcome."""
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def send(self, payload: Any) -> None:
        frame = {"t": "m", "p": payload}
        if self.conn is not None and not self.conn.closed:
            try:
                self.conn.send(frame)
            except FrameError as exc:
                log.error("cannot send to %s: %s", self.name or self.address, exc)
        else:
            self.backlog.append(frame)

    def reconnect(self) -> None:
        """Drop the connection (if any) and dial again without waiting for the back-off."""
        self.backlog.clear()
        if self.conn is not None:
            self.conn.close()
        self._wake.set()

    def stop(self) -> None:
        self._task.cancel()
        if self.conn is not None:
            self.conn.close()

    async def _sleep(self, delay: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _run(self) -> None:
        tr = self.transport
        delay = tr.config.redial_min
        host, port = split_address(self.address)
        while True:
            try:
                conn = await dial(
                    host,
                    port,
                    tr.hello,
                    ssl_context=tr.client_ssl,
                    timeout=tr.config.connect_timeout,
                    max_frame=tr.config.max_frame,
                    credential=tr.node_key,
                )
            except HandshakeRejected as exc:
                tr.on_rejected(self, exc)
                self.first_attempt.set()
                await self._sleep(max(delay, 1.0))
                delay = min(delay * 2, tr.config.redial_max)
                continue
            except ssl.SSLCertVerificationError as exc:
                if self.refused != "TLS":
                    log.error("TLS: cannot verify the certificate of %s: %s", self.address, exc)
                self.refused = "TLS"
                self.first_attempt.set()
                await self._sleep(max(delay, 1.0))
                delay = min(delay * 2, tr.config.redial_max)
                continue
            except (OSError, TimeoutError, EOFError, ProtocolError) as exc:
                log.debug("dial %s failed: %r", self.address, exc)
                self.first_attempt.set()
                await self._sleep(delay)
                delay = min(delay * 2, tr.config.redial_max)
                continue
            assert conn.peer is not None
            self.first_attempt.set()
            wrong = tr.certificate_mismatch(conn, conn.peer.name)
            if wrong is not None:
                if self.refused != "certificate":
                    log.error("peer at %s refused: %s", self.address, wrong)
                self.refused = "certificate"
                conn.close()
                await self._sleep(max(delay, 1.0))
                delay = min(delay * 2, tr.config.redial_max)
                continue
            if not tr.on_link_up(self, conn):
                conn.close()
                return
            delay = tr.config.redial_min
            self.refused = None
            self.conn = conn
            while self.backlog:
                try:
                    conn.send(self.backlog.popleft())
                except FrameError as exc:
                    log.error("cannot send to %s: %s", self.name, exc)
            # Nothing is expected on an outbound link; reading detects its end.
            try:
                while True:
                    value = await conn.recv()
                    log.debug("unexpected frame on link to %s: %r", self.name, value)
            except (OSError, EOFError, FrameError, asyncio.IncompleteReadError) as exc:
                log.debug("link to %s closed: %r", self.name, exc)
            finally:
                conn.close()
                self.conn = None
                tr.on_link_down(self)
            if not self._wake.is_set():
                await self._sleep(delay)


class Transport:
    """Connections to peers and from clients (module doc)."""

    def __init__(
        self,
        hello: Hello,
        config: RuntimeConfig,
        host: TransportHost,
        stats: collections.Counter[str],
    ) -> None:
        self.hello = hello
        self.name = hello.name
        self.config = config
        self.host = host
        self.stats = stats
        self.bounds = ConnectionBounds(config.limits)
        """Caps, deadlines and the buffer budget of inbound connections, with their counters."""
        self.listener: Listener | None = None
        self.server_ssl: ssl.SSLContext | None = None
        self.client_ssl: ssl.SSLContext | None = None
        if config.tls.enabled:
            self.server_ssl = server_context(config.tls)
            self.client_ssl = client_context(config.tls)
        self.guard = config.guard
        self.node_key = None if config.guard is None else NodeKey(config.guard.secret)
        """What this node proves when it dials a peer (the cluster secret)."""
        self.peers: dict[str, Hello] = {}
        """The last hello seen from each peer name (address, pid, ...)."""
        self.addresses: dict[str, tuple[str, int]] = {}
        """name → (address, source)."""
        self._links: dict[str, PeerLink] = {}
        """address → outbound link."""
        self._by_name: dict[str, PeerLink] = {}
        self._inbound: dict[str, set[Connection]] = collections.defaultdict(set)
        self.discovery: Discovery | None = None
        self.started_at = 0.0
        self._stopping = False

    # ================================================================ life
    async def listen(self) -> None:
        """Bind the listener (a port conflict fails here, before anything is dialed).

        A TLS node then checks that its certificate can be verified the way its
        peers will verify it (:class:`~nonstop.net.tls.TLSSetupError` if not).
        """
        host, port = split_address(self.config.listen)
        self.listener = Listener(self._on_accept, self.bounds, self.server_ssl, self.name)
        await self.listener.start(host, port)
        self.bounds.start()
        if self.server_ssl is not None:
            await self._check_own_certificate(host, port)

    async def _check_own_certificate(self, host: str, port: int) -> None:
        """Dial our own listener with the context peers use; refuse to start if it fails.

        Without this a certificate no peer can verify (no ``tls.ca`` and a
        private CA, another CA's file, a certificate for another host) means
        a node that never connects to anybody and says nothing.
        """
        if host in ("0.0.0.0", "::", ""):
            return  # peers dial another address: nothing to check the host name against
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=self.client_ssl, server_hostname=host),
                self.config.connect_timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            if self.listener is not None:
                self.listener.close()
            tls = self.config.tls
            hint = (
                "; without tls.ca a certificate must chain to a CA of the system store: "
                "set tls.ca to the CA file that signed the nodes' certificates"
                if not tls.ca
                else f"; is it signed by the CA in {tls.ca}?"
            )
            raise TLSSetupError(
                f"TLS: peers cannot verify this node's certificate {tls.cert} "
                f"({exc.verify_message}){hint}"
            ) from None
        except (OSError, TimeoutError) as exc:
            log.warning("could not check this node's own TLS certificate: %r", exc)
            return
        writer.close()

    async def start(self) -> None:
        """Dial the configured peers and start discovery."""
        self.started_at = self.host.now()
        for name, address in self.config.static_peers.items():
            self.learn(name, address, SOURCE_STATIC, feed=False)
        for address in self.config.join:
            if address != self.config.listen and address not in self._links:
                self._link_for(address, SOURCE_STATIC)
        if self.config.discovery.enabled:
            self.discovery = Discovery(
                self.config.discovery,
                cluster=self.hello.cluster,
                name=self.name,
                address=self.config.listen,
                protocol=(self.hello.proto_min, self.hello.proto_max),
                on_found=lambda name, address: self.learn(name, address, SOURCE_DISCOVERY),
            )
            await self.discovery.start()

    async def first_contacts(self, timeout: float) -> None:
        """Wait until every configured peer address was dialed once (or ``timeout``)."""
        waits = [link.first_attempt.wait() for link in self._links.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)

    def stop(self) -> None:
        """No new connections; every link and inbound connection closed."""
        self._stopping = True
        self.bounds.stop()
        if self.listener is not None:
            self.listener.close()
        if self.discovery is not None:
            self.discovery.stop()
        for link in list(self._links.values()):
            link.stop()
        for conns in self._inbound.values():
            for conn in conns:
                conn.close()

    # ============================================================ sending
    def send(self, to: str, payload: Any) -> None:
        """Send ``payload`` to peer ``to`` (best effort; dropped if its address is unknown)."""
        link = self._by_name.get(to)
        if link is None:
            self.stats["send_unknown"] += 1
            log.debug("no address known for %s; message dropped", to)
            return
        link.send(payload)

    def reconnect(self, peer: str) -> None:
        link = self._by_name.get(peer)
        if link is not None:
            link.reconnect()
        for conn in list(self._inbound.get(peer, ())):
            conn.close()

    def connected(self, name: str) -> bool:
        link = self._by_name.get(name)
        return link is not None and link.conn is not None and not link.conn.closed

    def connected_names(self) -> list[str]:
        return sorted(n for n in self._by_name if self.connected(n))

    # ======================================================= address book
    def _link_for(self, address: str, source: int) -> PeerLink:
        link = self._links.get(address)
        if link is None:
            link = PeerLink(self, address, source)
            self._links[address] = link
        elif source > link.source:
            link.source = source
        return link

    def learn(self, name: str, address: str, source: int, *, feed: bool = True) -> None:
        """Record that ``name`` listens at ``address`` (static > hello > discovery)."""
        if name == self.name or not address:
            return
        known = self.addresses.get(name)
        if known is not None and (known[0] == address or known[1] > source):
            return
        self.addresses[name] = (address, source)
        link = self._by_name.get(name)
        if link is not None and link.address != address:
            log.info("node %s moves from %s to %s", name, link.address, address)
            del self._by_name[name]
            link.stop()
            self._links.pop(link.address, None)
        if name not in self._by_name:
            new = self._link_for(address, source)
            new.name = name
            self._by_name[name] = new
        if feed:
            self.host.on_discovered(name, address)
        if known is None:
            self._share_addresses()

    def on_link_up(self, link: PeerLink, conn: Connection) -> bool:
        """An outbound link finished its handshake; False to give the link up."""
        assert conn.peer is not None
        name = conn.peer.name
        if link.name is not None and link.name != name:
            # Configured as ``B@addr`` but another node answers there.
            log.error("expected node %s at %s, found node %s", link.name, link.address, name)
            if self._by_name.get(link.name) is link:
                del self._by_name[link.name]
                self.addresses.pop(link.name, None)
        self.peers[name] = conn.peer
        owner = self._by_name.get(name)
        if owner is not None and owner is not link:
            if owner.source >= link.source:
                # Two addresses lead to one node (e.g. a static alias): keep one link.
                self._links.pop(link.address, None)
                return False
            owner.stop()
            self._links.pop(owner.address, None)
        link.name = name
        self._by_name[name] = link
        known = self.addresses.get(name)
        if known is None or known[0] != link.address:
            self.addresses[name] = (link.address, link.source)
            self.host.on_discovered(name, link.address)
        log.info("connected to %s at %s (protocol %s)", name, link.address, conn.version)
        conn.send(self._address_book_frame(exclude=name))
        return True

    def _address_book_frame(self, exclude: str | None = None) -> dict[str, Any]:
        book = {n: a for n, (a, _) in self.addresses.items() if n != exclude}
        return {"t": "addr", "book": book}

    def _share_addresses(self) -> None:
        """Tell every connected peer the addresses we know (peer-assisted discovery, C2).

        A node that joined through one address learns the others this way, and
        they learn it from its hello when it dials them.
        """
        for name, link in self._by_name.items():
            if link.conn is not None and not link.conn.closed:
                link.conn.send(self._address_book_frame(exclude=name))

    def _on_address_book(self, sender: str, book: Any) -> None:
        if not isinstance(book, dict):
            return
        for name, address in book.items():
            if not isinstance(name, str) or not isinstance(address, str):
                continue
            if name == self.name or name in self.addresses:
                continue
            try:
                split_address(address)
            except ValueError:
                continue
            log.info("learned %s at %s from %s", name, address, sender)
            self.learn(name, address, SOURCE_DISCOVERY)

    def on_link_down(self, link: PeerLink) -> None:
        if link.name is not None and not self._stopping:
            log.info("connection to %s at %s lost", link.name, link.address)

    def on_rejected(self, link: PeerLink, exc: HandshakeRejected) -> None:
        """A dial was refused by identity/protocol checks: log once, tell the host."""
        peer_name = exc.peer.name if exc.peer is not None else link.name
        if link.refused != exc.code:
            log.error("peer at %s refused: %s", link.address, exc)
        link.refused = exc.code
        fatal_codes = (handshake.DUPLICATE_NAME, handshake.WRONG_CLUSTER)
        if (
            exc.code in fatal_codes
            and self.host.now() - self.started_at < self.config.startup_grace
        ):
            # Right after start this means *we* are the misconfigured node.
            self.host.on_startup_refusal(exc)
        if exc.code in IDENTITY_CODES and exc.peer is not None and peer_name:
            self.host.on_refused_identity(exc.peer)

    # ============================================================ inbound
    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        bounds = self.bounds
        conn = Connection(reader, writer, self.config.max_frame, bounds.budget)
        refused = bounds.opened(conn)
        if refused is not None:
            log.warning("refusing connection from %s: %s", conn.remote, refused)
            await self._refuse_busy(conn, refused)
            return
        try:
            try:
                peer = await accept(
                    conn,
                    self.hello,
                    self.config.limits.handshake_timeout,
                    lambda hello: self._check_accept(hello) or self._check_certificate(conn, hello),
                    guard=self.guard,
                )
            except HandshakeRejected as exc:
                log.warning("rejected connection from %s: %s", conn.remote, exc)
                self.stats[f"refused_{exc.code}"] += 1
                # exc.peer is None when the refusal came before the proof: only a
                # proven member's identity or protocol range may classify it (C3).
                refused_peer = exc.peer
                if (
                    refused_peer is not None
                    and refused_peer.role == handshake.ROLE_NODE
                    and exc.code in IDENTITY_CODES
                ):
                    self.host.on_refused_identity(refused_peer)
                return
            except FrameError as exc:
                if self.server_ssl is None and looks_like_tls(conn.head):
                    self._refuse_tls(conn)
                else:
                    bounds.frame_error(conn, exc, conn.remote)
                return
            except TimeoutError:
                bounds.handshake_timed_out(conn.remote)
                return
            except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
                log.debug("handshake with %s failed: %r", conn.remote, exc)
                return
            if peer.role == handshake.ROLE_CLIENT:
                bounds.handshaken(conn, CLIENT)
                await self.host.serve_client(conn)
            elif self.guard is not None and conn.principal.kind != "node":
                log.warning("closing %s: a node link from a non-member", conn.remote)
            else:
                bounds.handshaken(conn, PEER)
                await self._serve_peer(conn, peer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection from %s failed", conn.remote)
        finally:
            bounds.closed(conn)
            conn.close()

    async def _refuse_busy(self, conn: Connection, reason: str) -> None:
        """Answer ``TooManyConnections`` before the hello and close so that the client reads it.

        Our frame and end of stream go first; then what the client sent (its hello)
        is read until it closes, at most a moment: closing with unread bytes would
        reset the connection and could destroy the answer on its way.
        """
        conn.send(handshake.Rejection(TOO_MANY_CONNECTIONS, reason).to_wire())
        conn.flush()
        with contextlib.suppress(Exception):
            conn.writer.write_eof()
            async with asyncio.timeout(0.5):
                while await conn.reader.read(65536):
                    pass
        conn.close()

    def _refuse_tls(self, conn: Connection) -> None:
        """A TLS client on this plain port: log it, and answer bytes that are not TLS
        (its TLS library then reports a wrong version number, which the client reads
        as :data:`~nonstop.net.tls.TLS_NOT_ENABLED`; silence would look like a crash)."""
        log.warning(
            "closing connection from %s: it speaks TLS, this node's listener is plain TCP "
            "(no tls.cert)",
            conn.remote,
        )
        reason = f"node {self.name} does not speak TLS (no tls.cert)"
        conn.send(handshake.Rejection(TLS_NOT_ENABLED, reason).to_wire())

    def _check_accept(self, peer: Hello) -> handshake.Rejection | None:
        """The transport's checks of a hello beyond the handshake's own: identity, caps."""
        if peer.role == handshake.ROLE_CLIENT:
            return self.bounds.admit(CLIENT)
        return self._check_identity(peer) or self.bounds.admit(PEER)

    def _check_identity(self, peer: Hello) -> handshake.Rejection | None:
        """Refuse a second live process claiming a name we already talk to.

        Without this a node started by mistake with a used name would take
        over the real node's address in every peer's address book.
        """
        if peer.role != handshake.ROLE_NODE:
            return None
        known = self.peers.get(peer.name)
        if known is not None and known.timestamp != peer.timestamp and self.connected(peer.name):
            return handshake.Rejection(
                handshake.DUPLICATE_NAME,
                f"node name {peer.name!r} is already used by a running node at "
                f"{self.addresses.get(peer.name, ('?',))[0]}",
            )
        return None

    def certificate_mismatch(self, conn: Connection, name: str) -> str | None:
        """With ``tls.member_names``: why ``conn``'s certificate does not name node ``name``."""
        if not (self.config.tls.member_names and self.config.tls.enabled):
            return None
        names = certificate_names(conn.writer.get_extra_info("peercert"))
        if name in names:
            return None
        return (
            f"node {name!r} presented a certificate for {', '.join(sorted(names)) or 'no name'}"
            " (tls.member_names: a node's certificate must name it)"
        )

    def _check_certificate(self, conn: Connection, peer: Hello) -> handshake.Rejection | None:
        """A node whose certificate names another node is refused (``tls.member_names``)."""
        if peer.role != handshake.ROLE_NODE and peer.auth != "node":
            return None
        wrong = self.certificate_mismatch(conn, peer.name)
        return None if wrong is None else handshake.Rejection(handshake.WRONG_CERTIFICATE, wrong)

    async def _serve_peer(self, conn: Connection, peer: Hello) -> None:
        self.peers[peer.name] = peer
        self._inbound[peer.name].add(conn)
        if peer.address:
            self.learn(peer.name, peer.address, SOURCE_HELLO)
        on_message = self.host.on_message
        try:
            while True:
                try:
                    values = await conn.recv_many()
                except FrameError as exc:
                    self.bounds.frame_error(conn, exc, peer.name)
                    return
                except (OSError, EOFError, asyncio.IncompleteReadError):
                    return
                slice_end = time.monotonic() + PEER_SLICE
                for value in values:
                    if time.monotonic() >= slice_end:
                        # Frames that arrived together are handled in order, but not in
                        # one loop turn: the keep-alives and the other peers' messages
                        # behind them get their turn between (runtime.md, "A busy loop").
                        await asyncio.sleep(0)
                        slice_end = time.monotonic() + PEER_SLICE
                    kind = value.get("t") if isinstance(value, dict) else None
                    if kind == "m":
                        self.stats["received"] += 1
                        on_message(peer.name, value.get("p"))
                    elif kind == "addr":
                        self._on_address_book(peer.name, value.get("book"))
                    else:
                        log.warning(
                            "closing connection from %s: unknown message type %r",
                            peer.name,
                            kind if isinstance(value, dict) else type(value).__name__,
                        )
                        return
        finally:
            self._inbound[peer.name].discard(conn)


__all__ = [
    "BACKLOG",
    "IDENTITY_CODES",
    "SOURCE_DISCOVERY",
    "SOURCE_HELLO",
    "SOURCE_STATIC",
    "PeerLink",
    "Transport",
    "TransportHost",
]
