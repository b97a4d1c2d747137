"""A session's ops as coroutines of the data-plane machine (data-path.md §3, §7).

Each op runs on the session's coordinator: it decides which nodes' branches
take part and yields :class:`~nonstop.dataplane.steps.Call` /
:class:`~nonstop.dataplane.steps.Gather` steps; the machine runs them (an
``Exec`` here, a ``data.req`` elsewhere) and resumes the op with the replies.
The commit is :mod:`nonstop.dataplane.commit`.

Writes travel as write sets (C5): the client ships its deferred field writes
with its next op (:func:`take_writes`); they wait per master node and ride on
the next call to that node, or on the commit (one message per participant).
Writes to objects mastered here are applied before the op goes to any other
node (as when they arrived), riding on the op's first call here when it has one
(the machine sees to it: ``DataPlane._call``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.args import ref_arg
from nonstop.dataplane.bulk_upsert import g_upsert
from nonstop.dataplane.partition_overwrite import g_overwrite_partitions
from nonstop.dataplane.placement import routing_key
from nonstop.dataplane.sizes import MESSAGE_MARGIN
from nonstop.dataplane.state import Session
from nonstop.dataplane.steps import Call, Gather, OpCoroutine
from nonstop.dataplane.stream_commit import g_stream_commit
from nonstop.model.codec import pack, unpack
from nonstop.model.wire import AUDITS, write_in

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

WRITE_NOW = "branch.write"
"""The branch op that only applies the writes riding on it."""


# ------------------------------------------------------------------ writes
def take_writes(dp: DataPlane, s: Session, writes: Any) -> None:
    """The client's deferred writes → ``s.pending``, per master node (checked first, all)."""
    if not isinstance(writes, list):
        raise errors.BadArgument("w must be a list of writes")
    masters = []
    for w in writes:
        ref, type_name, _, _ = write_in(w)
        dp.check_type(type_name, None)
        masters.append(dp.locate(s, ref))
    for node, w in zip(masters, writes, strict=True):
        merge_write(s.pending.setdefault(node, {}), w)


def merge_write(pending: dict[bytes, list[Any]], w: list[Any]) -> None:
    """Later writes of one object add to the earlier ones (same read version)."""
    ref = bytes(w[0])
    old = pending.get(ref)
    if old is None:
        pending[ref] = list(w)
        return
    changes = unpack(old[3])
    changes.update(unpack(w[3]))
    pending[ref] = [old[0], old[1], old[2], pack(changes)]


def raise_fatal(replies: list[Any]) -> None:
    """Re-raise the first failure of a fan-out that is not a node being unreachable.

    A node that answered with an error (a lock timeout, a bad argument, ...) has
    a verdict on the op; only ``Unavailable`` nodes may be left out of a result.
    """
    for r in replies:
        if isinstance(r, BaseException) and not isinstance(r, errors.Unavailable):
            raise r


# --------------------------------------------------------------------- ops
def g_get(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """Unique lookup, cluster scope: the local branch first, then every other up node.

    Looking for the key, a node locks only the object it finds (``if_found``):
    locking the key's absent slot on every node asked, in an order that depends
    on the coordinator (itself first, then the others at once), deadlocked two
    coordinators looking up one key: each held the absent slot the other wanted
    next while waiting for the object, until ``lock_wait`` (data-path.md §7).
    Only when the key is found nowhere are the absent slots locked, on every
    node of the scope one by one in name order (then lookups cannot deadlock).
    """
    dp.check_type(p.get("type"), p.get("tv"))
    key = p.get("key")
    if not isinstance(key, bytes):
        raise errors.BadArgument("key must be packed bytes")
    fields = {"type": p["type"], "tv": p.get("tv"), "key": key, "lock": p.get("lock")}
    scope = p.get("scope", "cluster")
    if dp.config.placement is not None and scope in ("cluster", None):
        # Routing by partition: the key's partition's active node alone knows it.
        return (yield from g_get_in_partition(dp, s, p["type"], key, fields))
    # The query audits apply (a node that is down is not asked: skip_down), and
    # fail_if_down refuses while any node of the scope is down.
    nodes = dp.view.audited(scope, p.get("audit", "skip_down"))
    if scope == "local":
        return (yield Call(dp.name, "branch.get", fields))
    probe = {**fields, "if_found": True}
    reply = yield Call(dp.name, "branch.get", probe)
    if reply.get("o") is not None:
        return reply
    # "Not found" is only an answer once every node of the scope was asked: a key
    # absent from the nodes that are up may live on one that is down, and a
    # get_or_create believing it would create a second object with that key.
    skipped = dp.view.left_out(scope, nodes)
    others = [n for n in nodes if n != dp.name]
    # Where this key was found last time is asked first, alone: a key's object
    # rarely moves, and one RPC instead of one per node is what makes repeated
    # cross-node transactions cheap.  Not found there: everybody else, as usual.
    hint_key = (p["type"], key)
    hint = dp.hints.get(hint_key)
    if hint is not None and hint != dp.name and not dp.view.is_up(hint):
        # Its object lives there: "not found" would be a lie.
        raise errors.Unavailable(f"the object lives on node {hint}, which is down")
    if hint is not None and hint not in others and hint != dp.name and scope in ("cluster", None):
        # Its object lived on a node that is not a member (any more): ask it all the
        # same; "not found" because a node left the view would be a lie too.
        others = [hint, *others]
    if hint in others:
        reply = yield Call(hint, "branch.get", probe)
        if reply.get("o") is not None:
            return reply
        others.remove(hint)
        dp.hints.pop(hint_key, None)
    if others:
        replies = yield Gather([Call(n, "branch.get", probe) for n in others])
        raise_fatal(replies)
        failure: BaseException | None = None
        for node, r in zip(others, replies, strict=True):
            if isinstance(r, BaseException):
                failure = failure or r
            elif r.get("o") is not None:
                dp.remember(hint_key, node)
                return r
        if failure is not None:
            # An absent key on a node we could not ask is not known to be absent.
            raise failure
    if skipped:
        return not_found(skipped)
    # Found nowhere: lock the absent slot everywhere (a get_or_create's "absent"
    # must stay true until commit), in name order; an object created meanwhile
    # is found and locked instead.
    for node in sorted(nodes):
        reply = yield Call(node, "branch.get", fields)
        if reply.get("o") is not None:
            if node != dp.name:
                dp.remember(hint_key, node)
            return reply
    return not_found(skipped)


def g_get_in_partition(
    dp: DataPlane, s: Session, type_name: str, key: bytes, fields: dict[str, Any]
) -> OpCoroutine:
    """A unique lookup under routing by partition: one call, to the node acting for the
    partition the key maps to (the mapper sends a key to one partition, so it is unique
    cluster-wide there); Unavailable while that partition has no active node up."""
    assert dp.config.placement is not None
    value = unpack(key)
    if not isinstance(value, dict) or len(value) != 1:
        raise errors.BadArgument("key must be one unique key {field: value}")
    (key_value,) = value.values()
    partition = dp.config.placement.partition_for(type_name, routing_key(key_value))
    node = dp.place(s, partition)
    location = dp.view.partitions[partition].location
    return (yield Call(node, "branch.get", {**fields, "locs": [location]}))


def not_found(skipped: list[str]) -> dict[str, Any]:
    """The reply of a unique lookup that found nothing on every node it asked."""
    if skipped:
        raise errors.Unavailable(
            f"not found on the nodes that are up; node(s) {', '.join(skipped)} could not be asked"
        )
    return {"o": None}


def g_ref(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    ref = ref_arg(p.get("ref"))
    fields = {"ref": ref, "lock": p.get("lock")}
    return (yield Call(dp.locate(s, ref), "branch.ref", fields))


def g_delete(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    ref = ref_arg(p.get("ref"))
    node = dp.locate(s, ref)
    reply = yield Call(node, "branch.delete", {"ref": ref})
    s.dirty.add(node)
    return reply


def g_create(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    dp.check_type(p.get("type"), p.get("tv"))
    node = p.get("node") or dp.name
    if not isinstance(node, str) or node not in dp.view.known:
        # Refused under either routing: a misspelt name is an error, not ignored.
        raise errors.BadArgument(f"no node named {node!r:.40} in this cluster")
    if dp.config.placement is not None:
        reply = yield from g_create_in_partition(dp, s, p)
        return reply
    if node not in dp.view.members:
        # A lookup asks the members only: an object created on a node outside them
        # could be "not found" and created twice (issue 10).
        raise errors.BadArgument(
            f"node {node} is not a member of the cluster ({', '.join(dp.view.members)}): "
            "objects are created on members only"
        )
    fields = {"type": p["type"], "tv": p.get("tv"), "st": p.get("st")}
    reply = yield Call(node, "branch.create", fields)
    s.dirty.add(node)
    return reply


def g_create_in_partition(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """A create under routing by partition: the type's binding and mapper pick the partition
    (by the unique key's value if the type has one), and the object is created there, on its
    active node, named by the partition at its epoch (``tx.create_in``).  ``node`` is not
    used (beyond naming a node of the cluster): placement is the binding's."""
    placement = dp.config.placement
    assert placement is not None
    type_name = p["type"]
    packed = p.get("st")
    state = unpack(packed) if isinstance(packed, bytes) else None
    if not isinstance(state, dict):
        raise errors.BadArgument("st must be a packed {field: value}")
    field = placement.unique_field(type_name)
    value = state.get(field) if field is not None else None
    partition = placement.partition_for(type_name, None if value is None else routing_key(value))
    node = dp.place(s, partition)
    part = dp.view.partitions[partition]
    fields = {
        "type": type_name,
        "tv": p.get("tv"),
        "st": p.get("st"),
        "pl": [part.location, part.epoch],
    }
    reply = yield Call(node, "branch.create", fields)
    s.dirty.add(node)
    return reply


def g_method(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """``tx.call``: a method of an object runs on the object's master."""
    ref = ref_arg(p.get("ref"))
    node = dp.locate(s, ref)
    fields = {
        "ref": ref,
        "m": p.get("m"),
        "a": p.get("a"),
        "lock": p.get("lock"),
        # An @asynchronous method queued as a timer (D20): its delay in seconds.
        "after": p.get("after"),
        # Any method may run on an object of the attached node; elsewhere only
        # the ones marked @nonstop.remote (C4).
        "ro": node != dp.name,
    }
    reply = yield Call(node, "branch.call", fields)
    s.dirty.add(node)
    return reply


def g_query(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """A query on every node of its scope; ordered results merged by order key, deduped."""
    dp.check_type(p.get("type"), p.get("tv"))
    audit = p.get("audit", "skip_down")
    nodes, parts = query_targets(dp, s, p.get("scope", "cluster"), audit)
    limit = p.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise errors.BadArgument("limit must be an int >= 0")
    order = p.get("order")
    rng = p.get("range")
    fields = {
        "type": p["type"],
        "tv": p.get("tv"),
        "where": p.get("where"),
        "range": rng,
        "order": order,
        "limit": limit,
        "lock": p.get("lock"),
    }
    page = p.get("page")
    if page is not None:
        reply = yield from g_query_page(dp, s, nodes, fields, page, p.get("after"), audit, parts)
        return reply
    desc = False
    if order is not None:
        desc = bool(order[1]) if isinstance(order, list | tuple) and len(order) > 1 else False
    if desc:  # keyset paging runs ascending: one answer per node, as it fits
        results = yield from g_fan_out(dp, s, nodes, "branch.query", fields, audit, parts)
    else:
        results = yield from g_query_whole(dp, s, nodes, fields, audit, parts)
    return {"os": merge_query(results, order is not None or rng is not None, desc, limit)}


QUERY_PIECE = 2000
"""The most objects one ``branch.query`` step of a whole answer reads (then ``cut``, and the
node is asked again past the last one): a node's event loop runs between the pieces.  A
locking query of 10,000 objects read in one step held its node's loop ~0.4 s under load,
longer than the lease could bear (session 15, ``test_large_partition_overwrite``)."""


def g_query_whole(
    dp: DataPlane,
    s: Session,
    nodes: list[str],
    fields: dict[str, Any],
    audit: Any,
    parts: dict[str, list[int]] | None = None,
) -> OpCoroutine:
    """Every node's whole answer to a query, asked in frame-sized pieces (issue 14).

    A node's answer can exceed the frame limit (two objects of 9 MB with a
    16 MiB limit): each node cuts its answer to what a frame carries (``cut``)
    and is asked again past the last object it sent (keyset paging, as
    :func:`g_query_page`), until its answer is whole.  The merged result goes
    to the client in pieces too (the service's ``more`` cursor), so a query can
    always read back what was written.  ``parts`` as for :func:`g_fan_out`.
    """
    limit = fields.get("limit")
    budget = max(1, (dp.config.max_message - MESSAGE_MARGIN) // 2)
    paged = {
        **fields,
        "page": True,
        "after": None,
        "bytes": budget,
        "piece": QUERY_PIECE,
        "keep": True,
    }
    asks = {n: paged if parts is None else {**paged, "locs": parts[n]} for n in nodes}
    replies = yield Gather([Call(n, "branch.query", asks[n]) for n in nodes])
    raise_fatal(replies)
    results: list[dict[str, Any]] = []
    failure: BaseException | None = None
    for node, reply in zip(nodes, replies, strict=True):
        if isinstance(reply, BaseException):
            failure = failure or reply
            continue
        objs, keys = list(reply.get("os") or []), list(reply.get("k") or [])
        while reply.get("cut") and objs and (limit is None or len(objs) < limit):
            rest = None if limit is None else limit - len(objs)
            more = {**asks[node], "after": [keys[-1], objs[-1][0]], "limit": rest}
            reply = yield Call(node, "branch.query", more)
            objs += reply.get("os") or []
            keys += reply.get("k") or []
        results.append({"os": objs, "k": keys})
    if failure is not None and (audit != "at_least_one" or not results):
        raise failure
    return results


def g_query_page(
    dp: DataPlane,
    s: Session,
    nodes: list[str],
    fields: dict[str, Any],
    page: Any,
    after: Any,
    audit: Any,
    parts: dict[str, list[int]] | None = None,
) -> OpCoroutine:
    """One page of a query (A5: constant memory however many objects match).

    Keyset paging, no cursor kept anywhere: every node answers its first
    ``page`` results past ``after`` (the position of the last object the client
    got), and the pages are merged by position.  A node that filled its page
    may have more past its last one (as has one whose page was cut to fit a
    frame), so the merged page stops at the smallest
    such last position: what is sent is complete up to there, and the next
    request resumes right after it.
    """
    if not isinstance(page, int) or isinstance(page, bool) or page < 1:
        raise errors.BadArgument("page must be an int >= 1")
    order = fields.get("order")
    if isinstance(order, list | tuple) and len(order) > 1 and order[1]:
        raise errors.BadArgument("a paged query runs in ascending order")
    limit = fields.get("limit")
    fields = {**fields, "limit": page if limit is None else min(page, limit), "page": True}
    fields["after"] = after
    # Each node's page fits in a frame whatever its objects' size (it is cut, then).
    fields["bytes"] = max(1, (dp.config.max_message - MESSAGE_MARGIN) // 2)
    results = yield from g_fan_out(dp, s, nodes, "branch.query", fields, audit, parts)
    return merge_page(results, fields["limit"])


def merge_page(results: list[dict[str, Any]], page: int) -> dict[str, Any]:
    """The nodes' pages → one page, its last position and whether more may follow (rest)."""
    streams = [list(zip(r.get("k") or [], r.get("os") or [], strict=False)) for r in results]
    full = [s for s, r in zip(streams, results, strict=True) if len(s) >= page or r.get("cut")]
    bound = min(((s[-1][0], s[-1][1][0]) for s in full), default=None)
    seen: set[bytes] = set()
    out: list[Any] = []
    last: list[bytes] | None = None
    more = bool(full)
    for k, o in heapq.merge(*streams, key=lambda kv: (kv[0], kv[1][0])):
        if bound is not None and (k, o[0]) > bound:
            break
        if o[0] in seen:
            continue
        if len(out) >= page:
            more = True
            break
        seen.add(o[0])
        out.append(o)
        last = [k, o[0]]
    # "rest", not "more": "more" is the service's cursor of a reply split for size.
    return {"os": out, "after": last, "rest": more and last is not None}


def merge_query(
    results: list[dict[str, Any]], ordered: bool, desc: bool, limit: int | None
) -> list[Any]:
    """The nodes' answers → one list: in order-key order if ordered, each object once, limited."""
    objs: Iterable[Any]
    if ordered:
        streams = [list(zip(r.get("k") or [], r.get("os") or [], strict=False)) for r in results]
        key: Callable[[Any], Any] = lambda kv: (kv[0], kv[1][0])  # noqa: E731
        objs = (o for _, o in heapq.merge(*streams, key=key, reverse=desc))
    else:
        objs = (o for r in results for o in (r.get("os") or []))
    seen: set[bytes] = set()
    out: list[Any] = []
    for o in objs:
        if o[0] in seen:
            continue
        seen.add(o[0])
        out.append(o)
        if limit is not None and len(out) >= limit:
            break
    return out


def g_count(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    dp.check_type(p.get("type"), p.get("tv"))
    audit = p.get("audit", "skip_down")
    nodes, parts = query_targets(dp, s, p.get("scope", "cluster"), audit)
    fields = {"type": p["type"], "tv": p.get("tv")}
    results = yield from g_fan_out(dp, s, nodes, "branch.count", fields, audit, parts)
    return {"n": sum(int(r.get("n", 0)) for r in results)}


def query_targets(
    dp: DataPlane, s: Session, scope: Any, audit: Any
) -> tuple[list[str], dict[str, list[int]] | None]:
    """The nodes a query or count asks, and (routing by partition) the partitions' location
    codes each answers for: each partition once, on the node acting for it.

    A partition no node serves now is skipped under ``skip_down`` and
    ``at_least_one`` (as a node that is down), and makes ``fail_if_down`` Unavailable,
    naming it.  Scopes other than the cluster keep their meaning (those nodes, all
    they hold).
    """
    if dp.config.placement is None or scope not in ("cluster", None):
        return dp.view.audited(scope, audit), None
    if audit not in AUDITS:
        dp.view.audited(scope, audit)  # the audit's name is wrong: its BadArgument
    by_node, missing = dp.view.acting_nodes()
    if missing and audit == "fail_if_down":
        names = ", ".join(part.name for part in missing)
        raise errors.Unavailable(f"partition(s) of the query scope have no active node up: {names}")
    if not by_node:
        raise errors.Unavailable("no partition of the cluster has an active node up")
    parts: dict[str, list[int]] = {}
    for node, served in by_node.items():
        fence = s.fence.setdefault(node, {})
        for part in served:
            fence[part.name] = part.epoch
        parts[node] = [part.location for part in served]
    return sorted(by_node), parts


def g_fan_out(
    dp: DataPlane,
    s: Session,
    nodes: list[str],
    op: str,
    fields: dict[str, Any],
    audit: Any,
    parts: dict[str, list[int]] | None = None,
) -> OpCoroutine:
    """Run ``op`` on every node at once; a failed node is skipped only under at_least_one.

    ``parts``: node → the partitions (location codes) it answers for (routing by partition).
    """
    if parts is None:
        calls = [Call(n, op, fields) for n in nodes]
    else:
        calls = [Call(n, op, {**fields, "locs": parts[n]}) for n in nodes]
    replies = yield Gather(calls)
    raise_fatal(replies)
    results: list[dict[str, Any]] = []
    failure: BaseException | None = None
    for r in replies:
        if isinstance(r, BaseException):
            failure = failure or r
        else:
            results.append(r)
    if failure is not None and (audit != "at_least_one" or not results):
        raise failure
    return results


def g_overwrite(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """Swap a staged overwrite in on EVERY node of the cluster, in this session
    (data-path.md §6): the client's commit then makes it visible everywhere at
    once, or nowhere (two-phase commit).  A node down: Unavailable, nothing swapped.
    """
    dp.check_type(p.get("type"), p.get("tv"))
    if dp.config.placement is not None:  # every partition's swap (data-path.md §6.6)
        return (yield from g_overwrite_partitions(dp, s, p))
    nodes = dp.view.members
    down = sorted(n for n in nodes if not dp.view.is_up(n))
    if down:
        raise errors.Unavailable(
            f"node(s) {', '.join(down)} of the cluster are down: an overwrite swaps the "
            "objects of every node at once, so it needs all of them up"
        )
    fields = {k: p.get(k) for k in ("type", "tv", "job", "parts")}
    deleted = inserted = replayed = 0
    # One node after the other in name order: two overwrites of a type then
    # queue on the first node instead of deadlocking across nodes.
    for node in sorted(nodes):
        reply = yield Call(node, "branch.overwrite", fields)
        s.dirty.add(node)
        deleted += int(reply.get("deleted", 0))
        inserted += int(reply.get("inserted", 0))
        replayed += bool(reply.get("replayed"))
    return {"deleted": deleted, "inserted": inserted, "replayed": replayed == len(nodes)}


OPS: dict[str, Callable[[DataPlane, Session, dict[str, Any]], OpCoroutine]] = {
    "tx.get": g_get,
    "tx.ref": g_ref,
    "tx.query": g_query,
    "tx.count": g_count,
    "tx.create": g_create,
    "tx.delete": g_delete,
    "tx.call": g_method,
    "tx.overwrite": g_overwrite,
    "tx.upsert": g_upsert,
    "tx.stream.commit": g_stream_commit,
}
"""Session ops other than the commit (and the rollback, which is not an op of its own)."""

__all__ = [
    "OPS",
    "WRITE_NOW",
    "g_query_whole",
    "merge_page",
    "merge_query",
    "merge_write",
    "raise_fatal",
    "take_writes",
]
