"""One framed, handshaken TCP (optionally TLS) connection on asyncio.

Both node↔node links and client↔node links use this class; what differs is
what the frames after the hello mean (see ``docs/design/wire.md``):

* node → node: ``{"t": "m", "p": payload}`` — a protocol machine's message;
* client → node: ``{"t": "req", "id": n, "p": payload}`` answered by
  ``{"t": "rep", "id": n, "p": payload}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
import time
from collections.abc import Callable
from typing import Any

from nonstop.errors import ProtocolError
from nonstop.net.auth import OPEN, Credential, Principal
from nonstop.net.budget import BufferBudget
from nonstop.net.challenge import Guard, ProofError, Prover
from nonstop.net.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode
from nonstop.net.handshake import (
    AUTHENTICATION_FAILED,
    BAD_HELLO,
    ROLE_NODE,
    UNSUPPORTED_PROTOCOL,
    WRONG_CLUSTER,
    Hello,
    Rejection,
    check,
)

READ_CHUNK = 256 * 1024
MAX_WRITE_BUFFER = 64 * 1024 * 1024
"""Above this many unsent bytes a connection drops further sends: delivery is
best effort, and a stopped peer must not make this node buffer without bound."""


class HandshakeRejected(ProtocolError):
    """The other side refused our hello (``code`` is a reject code of :mod:`handshake`)."""

    def __init__(self, code: str, reason: str, peer: Hello | None = None) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
        self.peer = peer


class Connection:
    """A framed stream: ``await recv()`` values, ``send()`` values without waiting.

    It keeps the times its owner's deadlines are checked against (all
    ``time.monotonic()``): when it was opened, when a frame last came or went
    (:attr:`last_activity`) and since when the frame being received is
    incomplete (:attr:`partial_since`, None between frames).  ``budget`` is
    the node-wide budget its incomplete frames are charged to (accepting side).
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame: int = DEFAULT_MAX_FRAME,
        budget: BufferBudget | None = None,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.max_frame = max_frame
        self._decoder = FrameDecoder(max_frame, budget)
        self.opened_at = time.monotonic()
        self.last_activity = self.opened_at
        self.partial_since: float | None = None
        self.frames_in = 0
        self.frames_out = 0
        """Frames received and queued to send: on a client connection every frame in is a
        request and every frame out a reply, so more in than out means one is in progress."""
        self._closed = False
        self.close_reason: str | None = None
        """Why this side closed it (set by whoever enforces a limit), for the logs."""
        self._pending: collections.deque[Any] = collections.deque()
        self._out: list[bytes] = []
        self._out_bytes = 0
        self.peer: Hello | None = None
        self.version: int | None = None
        self.principal: Principal = OPEN
        """Who the other end proved to be in the handshake (``net.auth``)."""
        self.dropped = 0
        peer = writer.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def recv(self) -> Any:
        """The next value; ``EOFError`` at end of stream, :class:`FrameError` on bad bytes."""
        while not self._pending:
            data = await self.reader.read(READ_CHUNK)
            if not data or self._closed:
                raise EOFError(self.close_reason or "connection closed by peer")
            values = self._decoder.feed(data)
            now = time.monotonic()
            if values:
                self._pending.extend(values)
                self.frames_in += len(values)
                self.last_activity = now
                self.partial_since = now if self._decoder.buffered else None
            elif self.partial_since is None:
                self.partial_since = now
        return self._pending.popleft()

    def set_frame_limit(self, max_frame: int) -> None:
        """Accept frames up to ``max_frame`` from now on (raised once a handshake is done)."""
        self._decoder.max_frame = max_frame

    @property
    def head(self) -> bytes:
        """The first bytes received (up to 5), to recognise a TLS record on a plain port."""
        return self._decoder.head

    async def recv_many(self) -> list[Any]:
        """Every value already received (waiting for at least one); errors as :meth:`recv`."""
        if not self._pending:
            self._pending.append(await self.recv())
        out = list(self._pending)
        self._pending.clear()
        return out

    def send(self, value: Any) -> bool:
        """Queue ``value`` for sending; False when it was dropped (closed or backlogged).

        Frames queued in one event-loop turn leave in one write (one syscall
        instead of one per message: under load that is most of the CPU a
        node spends on the network).
        """
        if self.writer.is_closing():
            return False
        transport = self.writer.transport
        if transport.get_write_buffer_size() + self._out_bytes > MAX_WRITE_BUFFER:
            self.dropped += 1
            return False
        frame = encode(value, self.max_frame)
        self.frames_out += 1
        self.last_activity = time.monotonic()
        if not self._out:
            asyncio.get_running_loop().call_soon(self.flush)
        self._out.append(frame)
        self._out_bytes += len(frame)
        return True

    def flush(self) -> None:
        """Hand the queued frames to the transport now."""
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            self._out_bytes = 0
            if not self.writer.is_closing():
                self.writer.write(data)

    @property
    def unsent(self) -> int:
        """Bytes queued for the other side that it has not taken yet (ours and the transport's)."""
        transport = self.writer.transport
        return self._out_bytes + (0 if transport is None else transport.get_write_buffer_size())

    async def drained(self, timeout: float) -> bool:
        """Wait until the other side took what is queued (down to the transport's low mark);
        False if it did not within ``timeout`` seconds or the connection broke."""
        self.flush()
        try:
            await asyncio.wait_for(self.writer.drain(), timeout)
        except (TimeoutError, ConnectionError):
            return False
        return True

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()

    def close(self, reason: str | None = None) -> None:
        """Flush what is queued and close without waiting (safe to call twice).

        ``reason`` is kept for the reader's log line; the buffered bytes of an
        incomplete frame are freed and given back to the budget.
        """
        if reason is not None and self.close_reason is None:
            self.close_reason = reason
        self._closed = True
        self._decoder.release()
        with contextlib.suppress(Exception):
            self.flush()
            self.writer.close()

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


def hello_from_answer(ours: Hello, answer: Any, address: str, trusted: bool = True) -> Hello:
    """The dialing side's check of the accepting side's last frame (async and blocking).

    Returns the peer's hello; raises :class:`HandshakeRejected` when the peer
    refused us (a ``reject`` frame), when we refuse it (:func:`check`), or when
    the version it chose is outside our range, and :class:`ProtocolError` when
    the frame is not a hello at all.  A refusal's hello is attached to the
    exception only when ``trusted`` (the peer proved membership, or nobody
    proves anything): an unproven one must not classify a member (C3).
    """
    if isinstance(answer, dict) and answer.get("t") == "reject":
        rejecter: Hello | None = None
        if trusted:
            try:
                rejecter = Hello.from_wire(answer.get("hello"))
            except ValueError:
                rejecter = None
        raise HandshakeRejected(str(answer.get("code")), str(answer.get("reason")), rejecter)
    try:
        theirs = Hello.from_wire(answer)
    except ValueError as exc:
        raise ProtocolError(f"bad hello from {address}: {exc}") from exc
    _version, rejection = check(ours, theirs)
    if rejection is not None:
        raise HandshakeRejected(rejection.code, rejection.reason, theirs)
    if theirs.proto is None or not ours.proto_min <= theirs.proto <= ours.proto_max:
        raise HandshakeRejected(
            UNSUPPORTED_PROTOCOL, f"peer chose protocol {theirs.proto}, outside our range", theirs
        )
    return theirs


async def dial(
    host: str,
    port: int,
    hello: Hello,
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
    timeout: float = 5.0,
    max_frame: int = DEFAULT_MAX_FRAME,
    credential: Credential | None = None,
) -> Connection:
    """Connect and handshake; raises ``OSError``/``TimeoutError``/:class:`ProtocolError`.

    The accepting side chooses the version (the highest common one); we check
    that its choice is inside our range rather than trusting it.  ``credential``
    is what we prove when the node asks (:mod:`nonstop.net.challenge`).
    """
    kwargs: dict[str, Any] = {}
    if ssl_context is not None:
        kwargs["ssl"] = ssl_context
        kwargs["server_hostname"] = server_hostname or host
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, limit=READ_CHUNK, **kwargs), timeout
    )
    conn = Connection(reader, writer, max_frame)
    try:
        prover = Prover(hello, credential)
        conn.send(prover.first())
        answer = await asyncio.wait_for(conn.recv(), timeout)
        try:
            reply = prover.on_answer(answer)
            if reply is None:
                prover.check_open(answer)
            else:
                conn.send(reply)
                answer = await asyncio.wait_for(conn.recv(), timeout)
                prover.on_final(answer)
        except ProofError as exc:
            raise HandshakeRejected(AUTHENTICATION_FAILED, str(exc)) from None
        theirs = hello_from_answer(prover.hello, answer, f"{host}:{port}", prover.trusted)
        conn.peer = theirs
        conn.version = theirs.proto
        return conn
    except BaseException:
        conn.close()
        raise


async def accept(
    conn: Connection,
    ours: Hello,
    timeout: float = 5.0,
    extra_check: Callable[[Hello], Rejection | None] | None = None,
    guard: Guard | None = None,
) -> Hello:
    """Server side of the handshake: read the peer's hello, answer, return it.

    With a ``guard`` the peer must first prove membership or a user's password
    (:mod:`nonstop.net.challenge`); :attr:`Connection.principal` says who it is.
    Raises :class:`HandshakeRejected` (after sending the reject frame) or
    :class:`FrameError`/``EOFError``/``TimeoutError``; the caller closes.  A
    refusal before the proof carries no peer hello (``exc.peer`` is None): what
    an unproven connection claims must not reach the failure detector.
    """
    first = await asyncio.wait_for(conn.recv(), timeout)
    try:
        theirs = Hello.from_wire(first)
    except ValueError as exc:
        bad = Rejection(BAD_HELLO, str(exc))
        conn.send(bad.to_wire())
        raise HandshakeRejected(bad.code, bad.reason) from exc
    version, checked = check(ours, theirs)
    state = None
    if guard is not None:
        if checked is not None and checked.code == WRONG_CLUSTER:
            await _refuse(conn, checked.to_wire())
            raise HandshakeRejected(checked.code, checked.reason)
        made = guard.challenge(ours, theirs, first)
        if isinstance(made, Rejection):
            await _refuse(conn, made.to_wire())
            raise HandshakeRejected(made.code, f"{made.reason} ({_claims(theirs)})")
        frame, state = made
        conn.send(frame)
        proof = await asyncio.wait_for(conn.recv(), timeout)
        try:
            conn.principal = guard.verify(state, theirs, proof)
        except ProofError as exc:
            told = "unknown user or wrong password" if theirs.user else "wrong cluster secret"
            await _refuse(conn, Rejection(AUTHENTICATION_FAILED, told).to_wire())
            raise HandshakeRejected(AUTHENTICATION_FAILED, f"{exc} ({_claims(theirs)})") from None
    rejection: Rejection | None = checked
    if rejection is None and extra_check is not None:
        rejection = extra_check(theirs)
    if rejection is not None:
        wire = rejection.to_wire(ours if theirs.role == ROLE_NODE else None)
        if state is not None and guard is not None:
            wire["proof"] = guard.sign(state, wire.get("hello") or {}, rejection.code)
        await _refuse(conn, wire)
        raise HandshakeRejected(rejection.code, rejection.reason, theirs)
    answer = Hello(
        cluster=ours.cluster,
        name=ours.name,
        location=ours.location,
        timestamp=ours.timestamp,
        proto_min=ours.proto_min,
        proto_max=ours.proto_max,
        role=ours.role,
        address=ours.address,
        pid=ours.pid,
        proto=version,
    )
    wire = answer.to_wire()
    if state is not None and guard is not None:
        wire["proof"] = guard.sign(state, wire, "ok")
    conn.send(wire)
    conn.peer = theirs
    conn.version = version
    return theirs


async def _refuse(conn: Connection, frame: dict[str, Any]) -> None:
    """Send a reject frame and give it a moment to leave before the caller closes."""
    conn.send(frame)
    conn.flush()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.writer.drain(), 1.0)


def _claims(hello: Hello) -> str:
    """Who a refused dialer claimed to be, for the log line."""
    who = f"user {hello.user!r}" if hello.user else f"{hello.role} {hello.name!r}"
    return (
        f"{who} claimed, cluster {hello.cluster!r}, protocol {hello.proto_min}..{hello.proto_max}"
    )


__all__ = [
    "Connection",
    "FrameError",
    "HandshakeRejected",
    "accept",
    "dial",
    "hello_from_answer",
]
