"""How the data-plane machine runs its coroutines (:mod:`nonstop.dataplane.steps`).

:class:`Driver` resumes a task with each answer, carries out the step it
yields next -- emitting the action it needs (``Exec``, ``Decide``, ``SetTimer``,
``ClientReply``) or noting what it waits for -- and answers the task's client
with what it returns (an error it raises becomes an error reply, once).  The
machine (:class:`nonstop.dataplane.machine.DataPlane`) adds what a
:class:`~nonstop.dataplane.steps.Call` means (an ``Exec`` here, a ``data.req``
elsewhere) and what happens when a task is over.

A task waiting for something is in exactly one wait table: ``_execs`` (an
``Exec``'s corr), ``_deciding`` (a ``Decide``'s corr), ``running`` (a request's
outcome) or the peer calls (a ``data.req``'s id); answers for a task that is
done (finished or cancelled) are dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from nonstop import errors
from nonstop.dataplane.args import RequestId
from nonstop.dataplane.events import ClientReply, DataAction, Decide, Exec
from nonstop.dataplane.steps import (
    AWAIT_DECISION,
    AwaitOutcome,
    Call,
    DecideStep,
    Gather,
    ReplyNow,
    Step,
    StoreOp,
    Task,
)
from nonstop.model.wire import error_class, error_out
from nonstop.runtime.interface import Action, Log, SetTimer

COMMIT_TIMER = "dp.commit."
"""``dp.commit.<corr>``: a two-phase commit not decided within ``commit_timeout``."""

Immediate = tuple[Any, BaseException | None]
"""A step's answer known at once: (value, None) or (None, exception)."""

ALONE = -1
"""The slot of a task's only wait (not a gather's)."""
FIRST = -2
"""The slot of a wait that must end before the task's ``then`` step is carried out."""


class Driver(ABC):
    """Runs tasks (module doc); the base of the data-plane machine."""

    def __init__(self, commit_timeout: float) -> None:
        self.commit_timeout = commit_timeout
        self._out: list[Action | DataAction] = []
        self._current: Task | None = None
        """The task being resumed now (it must not be cancelled from inside itself)."""
        self._next_corr = 1
        self._execs: dict[int, tuple[Task, int]] = {}
        """Exec corr → the task waiting for it and its gather slot (-1: alone)."""
        self._deciding: dict[int, Task] = {}
        """Decide corr → the commit waiting for the decision."""
        self.running: dict[RequestId, list[Task]] = {}
        """Commit requests running here → the tasks waiting for their outcome (H1)."""

    def next_corr(self) -> int:
        corr = self._next_corr
        self._next_corr += 1
        return corr

    @abstractmethod
    def _call(self, task: Task, slot: int, call: Call) -> Immediate | None:
        """Carry out one :class:`Call`: :class:`~nonstop.dataplane.machine.DataPlane`
        routes it to the local store or to a peer (this base only drives coroutines)."""

    @abstractmethod
    def _task_over(self, task: Task) -> None:
        """``task`` finished (the machine starts its session's next op)."""

    @abstractmethod
    def _failed(self, task: Task, error: errors.Error) -> None:
        """``task`` raised ``error`` (the machine ends a session it dooms)."""

    def _run(self, task: Task, value: Any, exc: BaseException | None) -> None:
        """Resume ``task`` with ``value`` (or throw ``exc``) until it waits or ends."""
        previous, self._current = self._current, task
        try:
            while True:
                try:
                    step = task.gen.send(value) if exc is None else task.gen.throw(exc)
                except StopIteration as stop:
                    self._finish(task, stop.value)
                    return
                except errors.Error as error:
                    self._failed(task, error)
                    self._finish(task, error_out(error))
                    return
                except Exception as bug:
                    self._out.append(Log("error", f"data plane op failed: {bug!r}"))
                    self._finish(task, error_out(bug))
                    return
                now = self._issue(task, step)
                if now is None:
                    return
                value, exc = now
        finally:
            self._current = previous

    def _finish(self, task: Task, reply: Any) -> None:
        task.done = True
        if reply is not None:
            self._answer(task, reply)
        self._task_over(task)

    def _answer(self, task: Task, reply: Any) -> None:
        if task.conn is None or task.corr is _ANSWERED:
            return
        if task.fold and isinstance(reply, dict) and task.session is not None:
            reply["s"] = task.session.sid
        self._out.append(ClientReply(task.conn, task.corr, reply))
        task.corr = _ANSWERED

    def resolve(self, task: Task, slot: int, value: Any, exc: BaseException | None) -> None:
        """An answer for ``task`` arrived (for gather slot ``slot``; -1: its only wait)."""
        if task.done:
            return
        if slot < 0:
            if slot == FIRST and exc is None:
                then, task.then = task.then, None
                assert then is not None
                now = self._issue(task, then)
                if now is None:
                    return
                value, exc = now
            self._run(task, value, exc)
            return
        results = task.results
        assert results is not None
        results[slot] = exc if exc is not None else value
        task.remaining -= 1
        if task.remaining == 0:
            task.results = None
            self._run(task, results, None)

    def resolve_reply(self, task: Task, slot: int, reply: dict[str, Any]) -> None:
        """A reply dict for ``task``: its value, or the error it carries thrown in."""
        if "error" in reply:
            self.resolve(task, slot, None, _error_of(reply))
        else:
            self.resolve(task, slot, reply, None)

    def _issue(self, task: Task, step: Step) -> Immediate | None:
        """Carry out ``step`` of ``task``: the answer if known now, else None (it waits)."""
        kind = type(step)
        if kind is Call:
            return self._call(task, ALONE, step)  # type: ignore[arg-type]
        if kind is Gather:
            return self._gather(task, step.calls)  # type: ignore[union-attr]
        if kind is StoreOp:
            corr = self.next_corr()
            self._execs[corr] = (task, ALONE)
            self._out.append(Exec(corr, None, step.op, step.fields))  # type: ignore[union-attr]
            return None
        if kind is DecideStep:
            corr = self.next_corr()
            self._deciding[corr] = task
            self._out.append(Decide(corr, step.branches))  # type: ignore[union-attr]
            self._out.append(SetTimer(f"{COMMIT_TIMER}{corr}", self.commit_timeout))
            return None
        if kind is ReplyNow:
            self._answer(task, step.payload)  # type: ignore[union-attr]
            return None, None
        if kind is AwaitOutcome:
            waiters = self.running.get(step.req)  # type: ignore[union-attr]
            if waiters is None:  # settled meanwhile: look it up
                return None, None
            waiters.append(task)
            return None
        if step is AWAIT_DECISION:  # still in _deciding: DecisionDone resumes it
            return None
        raise TypeError(f"a data-plane coroutine yielded {step!r:.60}")

    def _gather(self, task: Task, calls: list[Call]) -> Immediate | None:
        results: list[Any] = [None] * len(calls)
        task.results = results
        task.remaining = len(calls)
        for i, call in enumerate(calls):
            now = self._call(task, i, call)
            if now is not None:
                results[i] = now[1] if now[1] is not None else now[0]
                task.remaining -= 1
        if task.remaining == 0:
            task.results = None
            return results, None
        return None


class _Answered:
    """A task's ``corr`` once its client has its reply (it gets exactly one)."""


_ANSWERED: Any = _Answered()


def _error_of(reply: dict[str, Any]) -> errors.Error:
    """An error reply → the exception it names (as ``model.wire.raise_error``)."""
    name = str(reply.get("error"))
    message = str(reply.get("message") or name)
    cls = error_class(name)
    if cls is errors.NotLeader:
        return errors.NotLeader(message, reply.get("leader"))
    return cls(message)


__all__ = ["ALONE", "COMMIT_TIMER", "FIRST", "Driver", "Immediate"]
