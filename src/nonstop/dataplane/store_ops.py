"""The store side of the data plane: one ``Exec`` on the node's real store.

The machine (:mod:`nonstop.dataplane.machine`) asks for every store op with an
:class:`~nonstop.dataplane.events.Exec`; the real node's adapter
(:mod:`nonstop.dataplane.service`) runs it here, on the branch's
:class:`~nonstop.tx.async_transaction.AsyncTransaction` (lock waits included),
and feeds the reply back.  Errors become error replies
(:func:`nonstop.model.wire.error_out`) in the adapter.

Ops on a branch (:func:`run_branch_op`):

* ``branch.get`` / ``ref`` / ``query`` / ``count`` / ``create`` / ``delete`` /
  ``call`` / ``write`` / ``overwrite`` / ``upsert`` / ``stream.commit`` -- data-path.md
  §4, §6.5, §6.7 (:func:`execute`);
* ``branch.commit`` ``{req}`` -- claim and record the request result (H1) if
  any, then commit: ``{}``, or ``{"done": [ok, value]}`` (already recorded:
  nothing committed, the branch stays open for the machine to end);
* ``request.record`` ``{req}`` -- the same claim and record, without the
  commit (the branch then takes part in two-phase commit);
* ``request.lookup`` ``{req}`` -- a homed request's record, read on the home
  node's branch once its slot is read-locked (docs/design/requests.md); never in
  doubt once the lock is granted (see :func:`run_branch_op`).

Ops outside any branch (:func:`run_store_op`):

* ``request.lookup`` ``{req}`` → ``{"found": [ok, value] or None, "in_doubt": bool}``
  (in doubt: a prepared branch here may still commit a result);
* ``request.abort`` ``{req, error, message}`` -- record an aborted commit's
  outcome in a store commit of its own, unless a result is there already.

Every op first applies the write set riding on it (``Exec.writes``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.args import parse_req, ref_arg, unpacked
from nonstop.dataplane.managed_types import check_type, types_reply
from nonstop.dataplane.results import NOT_COMMITTED_RESULT
from nonstop.dataplane.sizes import write_bytes
from nonstop.dataplane.snapshot_cut import CUT_OPS, run_cut_op
from nonstop.model.codec import encode_key, pack
from nonstop.model.entry import CLEAN, DELETED
from nonstop.model.managed import Managed, registered_types, type_info
from nonstop.model.ref import Ref
from nonstop.model.wire import obj_out, write_in
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.asyncmethods import AsyncMethod, check_delay
from nonstop.tx.entries import NONE
from nonstop.tx.query import release_if_unheld
from nonstop.tx.requests import (
    DEFAULT_WINDOW,
    g_claim_request,
    g_lookup_request,
    g_record_result,
    lookup_result,
)
from nonstop.tx.transaction import WRITE, Entry, Isolation, TxState

if TYPE_CHECKING:
    from nonstop.database import Database


def obj_of(e: Entry) -> list[Any]:
    return obj_out(e.ref, e.info.name, e.version, e.state)


# ================================================================ branch ops
async def run_branch_op(
    tx: AsyncTransaction,
    op: str,
    fields: dict[str, Any],
    writes: Any,
    window: int = DEFAULT_WINDOW,
    commit: Callable[[AsyncTransaction], Awaitable[dict[str, Any] | None]] | None = None,
) -> dict[str, Any]:
    """One ``Exec`` on a branch: its write set, then its op (module doc).

    ``commit``: how ``branch.commit`` commits (sync replication of partitions: the
    write set reaches the replicas first, ``nonstop.node.replica_store``); default
    ``tx.commit()``; an error reply it returns is an outcome not known here, answered
    ``{"unknown": reply}`` (``OutcomeUnknown`` at the coordinator: nothing recorded)."""
    if writes:
        await apply_writes(tx, writes)
    if op.startswith("branch.") and op != "branch.commit":
        return await execute(tx, op, fields)
    if op == "branch.commit":
        req = parse_req(fields.get("req"))
        if req is not None:
            found = await claim_and_record(tx, req, window)
            if found is not None:
                return {"done": list(found)}
        if commit is None:
            await tx.commit()
        else:
            unknown = await commit(tx)
            if unknown is not None:
                return {"unknown": unknown}
        return {}
    if op == "request.record":
        req = parse_req(fields.get("req"))
        if req is None:
            raise errors.BadArgument("request.record needs a req")
        found = await claim_and_record(tx, req, window)
        return {} if found is None else {"done": list(found)}
    if op == "request.lookup":
        req = parse_req(fields.get("req"))
        if req is None:
            raise errors.BadArgument("request.lookup needs a req")
        if fields.get("fence") is True:
            return await settle_not_committed(tx, req, window)
        found = await tx.adrive(g_lookup_request(tx, *req))
        # Not in doubt, whatever else is prepared here: a transaction that may still
        # commit this request's record claimed its slot with a write lock and keeps it
        # while prepared (a restart recovers it with its locks), so the read lock above
        # waited for it; and a promoted partition is served only once the prepared
        # records it came with are resolved (node/replicated.py, ``ready``).  Answering
        # "in doubt" while *any* transaction was prepared kept a client asking for
        # seconds under load for a request that had never committed.
        return {"found": None if found is None else list(found), "in_doubt": False}
    raise errors.BadArgument(f"unknown branch op {op!r:.40}")


async def settle_not_committed(
    tx: AsyncTransaction, req: tuple[str, int], window: int
) -> dict[str, Any]:
    """``request.lookup`` with ``fence``: request ``req``'s outcome, settled in branch ``tx``.

    The slot is write-locked (an attempt that claimed it -- running, prepared, or taken
    over at a promotion -- is waited for); a recorded result is the answer.  Without
    one, "not committed" is recorded in ``tx`` (``NotCommitted``): once the caller
    commits the branch, every later claim of ``req`` finds it, so no attempt of the
    request can commit any more (requests.md section 3)."""
    found = await claim_and_record(tx, req, window, list(NOT_COMMITTED_RESULT))
    if found is not None:
        return {"found": list(found), "in_doubt": False}
    return {"found": None, "in_doubt": False, "fenced": True}


async def claim_and_record(
    tx: AsyncTransaction, req: tuple[str, int], window: int, aborted: list[str] | None = None
) -> tuple[bool, Any] | None:
    """Lock request ``req``'s result slot in ``tx``; its recorded result, or record success
    (``aborted`` None) or that abort (``[error class, message]``) and return None."""
    client, seq = req
    found: tuple[bool, Any] | None = await tx.adrive(g_claim_request(tx, client, seq, window))
    if found is not None:
        return found
    await tx.adrive(g_record_result(tx, client, seq, aborted is None, aborted, window))
    return None


async def execute(tx: AsyncTransaction, op: str, p: dict[str, Any]) -> dict[str, Any]:
    """Run one branch op on ``tx`` (the coordinator's own branch or a participant's).

    ``locs`` (routing by partition): the location codes of the partitions this node
    answers for in this op -- lookups, queries and counts see only their objects
    (``tx.restrict_to``), so that each partition is counted once.
    """
    # (not "parts": an overwrite's swap names its staged parts so)
    parts = p.get("locs")
    if parts is None:
        return await _execute(tx, op, p)
    if not isinstance(parts, list):
        raise errors.BadArgument("locs must be a list of location codes")
    tx.restrict_to(parts)
    try:
        return await _execute(tx, op, p)
    finally:
        tx.restrict_to(None)


async def _execute(tx: AsyncTransaction, op: str, p: dict[str, Any]) -> dict[str, Any]:
    if op == "branch.get":
        info = check_type(p.get("type"), p.get("tv"))
        key = unpacked(p.get("key"), "key")
        if not isinstance(key, dict) or len(key) != 1:
            raise errors.BadArgument("key must be one unique key {field: value}")
        # A probe of a cluster-scope lookup: no lock on an absent key's slot
        # (session_ops.g_get says why); the object, if found, is locked below.
        probe = p.get("if_found") and p.get("lock") != "none"
        if probe and await tx.find(info.cls, lock="none", **key) is None:
            return {"o": None}
        found = await tx.find(info.cls, lock=p.get("lock"), **key)
        return {"o": None if found is None else obj_of(tx.entry_of(found))}
    if op == "branch.ref":
        found = await tx.by_ref(Ref(ref_arg(p.get("ref"))), lock=p.get("lock"))
        return {"o": None if found is None else obj_of(tx.entry_of(found))}
    if op == "branch.query":
        return await _run_query(tx, p)
    if op == "branch.count":
        info = check_type(p.get("type"), p.get("tv"))
        return {"n": await tx.count(info.cls)}
    if op == "branch.create":
        info = check_type(p.get("type"), p.get("tv"))
        state = unpacked(p.get("st"), "st")
        if not isinstance(state, dict):
            raise errors.BadArgument("st must be a packed {field: value}")
        placed = p.get("pl")
        if placed is None:
            obj = await tx.create(info.cls, **state)
        else:
            # Routing by partition: named by the partition at its epoch (store.md, format 3).
            if not isinstance(placed, list) or len(placed) != 2:
                raise errors.BadArgument("pl must be [location, epoch]")
            obj = await tx.create_in(info.cls, placed[0], placed[1], **state)
        return {"o": obj_of(tx.entry_of(obj))}
    if op == "branch.delete":
        target = await tx.by_ref(Ref(ref_arg(p.get("ref"))), lock="write")
        if target is None:
            raise errors.NotFound("no object with this reference")
        await tx.delete(target)
        return {}
    if op == "branch.call":
        return await _run_call(tx, p)
    if op == "branch.write":
        return {}
    if op == "branch.holdings":  # what this node would lose if it left (holdings.py)
        counts = {}
        for name, cls in sorted(registered_types().items()):
            n = await tx.count(cls)
            if n:
                counts[name] = n
        return {"types": counts}
    if op in CUT_OPS:
        return run_cut_op(tx, op, p)
    if op == "branch.overwrite":
        if p.get("partitions") is not None:  # routing by partition (data-path.md §6.6)
            from nonstop.bulk.partition_swap import overwrite_partitions_branch

            info = check_type(p.get("type"), p.get("tv"))
            return await overwrite_partitions_branch(tx, info, p)
        from nonstop.bulk.handlers import overwrite_branch

        return await overwrite_branch(tx, check_type(p.get("type"), p.get("tv")), p)
    if op == "branch.upsert":  # a bulk batch under routing by partition
        from nonstop.bulk.partitioned import upsert_branch

        return await upsert_branch(tx, check_type(p.get("type"), p.get("tv")), p)
    if op == "branch.stream.commit":  # a streaming sink's micro-batch (data-path.md §6.7)
        from nonstop.bulk.handlers import run_steps_sliced
        from nonstop.bulk.stream_marks import batch_arg, g_commit_stream, stream_id
        from nonstop.dataplane.stream_commit import locations_arg

        locations = locations_arg(p.get("partitions"))
        stream, batch = stream_id(p.get("stream")), batch_arg(p.get("batch"))
        steps = g_commit_stream(tx, locations, stream, batch)
        return await run_steps_sliced(tx, steps)  # type: ignore[no-any-return]
    raise errors.BadArgument(f"unknown branch op {op!r:.40}")


async def _run_query(tx: AsyncTransaction, p: dict[str, Any]) -> dict[str, Any]:
    info = check_type(p.get("type"), p.get("tv"))
    q = tx.query(info.cls)
    where = unpacked(p.get("where"), "where") if p.get("where") is not None else {}
    if not isinstance(where, dict):
        raise errors.BadArgument("where must be a packed {field: value}")
    refs = {k: v for k, v in where.items() if isinstance(v, Ref)}
    q.where(**{k: v for k, v in where.items() if k not in refs})
    if refs:  # a reference as such: its object may live on another node
        q.where_ref(**refs)
    rng = p.get("range")
    if rng is not None:
        rng = unpacked(rng, "range")
        if not isinstance(rng, list) or len(rng) != 5:
            raise errors.BadArgument("range must be a packed [field, lo, hi, lo_incl, hi_incl]")
        fname, lo, hi, lo_inc, hi_inc = rng
        q.range(fname, lo, hi, inclusive=(bool(lo_inc), bool(hi_inc)))
    order = p.get("order")
    if order is not None:
        if not isinstance(order, list) or not order or not isinstance(order[0], str):
            raise errors.BadArgument("order must be [field, descending]")
        q.order_by(order[0], descending=bool(order[1]) if len(order) > 1 else False)
    limit = p.get("limit")
    paged = bool(p.get("page"))
    piece = p.get("piece") if paged else None
    descending = q.ordering is not None and q.ordering[1]
    if not isinstance(piece, int) or isinstance(piece, bool) or piece < 1 or descending:
        piece = None  # (keyset paging runs ascending: a descending answer is one piece)
    elif isinstance(limit, int) and not isinstance(limit, bool) and limit <= piece:
        piece = None  # (the limit ends it first)
    if limit is not None:
        q.limit(limit)
    if piece is not None:
        q.limit(piece)  # one piece of a whole answer: "cut" below, asked again past it
    if p.get("lock") is not None:
        q.lock(p.get("lock"))
    if paged:  # keyset paging (session_ops.g_query): resume past the last position sent
        q.after(_position(p.get("after")))
    found = await q.all()
    objs = [obj_of(tx.entry_of(h)) for h in found]
    reply: dict[str, Any] = {"os": objs}
    if paged:
        if piece is not None and len(found) >= piece:
            reply["cut"] = True  # maybe more past the last one
        budget = p.get("bytes")
        if isinstance(budget, int) and budget > 0:
            # A page of big objects is cut to what one frame carries ("cut": the
            # data plane then takes this node as having more past its last one).
            kept = page_within(objs, budget)
            if kept < len(objs):
                del objs[kept:], found[kept:]
                reply["cut"] = True
        reply["k"] = [q.position_of(h)[0] for h in found]
        if not p.get("keep"):  # a whole answer in pieces keeps what it read, as before
            sent = [h._e for h in found]
            found.clear()
            forget_unlocked(tx, sent)
    elif q.ordering is not None:
        fname = q.ordering[0]
        reply["k"] = [encode_key(tx.entry_of(h).state[fname]) for h in found]
    return reply


def page_within(objs: list[Any], budget: int) -> int:
    """How many of ``objs`` (at least one) fit in ``budget`` bytes on the wire, about."""
    used = 0
    for n, obj in enumerate(objs):
        used += write_bytes(obj)
        if used > budget and n > 0:
            return n
    return len(objs)


def forget_unlocked(tx: AsyncTransaction, sent: list[Entry]) -> None:
    """A page sent is forgotten by the branch unless locked or changed: however many
    pages a query is read in, the branch's memory holds one page (A5)."""
    entries = tx.entry_map()
    for entry in sent:
        if entry.status == CLEAN and entry.lock == NONE and entries.get(entry.ref) is entry:
            del entries[entry.ref]
            release_if_unheld(entry)


def _position(after: Any) -> tuple[bytes, bytes] | None:
    """A paged query's resume position: None, or [sort key, ref] as two byte strings."""
    if after is None:
        return None
    if (
        not isinstance(after, list | tuple)
        or len(after) != 2
        or not all(isinstance(b, bytes) for b in after)
    ):
        raise errors.BadArgument("after must be [sort key, ref] (bytes)")
    return bytes(after[0]), bytes(after[1])


def _remote_marked(fn: Any) -> bool:
    return bool(getattr(fn, "__nonstop_remote__", False))


async def _run_call(tx: AsyncTransaction, p: dict[str, Any]) -> dict[str, Any]:
    method = p.get("m")
    if not isinstance(method, str) or not method or method.startswith("_"):
        raise errors.BadArgument(f"not a method name: {method!r:.40}")
    lock = p.get("lock") or "write"
    target = await tx.by_ref(Ref(ref_arg(p.get("ref"))), lock=lock)
    if target is None:
        raise errors.NotFound("no object with this reference")
    cls = type(target)
    fn = getattr(cls, method, None)
    # An @asynchronous method is a descriptor, not a callable: calling it through the
    # handle queues the call in this branch (A6 to a remote target).
    is_method = callable(fn) or isinstance(fn, AsyncMethod)
    if fn is None or not is_method or method in type_info(cls).fields:
        raise errors.BadArgument(f"{type_info(cls).name} has no method {method!r}")
    if p.get("ro") and not _remote_marked(fn):
        raise errors.NotRemote(
            f"{type_info(cls).name}.{method} is not marked @nonstop.remote; it cannot run "
            "on the object's master node"
        )
    a = unpacked(p.get("a"), "a") if p.get("a") is not None else [[], {}]
    if not (isinstance(a, list) and len(a) == 2 and isinstance(a[1], dict)):
        raise errors.BadArgument("a must be a packed [args, kwargs]")
    after = p.get("after")
    if after is not None:  # a timer (D20): only an @asynchronous method takes a delay
        if not isinstance(fn, AsyncMethod):
            raise errors.BadArgument(
                f"{type_info(cls).name}.{method} is not asynchronous: it takes no delay"
            )
        result = getattr(target, method).after(check_delay(after), *a[0], **a[1])
    else:
        result = getattr(target, method)(*a[0], **a[1])
    if asyncio.iscoroutine(result):
        result = await result
    if isinstance(result, Managed):
        result = Ref(tx.entry_of(result).ref)
    try:
        packed = pack(result)
    except (TypeError, ValueError) as exc:
        raise errors.BadArgument(f"the result of {method} cannot be sent: {exc}") from None
    mine = tx.entry_of(target)
    objs = [obj_of(mine)] if mine.status < DELETED else []
    for e in list(tx.entries()):
        if e is not mine and e.status != CLEAN and e.status < DELETED:
            objs.append(obj_of(e))
    return {"r": packed, "os": objs}


async def apply_writes(tx: AsyncTransaction, writes: Any) -> None:
    """Apply a write set (data-path.md section 2) to ``tx``: lock, version check, set fields.

    A version different from the one this transaction holds means the client
    wrote on a stale copy: ``Conflict`` (retryable, B7).
    """
    if not isinstance(writes, list):
        raise errors.BadArgument("a write set is a list of writes")
    for w in writes:
        ref, type_name, version, changes = write_in(w)
        check_type(type_name, None)
        e = tx.entry(ref)
        if e is None or e.lock < WRITE:
            handle = await tx.by_ref(Ref(ref), lock="write")
            e = None if handle is None else tx.entry_of(handle)
        if e is None or e.status >= DELETED:
            raise errors.Conflict(f"{type_name} object {Ref(ref)} was deleted")
        if e.info.name != type_name:
            raise errors.BadArgument(f"object {Ref(ref)} is a {e.info.name}, not a {type_name}")
        if e.version != version:
            raise errors.Conflict(
                f"{type_name} object {Ref(ref)} changed: written on version {version}, "
                f"it is at version {e.version}"
            )
        for name, value in changes.items():
            if name not in e.info.fields:
                raise errors.FieldError(f"{type_name} has no field {name!r}")
            tx.write_field(e, name, value)


# ============================================================ store ops
async def run_store_op(
    db: Database,
    op: str,
    fields: dict[str, Any],
    lock_wait: float,
    window: int = DEFAULT_WINDOW,
) -> dict[str, Any]:
    """One ``Exec`` outside any branch (module doc)."""
    req = parse_req(fields.get("req"))
    if req is None:
        raise errors.BadArgument(f"{op} needs a req")
    if op == "request.lookup":
        found = lookup_result(db, *req)
        if found is not None:
            return {"found": list(found), "in_doubt": False}
        return {"found": None, "in_doubt": bool(db.in_doubt())}
    if op == "request.abort":
        await record_abort(db, req, fields.get("error"), fields.get("message"), lock_wait, window)
        return {}
    raise errors.BadArgument(f"unknown store op {op!r:.40}")


async def record_abort(
    db: Database,
    req: tuple[str, int],
    error: Any,
    message: Any,
    lock_wait: float,
    window: int,
) -> None:
    """Record ``[false, [error, message]]`` for ``req`` unless a result is recorded already."""
    client, seq = req
    tx = AsyncTransaction(db, Isolation.SERIALIZABLE, lock_wait)
    try:
        found = await tx.adrive(g_claim_request(tx, client, seq, window))
        if found is None:
            value = [error, message]
            await tx.adrive(g_record_result(tx, client, seq, False, value, window))
            await tx.commit()
    finally:
        if tx.state is TxState.ACTIVE:
            await tx.rollback()


__all__ = [
    "apply_writes",
    "check_type",
    "claim_and_record",
    "execute",
    "obj_of",
    "record_abort",
    "run_branch_op",
    "run_store_op",
    "types_reply",
]
