"""What the data plane's coroutines yield, and the task that runs one.

Every client op the machine serves (a session op, a commit, ``request.result``)
and every piece of follow-up work (recording an aborted commit's outcome) is a
generator: it runs until it needs something from outside the machine, yields a
*step* saying what, and the machine resumes it with the answer when the event
carrying it arrives.  This keeps each op's logic in one readable function, in
the order it happens, with no I/O in it (the same trick as the transactions'
lock generators, ``tx/transaction.py``, and the client core, ``client/remote.py``).

Errors come back as exceptions thrown into the generator at its ``yield``;
what a generator returns is the op's reply to its client.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nonstop.dataplane.state import Session


@dataclass(slots=True)
class Call:
    """Run branch op ``op`` of the task's session on ``node`` → its reply dict.

    Here: an ``Exec`` on the session's own branch; elsewhere: a ``data.req`` to
    that node, answered by its ``data.rep`` (or ``Unavailable`` when it is not
    up, goes down, or does not answer within ``rpc_timeout``).  The node's
    pending writes ride along.
    """

    node: str
    op: str
    fields: dict[str, Any]


@dataclass(slots=True)
class Gather:
    """Several :class:`Call` at once → the list of their replies or exceptions, in order."""

    calls: list[Call]


@dataclass(slots=True)
class StoreOp:
    """A store op outside any branch (``request.lookup``, ``request.abort``) → its reply."""

    op: str
    fields: dict[str, Any]


@dataclass(slots=True)
class DecideStep:
    """Two-phase commit of ``branches`` → the decision's reply, or :data:`UNDECIDED`
    when ``commit_timeout`` passes first (then :data:`AWAIT_DECISION` waits on)."""

    branches: dict[str, list[Any]]


@dataclass(slots=True)
class ReplyNow:
    """Answer the client now and keep running (an undecided commit waits on)."""

    payload: dict[str, Any]


@dataclass(slots=True)
class AwaitOutcome:
    """Wait for the commit running request ``req`` → its outcome, or None if it
    found the request already done (then look it up)."""

    req: tuple[str, int]


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNDECIDED: Any = _Marker("UNDECIDED")
"""What a :class:`DecideStep` answers when ``commit_timeout`` passed first."""
AWAIT_DECISION: Any = _Marker("AWAIT_DECISION")
"""Step: keep waiting for the decision of the task's last :class:`DecideStep`."""

Step = Call | Gather | StoreOp | DecideStep | ReplyNow | AwaitOutcome | _Marker
OpCoroutine = Generator[Step, Any, Any]


class Task:
    """One running coroutine and where its reply goes."""

    __slots__ = ("conn", "corr", "done", "fold", "gen", "remaining", "results", "session", "then")

    def __init__(
        self, gen: OpCoroutine, conn: int | None, corr: Any, session: Session | None = None
    ) -> None:
        self.gen = gen
        self.conn = conn
        """The client connection to answer; None for follow-up work (no reply)."""
        self.corr = corr
        self.session = session
        self.fold = False
        """The op opened its session (``begin``): every reply carries ``s``."""
        self.results: list[Any] | None = None
        """A :class:`Gather`'s answers so far."""
        self.remaining = 0
        self.done = False
        """Finished or cancelled: late answers for it are dropped."""
        self.then: Step | None = None
        """A step to carry out once the wait in slot ``FIRST`` ended (``driver``)."""


__all__ = [
    "AWAIT_DECISION",
    "UNDECIDED",
    "AwaitOutcome",
    "Call",
    "DecideStep",
    "Gather",
    "OpCoroutine",
    "ReplyNow",
    "Step",
    "StoreOp",
    "Task",
]
