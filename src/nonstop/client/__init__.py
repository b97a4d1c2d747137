"""Client handles on a running cluster: ``connect`` (blocking) and ``connect_async``."""

from __future__ import annotations

from typing import Any

from nonstop.client.handle import AsyncClient, Client


def connect(addresses: str | list[str], **options: Any) -> Client:
    """A blocking handle on the cluster reachable at ``addresses`` ("h:p,h:p").

    Connects to the first node that answers (:class:`nonstop.errors.Unavailable`
    when none does); later requests fail over across the addresses (see
    :class:`nonstop.client.handle.Client`).
    """
    client = Client(addresses, **options)
    try:
        client.ping()
    except BaseException:
        client.close()
        raise
    return client


async def connect_async(addresses: str | list[str], **options: Any) -> AsyncClient:
    """An asyncio handle on the cluster; connects to the first node that answers."""
    client = AsyncClient(addresses, **options)
    await client.ping()
    return client


__all__ = ["AsyncClient", "Client", "connect", "connect_async"]
