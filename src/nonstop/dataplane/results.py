"""Exactly-once commits (H1): a commit request's outcome, recorded and answered again.

A commit that carries a request id ``req = [client id, seq]`` records its
result *in its own commit* (the coordinator's branch: the local group commit,
or its prepared branch in two-phase commit) as ``[true, null]``; an aborted
commit's outcome is recorded afterwards in a separate store commit as
``[false, [error, message]]`` (:func:`g_settle`).  A retry of the request --
its reply was lost -- gets the first outcome instead of running again.

While a commit runs, its request is in ``DataPlane.running`` (a retry waits
for it); once over, its outcome stays in ``DataPlane.recent`` for a while,
because phase two may not have reached this store yet; older outcomes are read
from the store (``request.lookup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.args import RequestId, parse_req
from nonstop.dataplane.steps import AwaitOutcome, OpCoroutine, StoreOp

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

LOOKUP = "request.lookup"
"""The store's answer about a request: ``{"found": [ok, value] or None, "in_doubt": bool}``;
outside any branch (this node's store), or a branch op on the home node (requests.md)."""

RUNNING = {"state": "running", "result": None}

NOT_COMMITTED_RESULT = (
    "NotCommitted",
    "its coordinator failed before answering and the request was settled at its home as "
    "not committed: nothing of it is anywhere",
)
"""What ``request.lookup`` with ``fence`` records for a request it finds no record of, on
the home node's branch (``[error class, message]``, requests.md section 3)."""


def outcome_of(found: Any) -> dict[str, Any]:
    """A recorded request result ``[ok, value]`` → the commit reply it stands for."""
    ok, value = found
    if ok:
        return {"ok": True}
    name, message = ([*value, None, None])[:2] if isinstance(value, list) else (None, value)
    return {"error": name or "Aborted", "message": message or "aborted"}


class OutcomeUnknown(Exception):
    """A local commit's outcome is not known here (replicated partitions: the commit's record
    left for the replicas, then this node stopped acting before they acknowledged it; it may
    be on the promoted copy).  Not an abort: nothing is recorded, ``request.result`` asks."""

    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__("outcome unknown")
        self.reply = reply


class AlreadyDone(errors.Error):
    """The commit's request id already has a recorded outcome (H1)."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__("request already done")
        self.outcome = outcome


def g_first_outcome(dp: DataPlane, req: RequestId, durable: bool = True) -> OpCoroutine:
    """The first outcome of commit request ``req`` if it ran here (a retry returns it), else None.

    ``durable=False``: memory only (a commit about to run: a result already in
    the store is found by the claim inside the commit itself, which saves a
    store read per commit).
    """
    if req in dp.running:
        first = yield AwaitOutcome(req)
        if first is not None:
            return first
        # That attempt found the result already recorded: look it up.
    recent = dp.recent.get(req)
    if recent is not None or not durable:
        return recent
    reply = yield StoreOp(LOOKUP, {"req": list(req)})
    found = reply.get("found")
    return None if found is None else outcome_of(found)


def g_commit_retry(dp: DataPlane, raw_req: Any, sid: Any) -> OpCoroutine:
    """``tx.commit`` with a request id on a session that is over: the first outcome."""
    req = parse_req(raw_req)
    if req is not None:
        first = yield from g_first_outcome(dp, req)
        if first is not None:
            return first
    raise dp.closed_error(sid)


def g_settle(
    dp: DataPlane, req: RequestId, outcome: dict[str, Any], record: bool = True
) -> OpCoroutine:
    """After a commit ends: record an abort's outcome too (``record``), then answer those
    waiting."""
    if record and "error" in outcome:
        error, message = outcome.get("error"), outcome.get("message")
        fields = {"req": list(req), "error": error, "message": message}
        try:
            yield StoreOp("request.abort", fields)
        except errors.Error as exc:
            dp.log("warning", f"cannot record the outcome of request {req}: {exc!r}")
    dp.settled(req, outcome)
    return None


__all__ = [
    "LOOKUP",
    "NOT_COMMITTED_RESULT",
    "RUNNING",
    "AlreadyDone",
    "OutcomeUnknown",
    "g_commit_retry",
    "g_first_outcome",
    "g_settle",
    "outcome_of",
]
