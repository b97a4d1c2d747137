"""Client handles on a running cluster: ``connect`` (blocking) and ``connect_async``.

Both give transactions on the cluster with the embedded API
(``cluster.transaction()``, ``@nonstop.transactional``): see
:mod:`nonstop.client.remote`.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from nonstop.client.handle import AsyncClient, Client
from nonstop.client.local_folder import LOCAL_CLUSTER_DIR, local_cluster_addresses
from nonstop.client.remote import RemoteTransaction
from nonstop.client.remote_async import AsyncRemoteTransaction


def connect(addresses: str | list[str] | None = None, **options: Any) -> Client:
    """A blocking handle on the cluster reachable at ``addresses`` ("h:p,h:p").

    With no address: the local cluster of the current folder (the one
    ``nonstop local up`` started here, from ``./.nonstop/local/local.json``),
    logged at INFO on the ``nonstop.client`` logger; ``Unavailable`` naming the
    fix when there is none.

    Connects to the handle's primary (H5): with ``balance="spread"``, the
    default, each handle has its own among the addresses, so a cluster's
    clients are spread over its nodes; ``balance="first"`` pins the first
    address.  If the primary does not answer, the next address after it is tried
    (:class:`nonstop.errors.Unavailable` when none answers); later requests
    fail over the same way (see :class:`nonstop.client.handle.Client`).

    Authentication: ``user=`` and ``password=``, or ``credentials=`` a credentials
    file; else ``$NONSTOP_CREDENTIALS``; else, for the local cluster found here,
    its folder's ``credentials.json`` (:mod:`nonstop.client.credentials`).
    A refused credential raises :class:`~nonstop.errors.AuthenticationFailed`.
    """
    if addresses is None:
        addresses = local_cluster_addresses()
        options.setdefault("folder", LOCAL_CLUSTER_DIR)
    client = Client(addresses, **options)
    try:
        client.ping()
    except BaseException:
        client.close()
        raise
    return client


class Connecting:
    """What :func:`connect_async` returns: await it, or ``async with`` it (closed on exit)."""

    def __init__(self, addresses: str | list[str], options: dict[str, Any]) -> None:
        self._client = AsyncClient(addresses, **options)

    async def _open(self) -> AsyncClient:
        try:
            await self._client.ping()
        except BaseException:
            await self._client.aclose()
            raise
        return self._client

    def __await__(self) -> Generator[Any, None, AsyncClient]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncClient:
        return await self._open()

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()


def connect_async(addresses: str | list[str] | None = None, **options: Any) -> Connecting:
    """An asyncio handle on the cluster; connects to its primary, as :func:`connect`
    (options too: ``balance="spread"`` or ``"first"``).

    With no address: the local cluster of the current folder, as :func:`connect`.

    ``client = await nonstop.connect_async(...)`` or
    ``async with nonstop.connect_async(...) as client:`` (closed at the end).
    """
    if addresses is None:
        addresses = local_cluster_addresses()
        options.setdefault("folder", LOCAL_CLUSTER_DIR)
    return Connecting(addresses, options)


__all__ = [
    "AsyncClient",
    "AsyncRemoteTransaction",
    "Client",
    "Connecting",
    "RemoteTransaction",
    "connect",
    "connect_async",
]
