"""Bounded resources of a node's listener: connections, deadlines, buffered bytes (issue 11).

The node port takes connections from anybody who can reach it, so what one
connection (or many) can make the node hold is bounded:

* **bytes**: a frame is at most ``max_frame_bytes`` (``handshake_frame_bytes``
  until the handshake is done), and the bytes of incomplete frames of all
  connections share one :class:`~nonstop.net.budget.BufferBudget`
  (``buffer_budget_bytes``);
* **connections**: at most ``max_handshaking_connections`` that have not
  finished their handshake, and ``max_client_connections`` client
  connections (``max_peer_connections`` node connections) after it;
  beyond, a ``reject`` frame with code ``TooManyConnections`` (the client
  tries another node) and close;
* **replies**: a client whose unsent replies pass ``reply_backlog_bytes`` is not
  read from until it takes them (``frame_timeout``, else closed: slow reader);
* **time**: a handshake not finished in ``handshake_timeout``, a frame not
  completed in ``frame_timeout`` (slow sender), a client connection with no
  frame either way for ``client_idle_timeout`` and no request in progress
  (a long lock wait is not idleness) — closed.

Every refusal is counted in :class:`Refusals`, a plain object the runtime
exposes (``runtime_stats``, the ``status`` op's ``limits``) for operators and,
later, a metrics exporter.  :class:`ConnectionBounds` enforces the limits; the
transport tells it what each inbound connection is doing, and one sweeper task
checks the deadlines (nothing is added to the per-frame path but timestamps).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from nonstop.net.budget import DEFAULT_BUFFER_BUDGET, BufferBudget
from nonstop.net.connection import Connection
from nonstop.net.frames import BufferBudgetExceeded, FrameError, FrameTooLarge
from nonstop.net.handshake import Rejection

log = logging.getLogger("nonstop.runtime")

TOO_MANY_CONNECTIONS = "TooManyConnections"
"""Reject code of a connection over a cap: not a configuration error, another node may take it."""

HANDSHAKING = "handshaking"
CLIENT = "client"
PEER = "peer"


@dataclass
class ConnectionLimits:
    """The limits of one node's listener (the ``[limits]`` table of the node config)."""

    buffer_budget_bytes: int = DEFAULT_BUFFER_BUDGET
    handshake_frame_bytes: int = 64 * 1024
    max_client_connections: int = 1000
    max_peer_connections: int = 256
    """Inbound connections from nodes (a node keeps one to each peer, plus one while it
    reconnects): far above any cluster's size, a bound on hellos claiming to be nodes."""
    max_handshaking_connections: int = 128
    handshake_timeout: float = 5.0
    frame_timeout: float = 60.0
    """Also how long a client that does not read its replies may keep the node waiting."""
    reply_backlog_bytes: int = 4 * 1024 * 1024
    """Unsent reply bytes of a client connection above which its requests are not read
    until it takes them (``frame_timeout``, else closed: a slow reader)."""
    client_idle_timeout: float = 900.0
    """0 turns the idle timeout off."""

    def sweep_interval(self) -> float:
        """How often deadlines are checked: a quarter of the shortest, within [0.05, 1] s."""
        timeouts = [t for t in (self.handshake_timeout, self.frame_timeout) if t > 0]
        if self.client_idle_timeout > 0:
            timeouts.append(self.client_idle_timeout)
        return min(1.0, max(0.05, min(timeouts, default=4.0) / 4))


@dataclass
class Refusals:
    """How many connections each limit closed or refused since the node started."""

    frame_too_large: int = 0
    budget_exceeded: int = 0
    too_many_connections: int = 0
    handshake_timeout: int = 0
    idle_timeout: int = 0
    slow_sender: int = 0
    slow_reader: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass
class ConnectionBounds:
    """Tracks the inbound connections of one node and enforces :class:`ConnectionLimits`."""

    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    refusals: Refusals = field(default_factory=Refusals)
    budget: BufferBudget = field(init=False)
    _state: dict[Connection, str] = field(default_factory=dict, init=False)
    _counts: dict[str, int] = field(
        default_factory=lambda: {HANDSHAKING: 0, CLIENT: 0, PEER: 0}, init=False
    )
    _sweeper: asyncio.Task[None] | None = field(default=None, init=False)
    tls_pending: int = field(default=0, init=False)
    """Connections in their TLS handshake (before a :class:`Connection` exists)."""

    def __post_init__(self) -> None:
        self.budget = BufferBudget(self.limits.buffer_budget_bytes)

    # ------------------------------------------------------------ states
    def over_handshaking_cap(self) -> str | None:
        """None if one more connection may start its handshake, else why not (counted)."""
        pending = self._counts[HANDSHAKING] + self.tls_pending
        if pending < self.limits.max_handshaking_connections:
            return None
        self.refusals.too_many_connections += 1
        return (
            f"node has {pending} connections still in their handshake "
            "(max_handshaking_connections); try again or another node"
        )

    def opened(self, conn: Connection) -> str | None:
        """A connection was accepted: None to go on, else why it is refused (counted)."""
        refused = self.over_handshaking_cap()
        if refused is not None:
            return refused
        conn.set_frame_limit(min(conn.max_frame, self.limits.handshake_frame_bytes))
        self._set(conn, HANDSHAKING)
        return None

    def admit(self, role: str) -> Rejection | None:
        """The handshake of a :data:`CLIENT` or :data:`PEER` is about to succeed: refuse
        it over its cap."""
        cap, key = (
            (self.limits.max_client_connections, "max_client_connections")
            if role == CLIENT
            else (self.limits.max_peer_connections, "max_peer_connections")
        )
        if self._counts[role] < cap:
            return None
        self.refusals.too_many_connections += 1
        return Rejection(
            TOO_MANY_CONNECTIONS,
            f"node has {self._counts[role]} {role} connections ({key}); try again or another node",
        )

    def handshaken(self, conn: Connection, role: str) -> None:
        """The handshake is done: ``role`` is :data:`CLIENT` or :data:`PEER`."""
        conn.set_frame_limit(conn.max_frame)
        self._set(conn, role)

    def closed(self, conn: Connection) -> None:
        state = self._state.pop(conn, None)
        if state is not None:
            self._counts[state] -= 1

    def _set(self, conn: Connection, state: str) -> None:
        old = self._state.get(conn)
        if old is not None:
            self._counts[old] -= 1
        self._state[conn] = state
        self._counts[state] += 1

    # ------------------------------------------------------------ errors
    def frame_error(self, conn: Connection, exc: FrameError, who: str) -> None:
        """Count and log a frame the decoder refused (the caller closes the connection)."""
        if isinstance(exc, FrameTooLarge):
            self.refusals.frame_too_large += 1
        elif isinstance(exc, BufferBudgetExceeded):
            self.refusals.budget_exceeded += 1
        log.warning("closing connection from %s: %s", who, exc)

    async def replies_taken(self, conn: Connection) -> bool:
        """Before reading more requests from a client: if its replies pile up unsent, wait
        for it to take them; False (closed, counted) if it does not within ``frame_timeout``.
        A client that sends without reading would otherwise make the node buffer every
        reply (``docs/security.md``, Resource bounds)."""
        if conn.unsent <= self.limits.reply_backlog_bytes:
            return True
        if await conn.drained(self.limits.frame_timeout):
            return True
        if not conn.closed:
            self.refusals.slow_reader += 1
            reason = (
                f"{conn.unsent} bytes of replies not taken within {self.limits.frame_timeout}s "
                "(limits.reply_backlog_bytes, limits.frame_timeout)"
            )
            log.warning("closing connection from %s: %s", conn.remote, reason)
            conn.close(reason)
        return False

    def handshake_timed_out(self, remote: str) -> None:
        self.refusals.handshake_timeout += 1
        log.info(
            "closing connection from %s: no handshake within %ss (handshake_timeout)",
            remote,
            self.limits.handshake_timeout,
        )

    # ------------------------------------------------------------ deadlines
    def start(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    async def _sweep_forever(self) -> None:
        interval = self.limits.sweep_interval()
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep(time.monotonic())
            except Exception:  # a bug here must not end the checks for good
                log.exception("connection sweep failed")

    def sweep(self, now: float) -> list[Connection]:
        """Close every connection past a deadline at ``now``; returns them."""
        late = [
            (conn, missed)
            for conn, state in self._state.items()
            if not conn.closed and (missed := self._missed(conn, state, now)) is not None
        ]
        for conn, (counter, reason) in late:
            setattr(self.refusals, counter, getattr(self.refusals, counter) + 1)
            level = logging.INFO if counter == "idle_timeout" else logging.WARNING
            log.log(level, "closing connection from %s: %s", conn.remote, reason)
            conn.close(reason)
        return [conn for conn, _ in late]

    def _missed(self, conn: Connection, state: str, now: float) -> tuple[str, str] | None:
        """The deadline ``conn`` missed at ``now`` (its counter and a reason), if any."""
        lim = self.limits
        if state == HANDSHAKING and 0 < lim.handshake_timeout < now - conn.opened_at:
            return (
                "handshake_timeout",
                f"no handshake within {lim.handshake_timeout}s (limits.handshake_timeout)",
            )
        begun = conn.partial_since
        if begun is not None and 0 < lim.frame_timeout < now - begun:
            return (
                "slow_sender",
                f"a frame not completed within {lim.frame_timeout}s (limits.frame_timeout)",
            )
        if (
            state == CLIENT
            and 0 < lim.client_idle_timeout < now - conn.last_activity
            and conn.frames_in <= conn.frames_out  # a request waiting for its reply is no idling
        ):
            return (
                "idle_timeout",
                f"idle for {lim.client_idle_timeout}s (limits.client_idle_timeout)",
            )
        return None

    # ------------------------------------------------------------ reporting
    def snapshot(self) -> dict[str, Any]:
        """Counters, connections and buffered bytes, JSON-able (``status``, ``runtime_stats``)."""
        return {
            "refusals": self.refusals.as_dict(),
            "connections": dict(self._counts),
            "buffered_bytes": self.budget.used,
            "buffered_peak_bytes": self.budget.peak,
            "buffer_budget_bytes": self.budget.limit,
        }


__all__ = [
    "TOO_MANY_CONNECTIONS",
    "ConnectionBounds",
    "ConnectionLimits",
    "Refusals",
]
