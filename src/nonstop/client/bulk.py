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

from typing import Any

from nonstop.client.channel import SyncChannel, client_hello
from nonstop.client.credentials import resolve_credential
from nonstop.client.failures import NodeRefused, is_network_error
from nonstop.client.handle import parse_addresses
from nonstop.errors import Unavailable
from nonstop.model.wire import raise_error
from nonstop.net.handshake import Hello

MAX_FRAME = 256 * 1024 * 1024
DEFAULT_TIMEOUT = 300.0
"""A bulk request may scan or write a whole range: minutes, not seconds."""
CONNECT_TIMEOUT = 5.0
READ_CHUNK = 1 << 20
"""Bulk replies are large: read them in bigger pieces than admin replies."""


class BulkClient:
    """A blocking connection to one node for ``bulk.*`` requests (one at a time)."""

    def __init__(
        self,
        address: str,
        *,
        cluster: str = "",
        timeout: float = DEFAULT_TIMEOUT,
        credentials: Any = None,
    ):
        self.address = parse_addresses(address)[0]
        self.cluster = cluster
        self.timeout = timeout
        # A credentials file (or $NONSTOP_CREDENTIALS): what a Spark task proves.
        self.credential = resolve_credential(credentials=credentials, addresses=[self.address])
        self._chan: SyncChannel | None = None

    @property
    def node(self) -> Hello | None:
        """The node's hello once connected."""
        return None if self._chan is None else self._chan.node

    def _connect(self) -> SyncChannel:
        try:
            return SyncChannel(
                self.address,
                client_hello(self.cluster, name="bulk-client"),
                timeout=CONNECT_TIMEOUT,
                max_frame=MAX_FRAME,
                read_chunk=READ_CHUNK,
                credential=self.credential,
            )
        except NodeRefused:
            raise  # another cluster or protocol: a configuration error (a ProtocolError)
        except OSError as exc:
            raise Unavailable(f"cannot reach node {self.address}: {exc}") from exc
        except Exception as exc:
            if not is_network_error(exc):
                raise
            raise Unavailable(f"no handshake with node {self.address}: {exc}") from exc

    def call(self, op: str, **payload: Any) -> Any:
        """Send ``{"op": op, **payload}``; the reply, or the node's error raised here."""
        if self._chan is None or self._chan.closed:
            self._chan = self._connect()
        try:
            reply = self._chan.call({"op": op, **payload}, self.timeout)
        except Exception as exc:
            if not is_network_error(exc):
                raise
            raise Unavailable(f"lost node {self.address} during {op}: {exc!r}") from exc
        return raise_error(reply)

    def close(self) -> None:
        if self._chan is not None:
            self._chan.close()

    def __enter__(self) -> BulkClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cluster_nodes(
    addresses: str, *, cluster: str = "", credentials: Any = None
) -> list[dict[str, Any]]:
    """The cluster's nodes (``{"name", "address", "location", "up"}``), from the first
    address that answers; :class:`~nonstop.errors.Unavailable` when none does."""
    last: Exception | None = None
    for address in parse_addresses(addresses):
        try:
            with BulkClient(
                address, cluster=cluster, timeout=CONNECT_TIMEOUT * 2, credentials=credentials
            ) as c:
                nodes = c.call("nodes")["nodes"]
        except Unavailable as exc:
            last = exc
            continue
        return sorted(nodes, key=lambda n: str(n["name"]))
    raise Unavailable(f"no node of the cluster answered at {addresses}: {last}")


__all__ = ["BulkClient", "cluster_nodes"]
