"""A session's commit (data-path.md §5): nothing, one local group commit, or two-phase commit.

At ``tx.commit`` the coordinator knows which nodes wrote (*writers*: nodes with
pending writes or a branch that changed):

* no writer and no request id: every branch is just ended (read locks released);
* only this node: one store commit here (``branch.commit``, with the request's
  result, H1), then the read-only branches elsewhere are ended;
* otherwise two-phase commit through the distributed-commit machine
  (:class:`~nonstop.dataplane.events.Decide`) of every writer's branch, with the
  writes still pending for it (one message per participant); this node's branch
  takes part whenever a request result is to be recorded.

A node without quorum (Disabled, D16) commits nothing: a commit that writes is
refused there before anything is written, and one whose outcome arrives after
the quorum was lost is not acknowledged (``Unavailable``; ``request.result``
tells).  The client hears the outcome only once it is decided and, for
two-phase commit, applied by every participant (the decision machine answers
then: read your writes, docs/guarantees.md).  A decision not known
within ``commit_timeout`` answers ``Unavailable`` (outcome unknown); the commit
keeps waiting for it, the branches stay with it, and ``request.result`` says
``running`` until then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.args import RequestId, parse_home, parse_req
from nonstop.dataplane.results import AlreadyDone, OutcomeUnknown, g_first_outcome, outcome_of
from nonstop.dataplane.session_ops import WRITE_NOW, take_writes
from nonstop.dataplane.sizes import check_writes
from nonstop.dataplane.state import COMMITTING, UNDECIDED, Session
from nonstop.dataplane.steps import AWAIT_DECISION, Call, DecideStep, OpCoroutine, ReplyNow
from nonstop.dataplane.steps import UNDECIDED as NOT_DECIDED
from nonstop.dataplane.view import QUORUM_DISABLED
from nonstop.model.wire import error_out, raise_error

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

OK = {"ok": True}

RETRYABLE_REASONS = {
    "conflict": "Conflict",
    "lock timeout": "LockTimeout",
    "deadlock": "Deadlock",
    "branch timeout": "LockTimeout",
    # The participant had no branch to prepare any more (it restarted, rolled it
    # back when this coordinator looked down, or idled it out): as for an op.
    "branch gone": "BranchRolledBack",
    # Sync replication on a real node: the participant does not act for the partition now.
    "not active": "NotActive",
}
"""A participant's no vote (``dataplane.participant`` reasons, the machine's own branch timeout)
that makes an aborted commit worth replaying → the retryable error the client gets."""


def map_run_reply(reply: Any) -> dict[str, Any]:
    """The decision machine's ``run`` reply → the client's commit reply (data-path.md §5)."""
    if isinstance(reply, dict) and reply.get("ok"):
        unapplied = reply.get("unapplied")
        if isinstance(unapplied, list) and unapplied:
            # Acknowledged with the decision durable, but these participants had not
            # applied it within apply_wait (down or cut off): docs/guarantees.md.
            return {**OK, "unapplied": [str(n) for n in unapplied]}
        return dict(OK)
    if not isinstance(reply, dict):
        return error_out(errors.Error(f"unexpected commit reply {reply!r:.80}"))
    error = reply.get("error")
    why = str(reply.get("why") or reply.get("message") or "the decision log decided abort")
    if error == "Unavailable":
        # No vote in time (a participant down or cut off): the coordinator aborted on its
        # own authority, so nothing committed -- TransactionLost, an Unavailable that
        # @transactional replays (issue 10 H4).
        return {"error": "TransactionLost", "message": f"transaction rolled back: {why}"}
    if error == "Aborted":
        # "<node> voted no: <reason>" (dtx.protocol); the reason names the class.
        reason = why.partition("voted no: ")[2].strip().lower()
        name = RETRYABLE_REASONS.get(reason, "Aborted")
        return {"error": name, "message": f"transaction rolled back: {why}"}
    return {"error": "Error", "message": f"commit failed: {error}: {why}"}


def g_commit(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """``tx.commit`` of session ``s`` → its outcome; the session is over after it."""
    req = parse_req(p.get("req"))
    home = parse_home(p.get("home")) if req is not None else None
    if req is not None:
        first = yield from g_first_outcome(dp, req, durable=False)
        if first is not None:
            dp.end_session(s)
            # As for AlreadyDone below: a homed request's answer says this attempt ran
            # nothing (seed 3300577: an ok without it made its client take this attempt's
            # writes for committed).
            return first if home is None else {**first, "again": True}
    s.state = COMMITTING
    if req is not None:
        dp.running[req] = []
    try:
        w = p.get("w")
        if w:
            take_writes(dp, s, w)
        record_at = None if home is None else home_node(s, home)
        wrote = req is not None or bool(_writers(s))
        outcome = yield from g_decide(dp, s, req, record_at)
    except AlreadyDone as done:
        # This request committed (or aborted) before, maybe before a restart or on
        # another coordinator: roll this attempt back, answer the first outcome,
        # record nothing.  A homed request's answer says so (``again``: this attempt
        # ran nothing; its client may have run the request elsewhere, requests.md).
        dp.finish_commit(s, req, None)
        return done.outcome if home is None else {**done.outcome, "again": True}
    except OutcomeUnknown as unknown:
        # Recording an abort would be a lie (the commit may be on a promoted copy).
        dp.finish_commit(s, req, None)
        return raise_error(unknown.reply)
    except Exception as exc:
        # A homed request's record lives with its home partition (requests.md): an
        # abort recorded here would be a second, unreplicated record.  Not recorded.
        dp.finish_commit(s, req, error_out(exc), record=home is None)
        raise
    dp.finish_commit(s, req, outcome, record=home is None)
    if wrote and outcome.get("ok") and dp.view.quorum == QUORUM_DISABLED:
        # The commit went through, but this node lost its quorum meanwhile (D16):
        # it acknowledges nothing now.  The outcome is recorded; a client that
        # asks (request.result) learns it.
        raise errors.Unavailable(
            f"node {dp.name} lost its quorum during the commit: outcome not "
            "acknowledged; ask request.result"
        )
    return outcome


def _writers(s: Session) -> set[str]:
    """The nodes where ``s`` wrote: writes pending for them, or a branch that changed."""
    return {n for n, w in s.pending.items() if w} | s.dirty


def home_node(s: Session, home: bytes) -> str:
    """The node the commit's writes of ``home`` go to: where request's record is kept.

    The home must be one of the objects the commit writes (requests.md): its
    partition's record of this transaction then carries the request's record too.
    """
    for node, writes in s.pending.items():
        if home in writes:
            return node
    raise errors.BadArgument("a request's home must be one of the objects its commit writes (w)")


def g_decide(
    dp: DataPlane, s: Session, req: RequestId | None, record_at: str | None = None
) -> OpCoroutine:
    writers = _writers(s)
    if not writers and req is None:
        return dict(OK)
    if dp.view.quorum == QUORUM_DISABLED:
        # Disabled means disabled (D16): without a quorum this node acknowledges
        # no commit, local or distributed.  Refused before anything is written;
        # retryable, on another node or once the quorum is back.
        raise errors.Unavailable(
            f"node {dp.name} has no quorum (Disabled): it commits nothing; "
            "retry on a node of the majority"
        )
    if writers <= {dp.name}:
        # One node wrote, and it is this one: one local group commit (with the
        # request's result, H1); the read-only branches elsewhere are released after.
        reply = yield Call(dp.name, "branch.commit", {"req": None if req is None else list(req)})
        if "done" in reply:
            raise AlreadyDone(outcome_of(reply["done"]))
        if "unknown" in reply:
            # A replicated store (replication.md §10a): the error the client gets.
            raise OutcomeUnknown(reply["unknown"])
        dp.forget_branch(s.bid)  # committed: nothing left to end
        return dict(OK)
    return (yield from g_two_phase(dp, s, writers, req, record_at or dp.name))


def g_two_phase(
    dp: DataPlane, s: Session, writers: set[str], req: RequestId | None, record_at: str
) -> OpCoroutine:
    for node in sorted(writers - {dp.name}):
        # A prepare over the frame limit would never arrive: refuse now (TooLarge),
        # not as the participant's missing vote after vote_timeout.
        check_writes(node, (s.pending.get(node) or {}).values(), dp.config.max_message)
    down = sorted(n for n in writers if not dp.view.is_up(n))
    if down:
        raise errors.Unavailable(f"node(s) {', '.join(down)} of the transaction are down")
    for node in sorted(writers - s.remote - {dp.name}):
        # Writes to a node this session never opened a branch on (the client
        # cached the object elsewhere): open it now, shipping them.
        yield Call(node, WRITE_NOW, {})
    if req is not None:
        # The result rides in one branch, which then always takes part: it commits
        # exactly when the transaction does.  The coordinator's own, or (a homed
        # request, requests.md) the branch that writes the home object, so that the
        # record is in the home partition's replicated record of the transaction.
        reply = yield Call(record_at, "request.record", {"req": list(req)})
        if "done" in reply:
            raise AlreadyDone(outcome_of(reply["done"]))
        writers = writers | {record_at}
    if dp.name in s.pending:
        yield Call(dp.name, WRITE_NOW, {})
    branches: dict[str, list[Any]] = {}
    for node in sorted(writers):
        ops: list[Any] = [["b", s.bid]]
        for write in (s.pending.pop(node, None) or {}).values():
            ops.append(["w", *write])
        branches[node] = ops
    dp.stats["two_phase"] += 1
    reply = yield DecideStep(branches)
    if reply is NOT_DECIDED:
        # Undecided (no quorum for the decision log?): the outcome is not known
        # yet.  The branches stay until it is; request.result says "running".
        s.state = UNDECIDED
        dp.forget_session(s)
        yield ReplyNow(
            error_out(
                errors.Unavailable("the commit decision is not known yet; ask request.result later")
            )
        )
        outcome = map_run_reply((yield AWAIT_DECISION))
        if outcome.get("ok"):
            s.committed = set(writers)
        return outcome
    outcome = map_run_reply(reply)
    if outcome.get("ok"):
        # Every branch of a committed transaction prepared: each is the resource
        # manager's now, so no branch.end is owed to them.
        s.committed = set(writers)
    if outcome.get("error") == "Aborted":
        down = sorted(n for n in writers if not dp.view.is_up(n))
        if down:
            # The abort came from a participant that could not be reached (its
            # peers gave up waiting): a network error before commit (B8).
            outcome = {
                "error": "Unavailable",
                "message": f"transaction rolled back: node(s) {', '.join(down)} down",
            }
    if "error" in outcome:
        raise_error(outcome)
    return outcome


__all__ = ["RETRYABLE_REASONS", "g_commit", "home_node", "map_run_reply"]
