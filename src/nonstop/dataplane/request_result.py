"""``request.result``: what became of a commit request, asked after its reply was lost.

Answers ``committed`` / ``aborted`` / ``running`` (in doubt) / ``unknown`` (no attempt
committed it so far) about a request id ``[client id, seq]`` (data-path.md §7).
Without a ``home`` the node answers from its own memory and store (H1, the same
node).  With a ``home`` (a homed request, requests.md) the answer comes from the
active node of the home object's partition, asked in a session of the node's own
(fenced by the partition's epoch): the record travels with that partition, whichever
node coordinated the commit.

**Settling (``fence``).**  "unknown" from the home cannot tell a commit still on its
way (its coordinator cut off, not dead) from none.  Asked with ``fence``, the home
node write-locks the request's slot and, finding nothing recorded and nothing in
doubt, records "not committed" (``NotCommitted``) in the session's branch there; this
node then commits that branch like any commit (replicated to the partition's sync
replicas before it is acknowledged).  From then on every attempt of the request finds
the record when it claims the slot, so none can commit: the answer ``aborted``
(``final``) is definite, and the client may run the transaction again under a new id.
A result read from the home's record is ``final`` too: the home keeps one record per
request, and the first wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.args import parse_req
from nonstop.dataplane.commit import g_decide
from nonstop.dataplane.results import LOOKUP, NOT_COMMITTED_RESULT, RUNNING
from nonstop.dataplane.state import COMMITTING
from nonstop.dataplane.steps import Call, OpCoroutine, StoreOp

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane
    from nonstop.dataplane.state import Session


def g_request_result(
    dp: DataPlane,
    raw_req: Any,
    s: Session | None = None,
    home: bytes | None = None,
    fence: bool = False,
) -> OpCoroutine:
    """``request.result`` (module doc); ``s`` is the session the home is asked in (ended
    here), ``fence`` settles an unrecorded request as not committed."""
    try:
        key = parse_req(raw_req)
        if key is None:
            raise errors.BadArgument("req must be [client id, seq]")
        if key in dp.running:
            return dict(RUNNING)
        recent = dp.recent.get(key)
        if recent is not None and "error" not in recent:
            return {"state": "committed", "result": None}
        if recent is not None and (s is None or home is None):
            return {"state": "aborted", "result": [recent["error"], recent.get("message")]}
        if s is None or home is None:
            reply = yield StoreOp(LOOKUP, {"req": list(key)})
        else:
            # An abort remembered here is not the record: a retry of the request on
            # another coordinator may have committed it since.  Ask the home.
            node = dp.locate(s, home)
            ask: dict[str, Any] = {"req": list(key)}
            if fence:
                ask["fence"] = True
            reply = yield Call(node, LOOKUP, ask)
            if reply.get("fenced"):
                yield from _g_commit_fence(dp, s, node)
                return {"state": "aborted", "result": list(NOT_COMMITTED_RESULT), "final": True}
    finally:
        if s is not None:
            dp.end_session(s)
    found = reply.get("found")
    if found is not None:
        ok, value = found
        answer = {"state": "committed" if ok else "aborted", "result": value}
        return answer if home is None else {**answer, "final": True}
    if reply.get("in_doubt"):
        # A prepared branch here may still commit with this result in it.
        return dict(RUNNING)
    if recent is not None:
        # A homed request this node saw abort, and nothing committed it since.
        return {"state": "aborted", "result": [recent["error"], recent.get("message")]}
    return {"state": "unknown", "result": None}


def _g_commit_fence(dp: DataPlane, s: Session, node: str) -> OpCoroutine:
    """Commit session ``s``, whose branch on ``node`` recorded the fence (one writer: a
    local group commit there, or two-phase commit with it), then release it.  Its
    failure is the answer (``NotActive``, ``Unavailable``...): the client asks again."""
    s.dirty.add(node)
    s.state = COMMITTING
    try:
        outcome = yield from g_decide(dp, s, None)
    finally:
        dp.finish_commit(s, None, None)
    if not outcome.get("ok"):
        raise errors.Unavailable(f"the request's outcome was not settled: {outcome!r:.200}")
    return None


__all__ = ["g_request_result"]
