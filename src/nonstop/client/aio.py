"""The asyncio driver of the client core: one multiplexed connection, ``asyncio.sleep``.

It performs the actions of :class:`~nonstop.client.core.ClientCore` steps and
is the asyncio client's session interface (``AsyncClient.sessions``, an
:class:`~nonstop.client.session.AsyncSessions`).  One connection to the current
node carries the admin requests and every task's transactions at once
(requests matched to replies by id), so many transactions are in flight on it;
it is replaced only once it is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from nonstop.client.core import (
    Action,
    Call,
    ClientCore,
    Close,
    Connect,
    Notify,
    Sleep,
    Step,
    arun,
)
from nonstop.client.session import AsyncLink, Link, Request

T = TypeVar("T")


class AsyncDriver:
    """Runs core steps with asyncio links made by ``await dial(address)``."""

    def __init__(self, core: ClientCore, dial: Callable[[str], Awaitable[AsyncLink]]) -> None:
        self.core = core
        self._dial = dial
        self._shared: AsyncLink | None = None
        self._dial_lock = asyncio.Lock()

    async def run(self, step: Step[T]) -> T:
        return await arun(step, self._perform)

    async def _perform(self, action: Action) -> Any:
        if isinstance(action, Call):
            return await _async(action.link).call(action.payload, action.timeout)
        if isinstance(action, Connect):
            if action.fresh:
                return await self._dial(action.address)
            return await self._shared_link(action.address)
        if isinstance(action, Notify):
            _async(action.link).send_nowait(action.payload)
        elif isinstance(action, Close):
            _async(action.link).close()
        elif isinstance(action, Sleep):
            await asyncio.sleep(action.seconds)
        # Release: the shared link stays for everybody.
        return None

    async def _shared_link(self, address: str) -> AsyncLink:
        """The shared connection, dialled to ``address`` if there is none open (one dial
        at a time: tasks that ask meanwhile get the same one)."""
        link = self._shared
        if link is not None and not link.closed:
            return link
        async with self._dial_lock:
            if self._shared is None or self._shared.closed:
                self._shared = await self._dial(address)
            return self._shared

    async def aclose(self) -> None:
        link, self._shared = self._shared, None
        if link is not None:
            await link.aclose()

    # ------------------------------------------- admin and commit outcome
    async def request(self, payload: Request) -> Any:
        """One admin request with fail-over (:meth:`ClientCore.request`)."""
        return await self.run(self.core.request(payload))

    async def request_result(self, address: str, req: list[Any], cause: BaseException) -> None:
        """The outcome of a commit whose reply was lost (:meth:`ClientCore.request_result`)."""
        await self.run(self.core.request_result(address, req, cause))

    # --------------------------------------- the AsyncSessions interface
    async def open(self, first: Request) -> tuple[Link, Any]:
        return await self.run(self.core.open_session(first))

    async def send(self, link: Link, payload: Request) -> Any:
        return await self.run(self.core.send(link, payload))

    async def commit(self, link: Link, payload: Request, req: list[Any] | None) -> None:
        await self.run(self.core.commit(link, payload, req))

    async def rollback(self, link: Link, s: int) -> None:
        await self.run(self.core.rollback(link, s))

    def release(self, link: Link) -> None:
        """Nothing to do: the shared link stays open for everybody."""

    def abandon(self, link: Link, s: int) -> None:
        _async(link).send_nowait({"op": "tx.rollback", "s": s})

    def take_request_id(self) -> list[Any]:
        return self.core.lanes.take()

    def request_id_done(self, req: list[Any]) -> None:
        self.core.lanes.done(req)


def _async(link: Link) -> AsyncLink:
    # Every link the core hands back is one this driver made.
    return cast(AsyncLink, link)


__all__ = ["AsyncDriver"]
