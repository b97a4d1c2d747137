"""What a remote transaction needs from its client: the session interface.

A remote transaction (:mod:`nonstop.client.remote`, :mod:`~nonstop.client.remote_async`)
does not know how its client connects, pools connections or fails over.  It
sees a connection only as a :class:`Link` (which node, still open?) and asks
its client's ``sessions`` object — a :class:`Sessions` (blocking) or
:class:`AsyncSessions` (asyncio) — to open a session, send an op in it,
commit it, roll it back and hand the connection back.  Both are implemented
by the drivers of the one client core (:mod:`nonstop.client.core`,
:mod:`~nonstop.client.blocking`, :mod:`~nonstop.client.aio`); these protocols
are the whole contract, so the transaction modules import no client module.
"""

from __future__ import annotations

from typing import Any, Protocol

from nonstop.net.handshake import Hello

Request = dict[str, Any]
"""A request payload (``{"op": ..., ...}``)."""


class Link(Protocol):
    """A connection to one node, as the core and a transaction see it."""

    @property
    def address(self) -> str:
        """The ``host:port`` it was dialled at."""
        ...

    @property
    def node(self) -> Hello | None:
        """The node's hello (its name, cluster, protocol range)."""
        ...

    @property
    def closed(self) -> bool:
        """True once it failed or was closed: it carries nothing any more."""
        ...


class BlockingLink(Link, Protocol):
    """A blocking connection, one request at a time (``client.channel.SyncChannel``)."""

    def call(self, payload: Any, timeout: float) -> Any: ...

    def close(self) -> None: ...

    def gone_while_idle(self) -> bool:
        """Did the node close it while it sat unused (its idle timeout, a restart)?"""
        ...


class AsyncLink(Link, Protocol):
    """A multiplexed asyncio connection (:class:`~nonstop.client.channel.AsyncChannel`)."""

    async def call(self, payload: Any, timeout: float) -> Any: ...

    def send_nowait(self, payload: Any) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None: ...


class CommonSessions(Protocol):
    """What both session interfaces offer without waiting for the network."""

    def take_request_id(self) -> list[Any]:
        """An exactly-once id ``[lane, seq]`` for one commit (H1, :mod:`nonstop.client.lanes`);
        give it back with :meth:`request_id_done`."""
        ...

    def request_id_done(self, req: list[Any]) -> None:
        """The commit's outcome is known (or given up on): its lane may carry the next."""
        ...

    def release(self, link: Link) -> None:
        """The transaction is over: the link may carry the next one."""
        ...


class Sessions(CommonSessions, Protocol):
    """The blocking client's session interface (``Client.sessions``)."""

    def open(self, first: Request) -> tuple[Link, Any]:
        """Send a session's first op (it carries ``begin``) to the first node that
        takes it; the link the session lives on and the raw reply."""
        ...

    def send(self, link: Link, payload: Request) -> Any:
        """An op of an open session; the raw reply.  :class:`~nonstop.errors.Unavailable`
        when the connection fails (the node rolls the session back)."""
        ...

    def commit(self, link: Link, payload: Request, req: list[Any] | None) -> None:
        """Commit; returns once committed, raises the refusal or
        :class:`~nonstop.errors.Unavailable` (outcome unknown).  A lost reply is
        answered by asking the node for the recorded outcome of ``req``."""
        ...

    def rollback(self, link: Link, s: int) -> None:
        """Roll session ``s`` back (best effort: a lost link rolls it back too)."""
        ...


class AsyncSessions(CommonSessions, Protocol):
    """The asyncio client's session interface (``AsyncClient.sessions``): as :class:`Sessions`."""

    async def open(self, first: Request) -> tuple[Link, Any]: ...

    async def send(self, link: Link, payload: Request) -> Any: ...

    async def commit(self, link: Link, payload: Request, req: list[Any] | None) -> None: ...

    async def rollback(self, link: Link, s: int) -> None: ...

    def abandon(self, link: Link, s: int) -> None:
        """The task waiting in session ``s`` was cancelled: tell the node to roll it
        back without waiting (the link is shared with other tasks' sessions)."""
        ...


__all__ = [
    "AsyncLink",
    "AsyncSessions",
    "BlockingLink",
    "CommonSessions",
    "Link",
    "Request",
    "Sessions",
]
