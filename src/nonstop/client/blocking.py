"""The blocking driver of the client core: sockets, a pool of connections, ``time.sleep``.

It performs the actions of :class:`~nonstop.client.core.ClientCore` steps and
is the blocking client's session interface (``Client.sessions``, a
:class:`~nonstop.client.session.Sessions`).  A blocking connection carries one
request at a time, so each running transaction holds its own; a pool keeps a
few open between transactions (and admin requests) of the current node.
Threads may share a client: the pool is locked, the core's address index too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from nonstop.client.core import (
    Action,
    Call,
    ClientCore,
    Close,
    Connect,
    Notify,
    Release,
    Sleep,
    Step,
    run,
)
from nonstop.client.session import BlockingLink, Link, Request

T = TypeVar("T")

POOL_SIZE = 16
"""Connections kept open between transactions (more threads than this dial anew)."""


class BlockingDriver:
    """Runs core steps with blocking links made by ``dial(address)``."""

    def __init__(self, core: ClientCore, dial: Callable[[str], BlockingLink]) -> None:
        self.core = core
        self._dial = dial
        self._pool: list[BlockingLink] = []
        self._pool_lock = threading.Lock()

    def run(self, step: Step[T]) -> T:
        return run(step, self._perform)

    def _perform(self, action: Action) -> Any:
        if isinstance(action, Call):
            return _blocking(action.link).call(action.payload, action.timeout)
        if isinstance(action, Connect):
            return self._dial(action.address) if action.fresh else self._checkout(action.address)
        if isinstance(action, Release):
            self.release(action.link)
        elif isinstance(action, Close | Notify):
            # Notify: a blocking link cannot send and not wait; closing it tells the node.
            _blocking(action.link).close()
        elif isinstance(action, Sleep):
            time.sleep(action.seconds)
        return None

    # ------------------------------------------------------------ the pool
    def _checkout(self, address: str) -> BlockingLink:
        with self._pool_lock:
            while self._pool:
                link = self._pool.pop()
                # A pooled link the node closed while idle (client_idle_timeout,
                # a restart) is dialed anew instead of failing the next request.
                if link.address == address and not link.closed and not link.gone_while_idle():
                    return link
                link.close()  # a node requests no longer go to
        return self._dial(address)

    def release(self, link: Link) -> None:
        """The work on ``link`` is done: keep it for the next if it is to the current node."""
        if link.closed:
            return
        with self._pool_lock:
            if len(self._pool) < POOL_SIZE and link.address == self.core.address:
                self._pool.append(_blocking(link))
                return
        _blocking(link).close()

    def close(self) -> None:
        """Close every pooled connection (links held by running transactions stay)."""
        with self._pool_lock:
            pool, self._pool = self._pool, []
        for link in pool:
            link.close()

    # ------------------------------------------- admin and commit outcome
    def request(self, payload: Request) -> Any:
        """One admin request with fail-over (:meth:`ClientCore.request`)."""
        return self.run(self.core.request(payload))

    def request_result(self, address: str, req: list[Any], cause: BaseException) -> None:
        """The outcome of a commit whose reply was lost (:meth:`ClientCore.request_result`)."""
        self.run(self.core.request_result(address, req, cause))

    # -------------------------------------------- the Sessions interface
    def open(self, first: Request) -> tuple[Link, Any]:
        return self.run(self.core.open_session(first))

    def send(self, link: Link, payload: Request) -> Any:
        return self.run(self.core.send(link, payload))

    def commit(self, link: Link, payload: Request, req: list[Any] | None) -> None:
        self.run(self.core.commit(link, payload, req))

    def rollback(self, link: Link, s: int) -> None:
        self.run(self.core.rollback(link, s))

    def take_request_id(self) -> list[Any]:
        return self.core.lanes.take()

    def request_id_done(self, req: list[Any]) -> None:
        self.core.lanes.done(req)


def _blocking(link: Link) -> BlockingLink:
    # Every link the core hands back is one this driver made.
    return cast(BlockingLink, link)


__all__ = ["POOL_SIZE", "BlockingDriver"]
