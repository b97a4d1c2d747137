"""The client core: fail-over, sessions and commit outcomes, written once, without I/O.

Both client handles (:class:`~nonstop.client.handle.Client`, blocking, and
:class:`~nonstop.client.handle.AsyncClient`, asyncio) follow the same rules;
this module is those rules.  Each rule is a generator (a *step*) that yields
:data:`Action` values — connect to node X, send this request on that link,
close it, sleep — and receives each action's result, or has the action's
exception thrown in.  A driver performs the actions: the blocking one
(:mod:`nonstop.client.blocking`) with sockets and ``time.sleep``, the asyncio
one (:mod:`nonstop.client.aio`) with one multiplexed connection and
``asyncio.sleep``.  :func:`run` and :func:`arun` are the two loops that feed a
step its results.  (The remote transaction's ops use the same pattern one
level up: :mod:`nonstop.client.remote`.)

The rules, in short (``docs/design/client.md``):

* **Each handle has its own primary** (H5, :mod:`nonstop.client.balance`):
  new requests go to it while it answers; the other addresses are its backups,
  in order after it.  A backup takes over only when the current node fails, and
  the handle then stays there (it does not move back when the primary returns).
* **Fail over** on a network error or a ``QuorumLost``/``NotLeader`` answer:
  try the next address (the next backup), at most ``rounds`` passes over the list, then
  :class:`~nonstop.errors.Unavailable` (or the ``QuorumLost`` seen).
* **Raise at once** when a node refuses the client at connect time
  (:class:`~nonstop.client.failures.NodeRefused`: cluster name, protocol range,
  TLS credentials): every node of the cluster would refuse it too.
* **A timeout of a session's first op is not retried elsewhere**: the op may be
  waiting for a lock that it would wait for there too.
* **A link that failed** is closed and new requests go to the next address —
  unless it only timed out and the node still answers a ``ping`` (the asyncio
  link is shared by every task's transactions; a blocking link that timed out
  is already closed, its stream out of step).
* **Exactly once (H1)**: after a lost commit reply, ask the same node for the
  recorded outcome (``request.result``) instead of committing again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from nonstop.client.balance import DEFAULT_BALANCE, PROCESS_SPREADER, Spreader, primary_index
from nonstop.client.failures import NodeRefused, is_network_error
from nonstop.client.lanes import RequestLanes
from nonstop.client.session import Link, Request
from nonstop.errors import (
    Aborted,
    ClusterError,
    QuorumLost,
    TooLarge,
    TransactionLost,
    Unavailable,
)
from nonstop.model.wire import raise_error
from nonstop.net.handshake import Hello

T = TypeVar("T")

SWITCH_NODE = ("QuorumLost", "NotLeader")
"""Error replies to a session's first op that another node may not give."""
ROUND_PAUSE = 0.1
"""Pause between two passes over the addresses for an admin request (seconds)."""
SESSION_ROUND_PAUSE = 0.05
"""The same for opening a session."""
OUTCOME_POLL = 0.2
"""Longest pause between two asks for a lost commit's outcome (seconds)."""


# ------------------------------------------------------------------ actions
@dataclass(frozen=True, slots=True)
class Connect:
    """A link to node ``address``; the result is the link.

    ``fresh=False``: the driver's connection for new work on that node (the
    blocking driver's pool, the asyncio driver's shared connection).
    ``fresh=True``: a private link the step closes itself (``request.result``).
    """

    address: str
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    """Send ``payload`` on ``link`` and wait up to ``timeout`` s; the result is the reply."""

    link: Link
    payload: Request
    timeout: float


@dataclass(frozen=True, slots=True)
class Notify:
    """Send ``payload`` on ``link`` without waiting for a reply.  A blocking link cannot
    (one request at a time): its driver closes it, which the node also acts on."""

    link: Link
    payload: Request


@dataclass(frozen=True, slots=True)
class Release:
    """The work on ``link`` is done: it may carry the next (blocking: back to the pool)."""

    link: Link


@dataclass(frozen=True, slots=True)
class Close:
    """Close ``link`` (the node rolls back the sessions it carried)."""

    link: Link


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Action = Connect | Call | Notify | Release | Close | Sleep
Step = Generator[Action, Any, T]
"""A rule: yields actions, receives their results, returns its own."""


def run(step: Step[T], perform: Callable[[Action], Any]) -> T:
    """Drive ``step`` to its end, performing each action with ``perform`` (blocking).

    An ``Exception`` an action raises is thrown into the step, which decides;
    anything else (``KeyboardInterrupt``) ends it.
    """
    try:
        action = next(step)
        while True:
            try:
                result = perform(action)
            except Exception as exc:
                action = step.throw(exc)
            else:
                action = step.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        step.close()


async def arun(step: Step[T], perform: Callable[[Action], Awaitable[Any]]) -> T:
    """:func:`run` for asyncio: ``CancelledError`` ends the step, it is not thrown in."""
    try:
        action = next(step)
        while True:
            try:
                result = await perform(action)
            except Exception as exc:
                action = step.throw(exc)
            else:
                action = step.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        step.close()


# --------------------------------------------------------------------- core
class ClientCore:
    """The state both drivers share: where requests go now, and the rules as steps.

    ``balance`` picks the handle's primary (:func:`~nonstop.client.balance.primary_index`:
    ``"spread"`` over the addresses, or ``"first"``); ``spreader`` gives the
    spread turns (the process's, or a test's own).

    Thread-safe where the blocking client needs it (several threads may run
    transactions on one client): the address index moves under a lock.
    """

    def __init__(
        self,
        addresses: list[str],
        *,
        rounds: int,
        timeout: float,
        op_timeout: float,
        client_id: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        balance: str = DEFAULT_BALANCE,
        spreader: Spreader = PROCESS_SPREADER,
    ) -> None:
        if not addresses:
            raise ValueError("no node address given")
        self.addresses = addresses
        """The addresses as given."""
        self.balance = balance
        self.rounds = rounds
        self.timeout = timeout
        """How long an admin request, a connect or a rollback may take."""
        self.op_timeout = op_timeout
        """How long a data request may take (it may wait for locks on the node)."""
        self.lanes = RequestLanes(client_id)
        self.node: Hello | None = None
        """The hello of the node that answered last."""
        self._clock = clock
        self._primary = primary_index(balance, addresses, spreader)  # ValueError if bad
        self._index = self._primary
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """The address new requests go to."""
        return self.addresses[self._index]

    @property
    def primary(self) -> str:
        """This handle's primary: where its requests went first (H5)."""
        return self.addresses[self._primary]

    @property
    def order(self) -> list[str]:
        """The primary, then the backups in the order a failure moves through them."""
        n = len(self.addresses)
        return [self.addresses[(self._primary + k) % n] for k in range(n)]

    def switch(self, address: str) -> None:
        """``address`` failed: if it is still the current one, move on to the next backup.
        (Several requests may see one node fail; the first one moves.)

        The handle stays on the node it moved to, also once its primary is back: that
        node took the handle's sessions over, as the primary did (002 §5.6: a session
        stays on its server as long as that server has not failed); moving back would
        mean probing a node that may be dead on some transaction's time, and, on the
        asyncio handle, closing the one connection every task's transactions share.
        """
        with self._lock:
            if address == self.addresses[self._index]:
                self._index = (self._index + 1) % len(self.addresses)

    # ------------------------------------------------------ admin requests
    def request(self, payload: Request) -> Step[Any]:
        """One admin request, failing over across the addresses; the raw reply.

        Admin requests are idempotent (status, ping) or checked by the cluster
        (join/leave of a known name), so sending one again elsewhere is safe.
        """
        last: BaseException | None = None
        quorum_lost: QuorumLost | None = None
        for _ in range(self.rounds):
            for _ in range(len(self.addresses)):
                address = self.address
                try:
                    link = yield Connect(address)
                except Exception as exc:
                    if not is_network_error(exc):
                        raise  # NodeRefused among them: every node would refuse too
                    last = exc
                    self.switch(address)
                    continue
                try:
                    reply = yield Call(link, payload, self.timeout)
                except Exception as exc:
                    if not is_network_error(exc):
                        raise
                    last = exc
                    yield from self.drop(link)
                    continue
                if isinstance(reply, dict) and reply.get("error") == "QuorumLost":
                    # A Disabled node (D16): another one may still have quorum.
                    quorum_lost = QuorumLost(str(reply.get("message")))
                    yield from self.drop(link)
                    continue
                self.node = link.node
                yield Release(link)
                return reply
            yield Sleep(ROUND_PAUSE)
        if quorum_lost is not None:
            raise quorum_lost
        raise Unavailable(f"no node answered at {', '.join(self.addresses)}: {last!r}")

    # ------------------------------------------------------------ sessions
    def open_session(self, first: Request) -> Step[tuple[Link, Any]]:
        """Send a session's first op (it carries ``begin``) to the first node that takes
        it: (link, raw reply).  Trying another node is safe: a session whose link is
        closed is rolled back by its node."""
        last: BaseException | None = None
        for _ in range(self.rounds):
            for _ in range(len(self.addresses)):
                address = self.address
                try:
                    link = yield Connect(address)
                except Exception as exc:
                    if not is_network_error(exc):
                        raise
                    last = exc
                    self.switch(address)
                    continue
                try:
                    reply = yield Call(link, first, self.op_timeout)
                except Exception as exc:
                    if not is_network_error(exc):
                        raise
                    last = exc
                    yield from self.connection_failed(link, exc)
                    if isinstance(exc, TimeoutError):
                        # Slow or stopped: the op may be waiting for a lock, which
                        # another node would wait for too.  Fail this transaction only.
                        raise Unavailable(f"no answer from {address} in time: {exc!r}") from exc
                    continue
                if isinstance(reply, dict) and reply.get("error") in SWITCH_NODE:
                    last = ClusterError(f"{address}: {reply.get('message')}")
                    yield from self.drop(link)
                    continue
                self.node = link.node
                return link, reply
            yield Sleep(SESSION_ROUND_PAUSE)
        raise Unavailable(f"no node took a transaction at {', '.join(self.addresses)}: {last!r}")

    def send(self, link: Link, payload: Request) -> Step[Any]:
        """An op of the session on ``link``; the raw reply.  A lost, reset or silent link
        is :class:`~nonstop.errors.TransactionLost` (B8; an ``Unavailable`` that
        ``@transactional`` replays): the node rolls the session back when the link
        closes, and is told to if the link is kept (a slow op)."""
        try:
            return (yield Call(link, payload, self.op_timeout))
        except TooLarge:
            raise  # refused by the client before sending: the session goes on
        except Exception as exc:
            if not link.closed:
                yield Notify(link, {"op": "tx.rollback", "s": payload.get("s")})
            yield from self.connection_failed(link, exc)
            raise TransactionLost(
                f"no answer from {link.address} during the transaction ({exc!r}); "
                "the node rolls it back"
            ) from exc

    def commit(self, link: Link, payload: Request, req: list[Any] | None) -> Step[None]:
        """Commit the session on ``link``: returns once committed, raises the node's
        refusal, or — the reply lost — the outcome the node recorded for ``req``
        (:meth:`request_result`)."""
        try:
            reply = yield Call(link, payload, self.op_timeout)
        except TooLarge:
            # Refused by the client before sending: the transaction is over, so the
            # node must release its locks now (not at tx_idle).
            yield Notify(link, {"op": "tx.rollback", "s": payload.get("s")})
            raise
        except Exception as exc:
            yield from self.connection_failed(link, exc)
            if req is not None:
                yield from self.request_result(link.address, req, exc, payload.get("home"))
            # (Read-only, req None: every read was made under its locks; nothing to commit.)
            return None
        raise_error(reply)
        return None

    def rollback(self, link: Link, s: int) -> Step[None]:
        """Roll session ``s`` back; a link that fails meanwhile is dropped (the node
        rolls the session back when it sees the link go) and one that works is released."""
        if link.closed:
            return None  # lost already: its node rolled the session back
        try:
            yield Call(link, {"op": "tx.rollback", "s": s}, self.timeout)
        except Exception:
            yield from self.drop(link)
            return None
        yield Release(link)
        return None

    # ------------------------------------------------------- failed links
    def connection_failed(self, link: Link, exc: BaseException) -> Step[None]:
        """A request on ``link`` failed: drop the link unless it is only slow.  A timeout
        (a long lock wait, a busy node) keeps a link that is still open if its node
        answers a ping: on the asyncio client every task's transactions share it."""
        if isinstance(exc, TimeoutError) and not link.closed:
            try:
                yield Call(link, {"op": "ping"}, self.timeout)
                return None
            except Exception:
                pass
        yield from self.drop(link)
        return None

    def drop(self, link: Link) -> Step[None]:
        """Close ``link``; new requests try the next address if it was the current one."""
        yield Close(link)
        self.switch(link.address)
        return None

    # ----------------------------------------------------- commit outcome
    def request_result(
        self, address: str, req: list[Any], cause: BaseException, home: Any = None
    ) -> Step[None]:
        """After a lost commit reply (``cause``): ask ``address`` for the outcome of
        ``req`` (H1), waiting while it is still running, up to ``op_timeout``.
        Returns if committed; raises the recorded refusal if aborted, and
        :class:`~nonstop.errors.Unavailable` if not committed or unknown.

        ``home`` (the commit named one, docs/design/requests.md): if ``address``
        cannot be asked (its node died), the other known nodes are asked with the home,
        in turn, within one ``op_timeout`` for all of them (:meth:`_committed_elsewhere`):
        each asks the home partition's active node, which holds the record after a
        failover.  Every ask with a home *settles* the request (``fence``, requests.md
        §3): the home records "not committed" when it has no record, so that no attempt
        can commit after it, and the answer is final -- raised as
        :class:`~nonstop.errors.NotCommitted`, which ``@transactional`` replays under a
        new request id.  From another node only a final answer is believed ("committed",
        or an abort read from the home's record): its "unknown" cannot tell a commit
        still running on ``address`` from none."""
        try:
            yield from self._settled_on(address, req, cause, home)
            return None
        except Unavailable as exc:
            if home is None or "cannot be asked" not in str(exc):
                raise
            lost = exc
        others = [a for a in self.addresses if a != address]
        if others and (yield from self._committed_elsewhere(others, req, home)):
            return None
        raise lost

    def _settled_on(
        self, address: str, req: list[Any], cause: BaseException, home: Any
    ) -> Step[None]:
        """:meth:`request_result` on the commit's own node ``address``."""
        deadline = self._clock() + self.op_timeout
        delay = 0.01
        ask: Request = {"op": "request.result", "req": req}
        if home is not None:
            ask["home"] = home
            ask["fence"] = True
        while True:
            try:
                link = yield Connect(address, fresh=True)
                try:
                    reply = yield Call(link, ask, self.timeout)
                except Exception:
                    yield Close(link)
                    raise
                yield Close(link)
            except Exception as exc:
                if not isinstance(exc, NodeRefused) and not is_network_error(exc):
                    raise
                raise Unavailable(
                    f"the reply to a commit was lost ({cause!r}) and {address} cannot be asked "
                    f"({exc!r}): the outcome is unknown"
                ) from exc
            if settled(reply, address, cause):
                return None
            if self._clock() > deadline:
                raise Unavailable(
                    f"the commit on {address} is still running after {self.op_timeout}s: "
                    "the outcome is unknown"
                )
            yield Sleep(delay)
            delay = min(OUTCOME_POLL, delay * 2)

    def _committed_elsewhere(self, others: list[str], req: list[Any], home: Any) -> Step[bool]:
        """Whether the nodes ``others`` say request ``req`` (homed at ``home``) committed.

        Every one of them asks the same node -- the home partition's active one -- so
        the first definite answer ends the search: "committed" (True), a final
        "aborted" (the home's record, or the fence just recorded: its error is raised,
        ``NotCommitted``), or "unknown" / another "aborted" (False: the caller leaves the
        outcome unknown).  The
        home between active nodes (a promotion: ``NotActive``, ``Unavailable``), a
        prepared branch that may hold the record (``running``, ``LockTimeout``) is asked
        again after a short pause (at most :data:`OUTCOME_POLL`, so the client learns
        the outcome soon after the promoted node does).  A node that cannot be asked, or
        answers too late (its lookup may wait for the record's lock on the home), hands
        over to the next.  One ``op_timeout`` bounds it all (it used to be one per node,
        and a late answer ended a node's turn: 5 s per node before ``Unavailable``).
        """
        deadline = self._clock() + self.op_timeout
        delay = 0.05
        ask = {"op": "request.result", "req": req, "home": home, "fence": True}
        turn = 0
        while True:
            address = others[turn % len(others)]
            try:
                link = yield Connect(address, fresh=True)
                try:
                    reply = yield Call(link, ask, self.timeout)
                finally:
                    yield Close(link)
            except Exception as exc:
                if not isinstance(exc, NodeRefused) and not is_network_error(exc):
                    raise
                turn += 1
                if self._clock() > deadline:
                    return False
                if turn % len(others):
                    continue  # the next node at once; a pause after a pass over all
                yield Sleep(delay)
                delay = min(OUTCOME_POLL, delay * 2)
                continue
            if isinstance(reply, dict) and reply.get("state") == "committed":
                return True
            if isinstance(reply, dict) and reply.get("state") == "aborted" and reply.get("final"):
                settled(reply, address, Unavailable("the commit's node is gone"))  # raises
            waiting = isinstance(reply, dict) and (
                reply.get("state") == "running" or reply.get("error") in WAIT_ERRORS
            )
            if not waiting or self._clock() > deadline:
                return False
            yield Sleep(delay)
            delay = min(OUTCOME_POLL, delay * 2)


WAIT_ERRORS = frozenset({"Unavailable", "TransactionLost", "NotActive", "LockTimeout"})
"""Answers to ``request.result`` asked of another node that say "not yet, ask again": the
home between active nodes (a promotion: ``NotActive``; its old active node seen Down while
asked: ``TransactionLost``; none up yet: ``Unavailable``), or a prepared branch holding
the request's record (``LockTimeout``)."""


def settled(reply: Any, address: str, cause: BaseException) -> bool:
    """Interpret a ``request.result`` reply: True committed, False running, else raise."""
    raise_error(reply)
    state = reply.get("state") if isinstance(reply, dict) else None
    if state == "committed":
        return True
    if state == "running":
        return False
    if state == "aborted":
        # The node records an aborted commit as [error class name, message].
        result = reply.get("result")
        if isinstance(result, list | tuple) and len(result) == 2:
            raise_error({"error": result[0], "message": result[1]})
        if isinstance(result, dict) and "error" in result:
            raise_error(result)
        raise Aborted(f"the transaction was rolled back ({result!r})")
    # "unknown": the node never recorded the commit, so it rolled the session back.
    raise Unavailable(
        f"lost the commit's connection to {address} ({cause!r}); the node has no record "
        "of the commit: it was not committed"
    )


__all__ = [
    "Action",
    "Call",
    "ClientCore",
    "Close",
    "Connect",
    "Notify",
    "Release",
    "Sleep",
    "Step",
    "arun",
    "run",
    "settled",
]
