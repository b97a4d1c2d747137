"""Client handles: talk to a cluster through any of its nodes, fail over when one dies.

``nonstop.connect("h:p,h:p")`` returns a :class:`Client` (blocking sockets, no
event loop needed, safe to use from scripts, threads and the CLI);
``await nonstop.connect_async(...)`` returns an :class:`AsyncClient` (asyncio).
Both speak the client role of the wire protocol (``docs/design/wire.md``) and
follow the same rules, written once in :mod:`nonstop.client.core` and
performed by a blocking (:mod:`~nonstop.client.blocking`) or an asyncio
(:mod:`~nonstop.client.aio`) driver; ``docs/design/client.md`` has the map.

Load balancing (H5, :mod:`nonstop.client.balance`): each handle has its own
*primary* among the addresses, the others being its backups in order after
it.  With ``balance="spread"`` (the default) the handles are spread over the
addresses (a process's handles take them in turn from a random start), so
every node coordinates its share of the transactions; ``balance="first"``
pins the order given: the first address is the primary.

Fail-over: a request goes to the node the handle is on (its primary until
that fails); when that node cannot be reached or stops answering within
``timeout``, the handle tries the next address after it, and so on for at
most ``rounds`` passes over the list, then raises
:class:`nonstop.errors.Unavailable`.  A node that answers ``QuorumLost`` (it is
Disabled, D16) is skipped the same way: another node may still have quorum.
A node that *refuses* the client when it connects — another cluster's name,
no common protocol version, TLS credentials not accepted — raises
:class:`~nonstop.client.failures.NodeRefused` (a
:class:`~nonstop.errors.ProtocolError`) at once, naming the node and the
reason: every node of the cluster would refuse it the same way.

Transactions (``cluster.transaction()``, ``@nonstop.transactional``) run on
the node the client is attached to (``nonstop.client.remote``).  A new
transaction goes to the first reachable node, starting with the current one
(the handle stays on a backup it moved to, also once its primary is back);
a transaction whose node dies fails with :class:`~nonstop.errors.Unavailable`
(B8) and the next one goes to another node.  Commits are exactly once (H1):
each client has an id (``client_id``) and numbers its commits.
"""

from __future__ import annotations

import ssl
from typing import Any

from nonstop.client.aio import AsyncDriver
from nonstop.client.balance import DEFAULT_BALANCE, Balance, check_balance
from nonstop.client.blocking import BlockingDriver
from nonstop.client.channel import AsyncChannel, SyncChannel, client_hello
from nonstop.client.core import ClientCore
from nonstop.client.credentials import resolve_credential
from nonstop.client.remote import RemoteTransaction
from nonstop.client.remote_async import AsyncRemoteTransaction
from nonstop.errors import ClusterError, NotAuthorized, NotLeader, QuorumLost, TooLarge, Unavailable
from nonstop.model.wire import raise_error
from nonstop.net.address import split_address
from nonstop.net.auth import Credential
from nonstop.net.frames import DEFAULT_MAX_FRAME
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN, Hello
from nonstop.net.tls import TLSConfig, client_context

DEFAULT_TIMEOUT = 5.0
"""How long a connect, an admin request or a rollback may take (seconds)."""
DEFAULT_OP_TIMEOUT = 30.0
"""How long a data request may take (it may wait for locks on the node)."""


def parse_addresses(addresses: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"a:1,b:2"`` or a sequence → a non-empty list of ``host:port``."""
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    out = [a.strip() for a in items if a and a.strip()]
    if not out:
        raise ValueError("no node address given")
    for a in out:
        split_address(a)  # ValueError for anything but host:port
    return out


def raise_for_error(reply: Any) -> Any:
    """Turn an ``{"error": ...}`` reply into the matching :mod:`nonstop.errors` exception."""
    if isinstance(reply, dict) and "error" in reply:
        name = reply.get("error")
        message = str(reply.get("message") or name)
        if name == "QuorumLost":
            raise QuorumLost(message)
        if name == "NotLeader":
            raise NotLeader(message, reply.get("leader"))
        if name == "Unavailable":
            raise Unavailable(message)
        if name == "NotAuthorized":
            raise NotAuthorized(message)
        if name == "TooLarge":
            raise TooLarge(message)
        raise ClusterError(f"{name}: {message}")
    return reply


class ClientBase:
    """The options and the core both handles hold (see the module docstring).

    ``user``/``password``, or ``credentials`` (a credentials file), is what the
    client proves when it connects; without them ``NONSTOP_CREDENTIALS`` and the
    local cluster folder ``folder`` are looked at (:mod:`nonstop.client.credentials`).

    ``balance``: ``"spread"`` (default) or ``"first"`` — which address is the
    handle's primary (see the module docstring); anything else is a ``ValueError``.
    """

    def __init__(
        self,
        addresses: str | list[str],
        *,
        cluster: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        rounds: int = 2,
        tls: TLSConfig | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        protocol: tuple[int, int] = (PROTOCOL_MIN, PROTOCOL_MAX),
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        user: str | None = None,
        password: str | None = None,
        credentials: Any = None,
        folder: Any = None,
        balance: Balance = DEFAULT_BALANCE,
    ) -> None:
        check_balance(balance)  # before anything is resolved or opened
        parsed = parse_addresses(addresses)
        self.credential: Credential | None = resolve_credential(
            user, password, credentials, folder, parsed
        )
        self.core = ClientCore(
            parsed, rounds=rounds, timeout=timeout, op_timeout=op_timeout, balance=balance
        )
        self.cluster = cluster
        self.max_frame = max_frame
        self.protocol = protocol
        self._ssl: ssl.SSLContext | None = client_context(tls) if tls and tls.enabled else None
        self._start()

    def _start(self) -> None:
        """Make the driver (``self.sessions``)."""

    def _hello(self) -> Hello:
        return client_hello(self.cluster, self.protocol)

    @property
    def addresses(self) -> list[str]:
        return self.core.addresses

    @property
    def address(self) -> str:
        """The address of the node requests go to now."""
        return self.core.address

    @property
    def primary(self) -> str:
        """The address of this handle's primary (H5): where its requests go while it answers."""
        return self.core.primary

    @property
    def balance(self) -> str:
        """How the primary was chosen: ``"spread"`` or ``"first"``."""
        return self.core.balance

    @property
    def node(self) -> Hello | None:
        """The hello of the node that answered last (None before any answer)."""
        return self.core.node

    @property
    def client_id(self) -> str:
        """This client's id in exactly-once commit requests (H1; see ``client.lanes``)."""
        return self.core.lanes.client_id

    @property
    def timeout(self) -> float:
        return self.core.timeout

    @property
    def op_timeout(self) -> float:
        return self.core.op_timeout

    @property
    def rounds(self) -> int:
        return self.core.rounds


class Client(ClientBase):
    """A blocking handle on a cluster (see the module docstring)."""

    sessions: BlockingDriver
    """The session interface remote transactions use (``client.session.Sessions``)."""

    def _start(self) -> None:
        self.sessions = BlockingDriver(self.core, self._dial)

    def _dial(self, address: str) -> SyncChannel:
        return SyncChannel(
            address,
            self._hello(),
            timeout=self.timeout,
            ssl_context=self._ssl,
            max_frame=self.max_frame,
            credential=self.credential,
        )

    def request(self, payload: Any) -> Any:
        """Send one request, failing over across the addresses; the raw reply payload."""
        return self.sessions.request(payload)

    def call(self, payload: Any) -> Any:
        """:meth:`request`, raising the matching exception for an error reply."""
        return raise_for_error(self.request(payload))

    # ------------------------------------------------------------- admin
    def status(self) -> dict[str, Any]:
        """The cluster status as seen by the node answering (view, quorum, leader, nodes)."""
        return self.call({"op": "status"})  # type: ignore[no-any-return]

    def ping(self) -> dict[str, Any]:
        """The answering node's name, cluster, address, pid and protocol range."""
        return self.call({"op": "ping"})  # type: ignore[no-any-return]

    def join(self, name: str, address: str) -> dict[str, Any]:
        """Add node ``name`` at ``address`` to the cluster membership."""
        return self.call({"op": "join", "name": name, "address": address})  # type: ignore[no-any-return]

    def leave(self, name: str) -> dict[str, Any]:
        """Remove node ``name`` from the cluster membership."""
        return self.call({"op": "leave", "name": name})  # type: ignore[no-any-return]

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes: ``[{"name", "address", "location", "up"}, ...]``."""
        return raise_error(self.request({"op": "nodes"}))["nodes"]  # type: ignore[no-any-return]

    # -------------------------------------------------------------- data
    def transaction(self, isolation: str = "serializable") -> RemoteTransaction:
        """A new transaction on the cluster: ``with cluster.transaction() as tx``.

        The same API as an embedded transaction (see :mod:`nonstop.client.remote`);
        it begins on the node with its first operation.
        """
        return RemoteTransaction(self.sessions, isolation)

    def close(self) -> None:
        self.sessions.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(ClientBase):
    """The asyncio twin of :class:`Client` (same rules: one core, another driver).

    It keeps one connection to its current node, multiplexed: admin requests
    and the requests of every running transaction share it, replies matched by
    id, so many tasks' transactions are in flight at once.
    """

    sessions: AsyncDriver
    """The session interface remote transactions use (``client.session.AsyncSessions``)."""

    def _start(self) -> None:
        self.sessions = AsyncDriver(self.core, self._dial)

    async def _dial(self, address: str) -> AsyncChannel:
        return await AsyncChannel.open(
            address,
            self._hello(),
            timeout=self.timeout,
            ssl_context=self._ssl,
            max_frame=self.max_frame,
            credential=self.credential,
        )

    async def request(self, payload: Any) -> Any:
        """Send one request, failing over across the addresses; the raw reply payload."""
        return await self.sessions.request(payload)

    async def call(self, payload: Any) -> Any:
        """:meth:`request`, raising the matching exception for an error reply."""
        return raise_for_error(await self.request(payload))

    async def status(self) -> dict[str, Any]:
        return await self.call({"op": "status"})  # type: ignore[no-any-return]

    async def ping(self) -> dict[str, Any]:
        return await self.call({"op": "ping"})  # type: ignore[no-any-return]

    async def join(self, name: str, address: str) -> dict[str, Any]:
        return await self.call({"op": "join", "name": name, "address": address})  # type: ignore[no-any-return]

    async def leave(self, name: str) -> dict[str, Any]:
        return await self.call({"op": "leave", "name": name})  # type: ignore[no-any-return]

    async def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes: ``[{"name", "address", "location", "up"}, ...]``."""
        return raise_error(await self.request({"op": "nodes"}))["nodes"]  # type: ignore[no-any-return]

    # -------------------------------------------------------------- data
    def transaction(self, isolation: str = "serializable") -> AsyncRemoteTransaction:
        """A new transaction on the cluster: ``async with cluster.transaction() as tx``."""
        return AsyncRemoteTransaction(self.sessions, isolation)

    async def aclose(self) -> None:
        await self.sessions.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


__all__ = [
    "DEFAULT_OP_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "Client",
    "ClientBase",
    "parse_addresses",
    "raise_for_error",
]
