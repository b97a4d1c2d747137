"""The node's data service: client sessions, branches, node-to-node data RPC, commit.

The contract is ``docs/design/data-path.md`` (sections 3-5).  This is not a
protocol machine: it is the runtime's asyncio bridge between client requests,
the node's :class:`~nonstop.Database` and the other nodes' data services.  The
commit decision of a transaction that wrote on several nodes is the
``DtxClusterNode``'s (two-phase commit with the decision in the Raft log); this
module only hands it the branches and maps its answer.

Vocabulary:

* A **session** is one client transaction on the node the client is attached
  to (its *coordinator*).  It belongs to the client connection that began it:
  if the connection closes, the session is rolled back, unless it is
  committing (a commit in progress always finishes).
* A **branch** is the part of a session on one node: an ``AsyncTransaction``
  of that node's database, named ``"<coordinator>.<session id>"``.  The
  coordinator's own part is a branch too, so the resource manager finds every
  branch the same way (:meth:`DataService.lookup_branch`).  A participant
  opens a branch on the first op naming it and keeps it until ``branch.end``,
  a commit, or ``branch_idle`` seconds without an op (B8: participants that
  cannot be reached roll back on their own).
* An object's **master** is the node whose location code is the first 8 bytes
  of its reference; every node's hello announces its location.

Writes travel as write sets (C5): the client ships its deferred field writes
with its next op; writes to objects mastered here are applied at once, writes
to remote objects are kept per node and ride on the next op sent to that node,
or on the commit (one message per participant).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from nonstop import errors
from nonstop.model.codec import encode_key, pack, unpack
from nonstop.model.managed import _REGISTRY, Managed, TypeInfo, type_info
from nonstop.model.ref import REF_SIZE, Ref
from nonstop.model.wire import (
    AUDITS,
    STORE_ISOLATION,
    error_out,
    location_of,
    obj_out,
    raise_error,
    write_in,
)
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.asyncmethods import AsyncMethod
from nonstop.tx.requests import DEFAULT_WINDOW, g_claim_request, g_record_result, lookup_result
from nonstop.tx.transaction import CLEAN, DELETED, WRITE, Entry, Isolation, _State

if TYPE_CHECKING:
    from nonstop.database import Database

log = logging.getLogger("nonstop.data")

SESSION_OPS = frozenset(
    {
        "tx.get",
        "tx.ref",
        "tx.query",
        "tx.count",
        "tx.create",
        "tx.delete",
        "tx.call",
        "tx.overwrite",
        "tx.commit",
        "tx.rollback",
    }
)
CLIENT_OPS = SESSION_OPS | {"tx.begin", "nodes", "types", "request.result"}
"""Client ops the runtime hands to the data service (plus every ``bulk.*``)."""

RETRYABLE_REASONS = {
    "conflict": "Conflict",
    "lock timeout": "LockTimeout",
    "deadlock": "Deadlock",
    "branch timeout": "LockTimeout",
    # The participant had no branch to prepare any more (it restarted, rolled it
    # back when this coordinator looked down, or idled it out): as for an op.
    "branch gone": "BranchRolledBack",
}
"""A participant's no vote (``dataplane.participant`` reasons, the machine's own branch timeout)
that makes an aborted commit worth replaying → the retryable error the client gets."""


def is_data_op(op: Any) -> bool:
    """True for the client ops the data service answers (data-path.md section 3)."""
    return isinstance(op, str) and (op in CLIENT_OPS or op.startswith("bulk."))


def is_data_message(payload: Any) -> bool:
    """True for peer messages of the data service (``t`` starts with ``data.``)."""
    if not isinstance(payload, dict):
        return False
    kind = payload.get("t")
    return isinstance(kind, str) and kind.startswith("data.")


@dataclass
class ServiceConfig:
    """Timeouts of the data path (seconds)."""

    branch_idle: float = 30.0
    """A participant's branch without an op for this long is rolled back (B8)."""
    lock_wait: float = 5.0
    """Lock-wait timeout of every branch: how distributed deadlocks end (B4, LockTimeout)."""
    rpc_timeout: float = 15.0
    """A peer that does not answer a data request this long is Unavailable (> lock_wait)."""
    commit_timeout: float = 30.0
    """A two-phase commit undecided this long: the client hears Unavailable (outcome unknown)."""
    sweep_every: float = 1.0
    result_window: int = DEFAULT_WINDOW


@dataclass(eq=False)
class Branch:
    """One node's part of a session: an async transaction and its bookkeeping."""

    id: str
    tx: AsyncTransaction
    last: float
    local: bool
    """The coordinator's own branch: it lives as long as its session, never idles out."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(eq=False)
class Session:
    """A client transaction coordinated by this node."""

    sid: int
    conn: Any
    iso: str
    state: str = "active"
    """active -> committing -> over."""
    remote: set[str] = field(default_factory=set)
    """Nodes where this session opened a branch."""
    dirty: set[str] = field(default_factory=set)
    """Nodes whose branch holds changes (creates, deletes, flushed writes, calls)."""
    pending: dict[str, dict[bytes, list[Any]]] = field(default_factory=dict)
    """Writes to remote objects not yet shipped: node -> ref -> write."""
    committed: set[str] = field(default_factory=set)
    """Nodes whose branch two-phase commit committed (theirs to end, not ours)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def bid_suffix(self) -> str:
        return str(self.sid)


class DataService:
    """The data path of one node (module doc); one per node process, on the runtime's loop."""

    def __init__(
        self,
        runtime: Any,
        db: Database,
        config: ServiceConfig | None = None,
    ) -> None:
        self.runtime = runtime
        self.db = db
        self.name: str = runtime.name
        self.config = config or ServiceConfig()
        self.sessions: dict[int, Session] = {}
        self._by_conn: dict[int, set[int]] = collections.defaultdict(set)
        # Branch ids "<node>.<sid>" must never repeat, also across restarts of this
        # node: participants remember ended branches, and a reused id would either be
        # refused or, worse, join a stale branch.  A random start per incarnation.
        self._next_sid = random.SystemRandom().randrange(1, 1 << 52)
        self.branches: dict[str, Branch] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._broken: collections.OrderedDict[int, str] = collections.OrderedDict()
        """Sessions rolled back because a node of theirs went down → why (for their next op)."""
        self._calls: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        # Random start too: a reply a peer queued for our previous incarnation must
        # not resolve a call of this one.
        self._call_ids = itertools.count(random.SystemRandom().randrange(1, 1 << 52))
        self._running: dict[tuple[str, int], asyncio.Future[dict[str, Any]]] = {}
        self._recent: collections.OrderedDict[tuple[str, int], dict[str, Any]] = (
            collections.OrderedDict()
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._locations: dict[int, str] = {}
        self._hints: collections.OrderedDict[tuple[str, Any], str] = collections.OrderedDict()
        """(type, packed unique key) → the node a cluster-scope get found it on last."""
        self.stats = collections.Counter[str]()

    # ================================================================ life
    def start(self) -> None:
        """Start the idle-branch sweeper and listen for peers going down."""
        self._sweeper = asyncio.ensure_future(self._sweep())
        add = getattr(self.runtime, "add_notifier", None)
        if add is not None:
            add("node_state", self._on_node_state)

    async def stop(self) -> None:
        """Roll every open branch back (the store is about to close)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._tasks):
            task.cancel()
        for name, (_, fut) in list(self._calls.items()):
            if not fut.done():
                fut.set_exception(errors.Unavailable("the node is stopping"))
            self._calls.pop(name, None)
        for br in list(self.branches.values()):
            if br.tx._state is _State.ACTIVE:
                await br.tx.rollback()
        self.branches.clear()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ============================================================ clients
    def on_client(self, conn: Any, client_id: Any, payload: dict[str, Any]) -> None:
        """A client request for the data service (called by the runtime on its loop)."""
        self.stats["client_ops"] += 1
        self._spawn(self._answer_client(conn, client_id, payload))

    async def _answer_client(self, conn: Any, client_id: Any, payload: dict[str, Any]) -> None:
        try:
            reply = await self._client_op(conn, payload)
        except errors.Error as exc:
            reply = error_out(exc)
        except Exception as exc:
            log.exception("data op %r failed", payload.get("op"))
            reply = error_out(exc)
        if conn.closed:
            return
        try:
            conn.send({"t": "rep", "id": client_id, "p": reply})
        except Exception as exc:  # a reply too large for a frame
            log.error("cannot send the reply to %r: %s", payload.get("op"), exc)
            conn.send({"t": "rep", "id": client_id, "p": error_out(errors.ProtocolError(str(exc)))})

    def connection_closed(self, conn: Any) -> None:
        """The client connection is gone: roll back its sessions, except committing ones (B8)."""
        for sid in self._by_conn.pop(id(conn), set()):
            session = self.sessions.get(sid)
            if session is not None and session.state == "active":
                self._spawn(self._close_session(session))

    async def _client_op(self, conn: Any, p: dict[str, Any]) -> dict[str, Any]:
        op = p.get("op")
        if op == "tx.begin":
            return self._begin(conn, p)
        if op in SESSION_OPS and p.get("s") is None and "begin" in p:
            # tx.begin folded into the session's first op: one round trip less.
            sid = self._begin(conn, {"iso": p.get("begin")})["s"]
            try:
                reply = await self._client_op(conn, {**p, "s": sid})
            except errors.Error as exc:
                reply = error_out(exc)
            reply["s"] = sid
            return reply
        if op in SESSION_OPS:
            session = self._session(conn, p.get("s"))
            if op == "tx.rollback":
                if session is not None:
                    await self._end_session(session)
                return {}
            if session is None or session.state != "active":
                if op == "tx.commit" and p.get("req") is not None:
                    # A commit retried after its reply was lost: the first outcome (H1).
                    first = await self._recorded_outcome(p.get("req"))
                    if first is not None:
                        return first
                self._closed(p.get("s"))
            async with session.lock:
                if session.state != "active":
                    self._closed(session.sid)
                try:
                    return await self._session_op(session, op, p)
                except (errors.Retryable, errors.Unavailable, errors.TransactionClosed):
                    # The branch that failed is doomed or gone: the whole transaction is
                    # over, and every other branch is released now (B8).
                    if session.state == "active":
                        await self._end_session(session)
                    raise
        if op == "nodes":
            return {"nodes": self.nodes()}
        if op == "types":
            return {"types": types_reply()}
        if op == "request.result":
            return await self._request_result(p.get("req"))
        if isinstance(op, str) and op.startswith("bulk."):
            return await self._bulk(op, p)
        raise errors.BadArgument(f"unknown op {op!r}")

    def _closed(self, sid: Any) -> NoReturn:
        """Refuse an op of a session that is over (Unavailable if a node of it died)."""
        broken = self._broken.get(sid)
        if broken is not None:
            raise errors.Unavailable(f"transaction rolled back: {broken}")
        raise errors.TransactionClosed(f"transaction {sid!r} is over")

    def _session(self, conn: Any, sid: Any) -> Session | None:
        if not isinstance(sid, int) or isinstance(sid, bool):
            raise errors.BadArgument(f"s must be a session id, not {sid!r:.40}")
        session = self.sessions.get(sid)
        if session is None or session.conn is not conn:
            return None
        return session

    def _begin(self, conn: Any, p: dict[str, Any]) -> dict[str, Any]:
        iso = p.get("iso") or "serializable"
        if iso not in STORE_ISOLATION:
            raise errors.BadArgument(
                f"iso must be 'serializable' or 'read_committed', not {iso!r:.40}"
            )
        self.db._check_open()
        sid = self._next_sid
        self._next_sid += 1
        self.sessions[sid] = Session(sid, conn, STORE_ISOLATION[iso])
        self._by_conn[id(conn)].add(sid)
        return {"s": sid}

    async def _session_op(self, s: Session, op: str, p: dict[str, Any]) -> dict[str, Any]:
        if op == "tx.commit":
            return await self._commit(s, p)
        w = p.get("w")
        if w:
            await self._take_writes(s, w)
        if op == "tx.get":
            return await self._get(s, p)
        if op == "tx.ref":
            ref = _ref(p.get("ref"))
            return await self._on(
                s, self._master(ref), "branch.ref", {"ref": ref, "lock": p.get("lock")}
            )
        if op == "tx.query":
            return await self._query(s, p)
        if op == "tx.count":
            return await self._count(s, p)
        if op == "tx.create":
            return await self._create(s, p)
        if op == "tx.delete":
            ref = _ref(p.get("ref"))
            node = self._master(ref)
            reply = await self._on(s, node, "branch.delete", {"ref": ref})
            s.dirty.add(node)
            return reply
        if op == "tx.call":
            return await self._call(s, p)
        if op == "tx.overwrite":
            return await self._overwrite(s, p)
        raise errors.BadArgument(f"unknown op {op!r}")

    async def _overwrite(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        """Swap a staged overwrite in on EVERY node of the cluster, in this session
        (data-path.md §6): the client's commit then makes it visible everywhere at
        once, or nowhere (two-phase commit).  A node down: Unavailable, nothing swapped.
        """
        check_type(p.get("type"), p.get("tv"))
        nodes = self.members()
        down = sorted(n for n in nodes if not self.is_up(n))
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
            reply = await self._on(s, node, "branch.overwrite", fields)
            s.dirty.add(node)
            deleted += int(reply.get("deleted", 0))
            inserted += int(reply.get("inserted", 0))
            replayed += bool(reply.get("replayed"))
        return {"deleted": deleted, "inserted": inserted, "replayed": replayed == len(nodes)}

    # -------------------------------------------------------- session ops
    async def _get(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        """Unique lookup, cluster scope: the local branch first, then every other up node.

        Looking for the key, a node locks only the object it finds (``if_found``):
        locking the key's absent slot on every node asked, in an order that depends
        on the coordinator (itself first, then the others at once), deadlocked two
        coordinators looking up one key: each held the absent slot the other wanted
        next while waiting for the object, until ``lock_wait`` (data-path.md §7).
        Only when the key is found nowhere are the absent slots locked, on every
        node of the scope one by one in name order (then lookups cannot deadlock).
        """
        check_type(p.get("type"), p.get("tv"))
        fields = {"type": p["type"], "tv": p.get("tv"), "key": p.get("key"), "lock": p.get("lock")}
        scope = p.get("scope", "cluster")
        # The query audits apply (a node that is down is not asked: skip_down), and
        # fail_if_down refuses while any node of the scope is down.
        nodes = self._audited(scope, p.get("audit", "skip_down"))
        if scope == "local":
            return await self._on(s, self.name, "branch.get", fields)
        probe = {**fields, "if_found": True}
        reply = await self._on(s, self.name, "branch.get", probe)
        if reply.get("o") is not None:
            return reply
        # "Not found" is only an answer once every node of the scope was asked: a key
        # absent from the nodes that are up may live on one that is down, and a
        # get_or_create believing it would create a second object with that key.
        skipped = sorted(set(self._scope_nodes(scope)) - set(nodes))
        others = [n for n in nodes if n != self.name]
        # Where this key was found last time is asked first, alone: a key's object
        # rarely moves, and one RPC instead of one per node is what makes repeated
        # cross-node transactions cheap.  Not found there: everybody else, as usual.
        hint_key = (p["type"], p.get("key"))
        hint = self._hints.get(hint_key)
        if hint is not None and hint != self.name and not self.is_up(hint):
            # Its object lives there: "not found" would be a lie.
            raise errors.Unavailable(f"the object lives on node {hint}, which is down")
        if hint in others:
            reply = await self._on(s, hint, "branch.get", probe)
            if reply.get("o") is not None:
                return reply
            others.remove(hint)
            del self._hints[hint_key]
        if others:
            replies = await asyncio.gather(
                *(self._on(s, n, "branch.get", probe) for n in others), return_exceptions=True
            )
            _raise_fatal(replies)
            failure: BaseException | None = None
            for node, r in zip(others, replies, strict=True):
                if isinstance(r, BaseException):
                    failure = failure or r
                elif r.get("o") is not None:
                    self._remember(hint_key, node)
                    return r
            if failure is not None:
                # An absent key on a node we could not ask is not known to be absent.
                raise failure
        if skipped:
            return _not_found(skipped)
        # Found nowhere: lock the absent slot everywhere (a get_or_create's "absent"
        # must stay true until commit), in name order; an object created meanwhile
        # is found and locked instead.
        for node in sorted(nodes):
            reply = await self._on(s, node, "branch.get", fields)
            if reply.get("o") is not None:
                if node != self.name:
                    self._remember(hint_key, node)
                return reply
        return _not_found(skipped)

    def _remember(self, hint_key: tuple[str, Any], node: str) -> None:
        self._hints[hint_key] = node
        while len(self._hints) > 100_000:
            self._hints.popitem(last=False)

    async def _create(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        check_type(p.get("type"), p.get("tv"))
        node = p.get("node") or self.name
        if not isinstance(node, str) or (node != self.name and node not in self.known_nodes()):
            raise errors.BadArgument(f"no node named {node!r:.40} in this cluster")
        fields = {"type": p["type"], "tv": p.get("tv"), "st": p.get("st")}
        reply = await self._on(s, node, "branch.create", fields)
        s.dirty.add(node)
        return reply

    async def _call(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        ref = _ref(p.get("ref"))
        node = self._master(ref)
        fields = {
            "ref": ref,
            "m": p.get("m"),
            "a": p.get("a"),
            "lock": p.get("lock"),
            # Any method may run on an object of the attached node; elsewhere only
            # the ones marked @nonstop.remote (C4).
            "ro": node != self.name,
        }
        reply = await self._on(s, node, "branch.call", fields)
        s.dirty.add(node)
        return reply

    async def _query(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        check_type(p.get("type"), p.get("tv"))
        nodes = self._audited(p.get("scope", "cluster"), p.get("audit", "skip_down"))
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
        results = await self._fan_out(s, nodes, "branch.query", fields, p.get("audit", "skip_down"))
        desc = False
        ordered = order is not None or rng is not None
        if order is not None:
            desc = bool(order[1]) if isinstance(order, list | tuple) and len(order) > 1 else False
        seen: set[bytes] = set()
        out: list[Any] = []
        if ordered:
            streams = [
                list(zip(r.get("k") or [], r.get("os") or [], strict=False)) for r in results
            ]
            key: Callable[[Any], Any] = lambda kv: (kv[0], kv[1][0])  # noqa: E731
            merged: Iterable[Any] = heapq.merge(*streams, key=key, reverse=desc)
            objs: Iterable[Any] = (o for _, o in merged)
        else:
            objs = (o for r in results for o in (r.get("os") or []))
        for o in objs:
            if o[0] in seen:
                continue
            seen.add(o[0])
            out.append(o)
            if limit is not None and len(out) >= limit:
                break
        return {"os": out}

    async def _count(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        check_type(p.get("type"), p.get("tv"))
        audit = p.get("audit", "skip_down")
        nodes = self._audited(p.get("scope", "cluster"), audit)
        fields = {"type": p["type"], "tv": p.get("tv")}
        results = await self._fan_out(s, nodes, "branch.count", fields, audit)
        return {"n": sum(int(r.get("n", 0)) for r in results)}

    async def _fan_out(
        self, s: Session, nodes: list[str], op: str, fields: dict[str, Any], audit: str
    ) -> list[dict[str, Any]]:
        """Run ``op`` on every node at once; a failed node is skipped only under at_least_one."""
        replies = await asyncio.gather(
            *(self._on(s, n, op, fields) for n in nodes), return_exceptions=True
        )
        _raise_fatal(replies)
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

    # ------------------------------------------------------------- scopes
    def _scope_nodes(self, scope: Any) -> list[str]:
        if scope == "local":
            return [self.name]
        if scope == "cluster" or scope is None:
            return self.members()
        if isinstance(scope, list) and scope and all(isinstance(n, str) for n in scope):
            known = set(self.known_nodes()) | {self.name}
            unknown = [n for n in scope if n not in known]
            if unknown:
                raise errors.BadArgument(f"unknown node(s) in the scope: {', '.join(unknown)}")
            return list(dict.fromkeys(scope))
        raise errors.BadArgument(
            f"scope must be 'local', 'cluster' or a list of node names, not {scope!r:.60}"
        )

    def _audited(self, scope: Any, audit: Any) -> list[str]:
        """The nodes a query runs on, after the scope audit (seed 000: query scope audits)."""
        if audit not in AUDITS:
            raise errors.BadArgument(f"audit must be one of {', '.join(AUDITS)}, not {audit!r:.40}")
        nodes = self._scope_nodes(scope)
        up = [n for n in nodes if self.is_up(n)]
        if audit == "fail_if_down" and len(up) != len(nodes):
            down = sorted(set(nodes) - set(up))
            raise errors.Unavailable(f"node(s) of the query scope are down: {', '.join(down)}")
        if not up:
            raise errors.Unavailable(f"no node of the query scope is up: {', '.join(nodes)}")
        return up

    # ------------------------------------------------------------ routing
    def _master(self, ref: bytes) -> str:
        location = location_of(ref)
        node = self._locations.get(location)
        if node is None or (node != self.name and self._peer_location(node) != location):
            self._refresh_locations()
            node = self._locations.get(location)
        if node is None:
            raise errors.BadArgument(f"no node of this cluster has location {location:016x}")
        return node

    def _peer_location(self, name: str) -> int | None:
        hello = self.runtime.peers.get(name)
        return None if hello is None else int(hello.location)

    def _refresh_locations(self) -> None:
        table = {int(h.location): n for n, h in self.runtime.peers.items()}
        table[int(self.runtime.hello.location)] = self.name
        table[int(self.db.location)] = self.name
        self._locations = table

    async def _take_writes(self, s: Session, writes: Any) -> None:
        """Deferred client writes: apply local ones now, keep remote ones for their node."""
        if not isinstance(writes, list):
            raise errors.BadArgument("w must be a list of writes")
        local: list[Any] = []
        for w in writes:
            ref, type_name, _, _ = write_in(w)
            check_type(type_name, None)
            node = self._master(ref)
            if node == self.name:
                local.append(w)
            else:
                _merge_write(s.pending.setdefault(node, {}), w)
        if local:
            br = self._local_branch(s)
            async with br.lock:
                await apply_writes(br.tx, local)
            s.dirty.add(self.name)

    async def _on(self, s: Session, node: str, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Run a branch op of ``s`` on ``node`` (here, or by RPC) with its pending writes."""
        pending = s.pending.pop(node, None)
        writes = list(pending.values()) if pending else None
        if node == self.name:
            br = self._local_branch(s)
            async with br.lock:
                if writes:
                    await apply_writes(br.tx, writes)
                return await execute(br.tx, op, fields)
        msg: dict[str, Any] = {"op": op, "b": f"{self.name}.{s.sid}", **fields}
        if node not in s.remote:
            msg["new"] = True
            msg["iso"] = s.iso
        if writes:
            msg["w"] = writes
            s.dirty.add(node)
        s.remote.add(node)  # from here on it may hold locks: end it with the session
        reply = await self.rpc(node, msg)
        if not isinstance(reply, dict):
            raise errors.ProtocolError(f"{node} answered {op} with {reply!r:.60}")
        if reply.pop("d", None):
            s.dirty.add(node)
        raise_error(reply)
        return reply

    def _local_branch(self, s: Session) -> Branch:
        bid = f"{self.name}.{s.sid}"
        br = self.branches.get(bid)
        if br is None:
            if s.state != "active" and s.state != "committing":
                raise errors.TransactionClosed(f"transaction {s.sid} is over")
            br = self._open_branch(bid, s.iso, local=True)
        return br

    def _open_branch(self, bid: str, iso: str, *, local: bool) -> Branch:
        self.db._check_open()
        tx = AsyncTransaction(self.db, Isolation(iso), self.config.lock_wait)
        br = Branch(bid, tx, time.monotonic(), local)
        self.branches[bid] = br
        return br

    # ============================================================== commit
    async def _commit(self, s: Session, p: dict[str, Any]) -> dict[str, Any]:
        """data-path.md section 5: nothing, one local group commit, or two-phase commit."""
        req = _parse_req(p.get("req"))
        if req is not None:
            # In memory only: a result already durable is found by the claim inside
            # the commit itself (_record), which saves a store read per commit.
            first = await self._recorded_outcome(list(req), durable=False)
            if first is not None:
                await self._end_session(s)
                return first
        s.state = "committing"
        future: asyncio.Future[dict[str, Any]] | None = None
        if req is not None:
            future = asyncio.get_running_loop().create_future()
            self._running[req] = future
        outcome: dict[str, Any] | None = None
        try:
            w = p.get("w")
            if w:
                await self._take_writes(s, w)
            outcome = await self._decide(s, req, future)
            return outcome
        except _AlreadyDone as done:
            # This request committed (or aborted) before, maybe before a restart:
            # roll this attempt back, answer the first outcome, record nothing.
            outcome = None
            return done.outcome
        except _Undecided as exc:
            raise errors.Unavailable(str(exc)) from None
        except Exception as exc:
            outcome = error_out(exc)
            raise
        finally:
            if s.state != "undecided":
                s.state = "over"
                await self._release(s)
                if req is not None and future is not None:
                    if outcome is None:  # _AlreadyDone: nothing new to record
                        self._running.pop(req, None)
                        future.cancel()
                    else:
                        self._spawn(self._settle_request(req, future, outcome))
            self._forget_session(s)

    async def _decide(
        self,
        s: Session,
        req: tuple[str, int] | None,
        future: asyncio.Future[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        writers = {n for n in s.pending if s.pending[n]} | s.dirty
        local = self.branches.get(f"{self.name}.{s.sid}")
        if local is not None and self.name not in writers and _has_changes(local.tx):
            writers.add(self.name)
        if not writers and req is None:
            return {"ok": True}
        if writers <= {self.name}:
            # One node wrote, and it is this one: one local group commit (with the
            # request's result, H1); the read-only branches elsewhere are released after.
            br = self._local_branch(s)
            async with br.lock:
                if req is not None:
                    await self._record(br.tx, req)
                self.branches.pop(br.id, None)
                await br.tx.commit()
            return {"ok": True}
        return await self._two_phase(s, writers, req, future)

    async def _two_phase(
        self,
        s: Session,
        writers: set[str],
        req: tuple[str, int] | None,
        future: asyncio.Future[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        bid = f"{self.name}.{s.sid}"
        down = sorted(n for n in writers if not self.is_up(n))
        if down:
            raise errors.Unavailable(f"node(s) {', '.join(down)} of the transaction are down")
        if getattr(self._cluster(), "quorum_state", None) == "Disabled":
            # The decision goes through the cluster log, which this node cannot
            # reach a quorum of (D16): fail now rather than at commit_timeout.
            raise errors.Unavailable(
                f"node {self.name} has no quorum: a distributed commit cannot be decided here"
            )
        for node in sorted(writers - s.remote - {self.name}):
            # Writes to a node this session never opened a branch on (the client
            # cached the object elsewhere): open it now, shipping them.
            await self._on(s, node, "branch.write", {})
        if req is not None:
            # The result rides in the coordinator's own branch, which then always
            # takes part: it commits exactly when the transaction does.
            br = self._local_branch(s)
            async with br.lock:
                await self._record(br.tx, req)
            writers = writers | {self.name}
        branches: dict[str, list[Any]] = {}
        for node in sorted(writers):
            ops: list[Any] = [["b", bid]]
            for write in (s.pending.pop(node, None) or {}).values():
                ops.append(["w", *write])
            branches[node] = ops
        self.stats["two_phase"] += 1
        submit = asyncio.ensure_future(self.runtime.submit({"op": "run", "branches": branches}))
        try:
            reply = await asyncio.wait_for(asyncio.shield(submit), self.config.commit_timeout)
        except TimeoutError:
            # Undecided (no quorum for the decision log?): the outcome is not known
            # yet.  The branches stay until it is; request.result says "running".
            s.state = "undecided"
            self._spawn(self._after_decision(s, submit, req, future))
            raise _Undecided(
                "the commit decision is not known yet; ask request.result later"
            ) from None
        outcome = map_run_reply(reply)
        if outcome.get("ok"):
            # Every branch of a committed transaction prepared: each is the resource
            # manager's now, so no branch.end is owed to them.
            s.committed = set(writers)
        if outcome.get("error") == "Aborted":
            down = sorted(n for n in writers if not self.is_up(n))
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

    async def _after_decision(
        self,
        s: Session,
        submit: asyncio.Future[Any],
        req: tuple[str, int] | None,
        future: asyncio.Future[dict[str, Any]] | None,
    ) -> None:
        outcome: dict[str, Any] | None = None
        try:
            outcome = map_run_reply(await submit)
        finally:
            s.state = "over"
            await self._release(s)
            if req is not None and future is not None:
                await self._settle_request(req, future, outcome)

    async def _record(self, tx: AsyncTransaction, req: tuple[str, int]) -> None:
        client, seq = req
        found = await tx._adrive(g_claim_request(tx, client, seq, self.config.result_window))
        if found is not None:
            raise _AlreadyDone(_outcome_of(found))
        await tx._adrive(g_record_result(tx, client, seq, True, None, self.config.result_window))

    async def _release(self, s: Session) -> None:
        """End every branch of ``s`` still open (B8).

        Branches that took part in two-phase commit are the resource manager's
        by now (:meth:`lookup_branch` took them out of the registry), so this
        releases exactly the read-only ones, and rolls back everything else.
        """
        bid = f"{self.name}.{s.sid}"
        br = self.branches.pop(bid, None)
        if br is not None:
            async with br.lock:
                if br.tx._state is _State.ACTIVE:
                    await br.tx.rollback()
        for node in sorted(s.remote - s.committed):
            self._spawn(self._end_remote(node, bid))
        s.remote.clear()

    async def _end_remote(self, node: str, bid: str) -> None:
        try:
            await self.rpc(node, {"op": "branch.end", "b": bid}, timeout=self.config.lock_wait)
        except errors.Error as exc:
            # It rolls back on its own after branch_idle (B8).
            log.debug("branch.end %s on %s: %s", bid, node, exc)

    async def _end_session(self, s: Session) -> None:
        """Roll the session back everywhere (B8): here now, remote branches by message."""
        if s.state != "active":
            return
        s.state = "over"
        s.pending.clear()
        self._forget_session(s)
        await self._release(s)

    async def _close_session(self, s: Session) -> None:
        async with s.lock:  # after the op in flight, if any
            await self._end_session(s)

    def _forget_session(self, s: Session) -> None:
        self.sessions.pop(s.sid, None)
        sids = self._by_conn.get(id(s.conn))
        if sids is not None:
            sids.discard(s.sid)
            if not sids:
                self._by_conn.pop(id(s.conn), None)

    # ----------------------------------------------------------------- H1
    async def _settle_request(
        self,
        req: tuple[str, int],
        future: asyncio.Future[dict[str, Any]],
        outcome: dict[str, Any] | None,
    ) -> None:
        """After a commit ends: record an abort's outcome too, then wake waiters."""
        try:
            if outcome is not None and "error" in outcome:
                await self._record_abort(req, outcome)
        except Exception as exc:
            log.warning("cannot record the outcome of request %s: %r", req, exc)
        finally:
            self._running.pop(req, None)
            final = outcome or {"error": "Error", "message": "no outcome"}
            # Phase two may not have reached this store yet: remember the outcome.
            self._recent[req] = final
            while len(self._recent) > 10_000:
                self._recent.popitem(last=False)
            if not future.done():
                future.set_result(final)

    async def _record_abort(self, req: tuple[str, int], outcome: dict[str, Any]) -> None:
        client, seq = req
        tx = AsyncTransaction(self.db, Isolation.SERIALIZABLE, self.config.lock_wait)
        try:
            found = await tx._adrive(g_claim_request(tx, client, seq, self.config.result_window))
            if found is None:
                value = [outcome.get("error"), outcome.get("message")]
                await tx._adrive(
                    g_record_result(tx, client, seq, False, value, self.config.result_window)
                )
                await tx.commit()
        finally:
            if tx._state is _State.ACTIVE:
                await tx.rollback()

    async def _recorded_outcome(self, req: Any, durable: bool = True) -> dict[str, Any] | None:
        """The first outcome of a commit request, if it ran here: a retry returns it (H1)."""
        key = _parse_req(req)
        if key is None:
            return None
        running = self._running.get(key)
        if running is not None:
            with contextlib.suppress(asyncio.CancelledError):
                # Cancelled: that attempt found the result already recorded; look it up.
                return await asyncio.shield(running)
        recent = self._recent.get(key)
        if recent is not None or not durable:
            return recent
        found = lookup_result(self.db, *key)
        return None if found is None else _outcome_of(found)

    async def _request_result(self, req: Any) -> dict[str, Any]:
        key = _parse_req(req)
        if key is None:
            raise errors.BadArgument("req must be [client id, seq]")
        if key in self._running:
            return {"state": "running", "result": None}
        recent = self._recent.get(key)
        if recent is not None:
            if "error" in recent:
                return {"state": "aborted", "result": [recent["error"], recent.get("message")]}
            return {"state": "committed", "result": None}
        found = lookup_result(self.db, *key)
        if found is not None:
            ok, value = found
            return {"state": "committed" if ok else "aborted", "result": value}
        if self.db.in_doubt():
            # A prepared branch here may still commit with this result in it.
            return {"state": "running", "result": None}
        return {"state": "unknown", "result": None}

    # ============================================================ branches
    def lookup_branch(self, branch_id: str) -> AsyncTransaction | None:
        """The resource manager takes a branch over for two-phase commit (data-path.md §5).

        From then on the branch is the resource manager's: it leaves this
        registry, so neither an idle timeout nor a ``branch.end`` can touch it.
        """
        br = self.branches.pop(branch_id, None)
        if br is None:
            return None
        if br.tx._state is not _State.ACTIVE:
            return None
        self._mark_ended(branch_id)
        return br.tx

    def _mark_ended(self, bid: str) -> None:
        self._ended[bid] = None
        while len(self._ended) > 100_000:
            self._ended.popitem(last=False)

    async def _sweep(self) -> None:
        """Roll back participants' branches idle for ``branch_idle`` (B8)."""
        while True:
            await asyncio.sleep(self.config.sweep_every)
            cutoff = time.monotonic() - self.config.branch_idle
            for br in list(self.branches.values()):
                if br.local or br.last > cutoff or br.lock.locked():
                    continue
                log.info("branch %s idle for %.0f s: rolled back", br.id, self.config.branch_idle)
                self.stats["idle_rollbacks"] += 1
                await self._end_branch(br.id)

    async def _end_branch(self, bid: str) -> None:
        br = self.branches.pop(bid, None)
        self._mark_ended(bid)
        if br is not None and br.tx._state is _State.ACTIVE:
            async with br.lock:
                if br.tx._state is _State.ACTIVE:
                    await br.tx.rollback()

    # ================================================================ peers
    def on_peer(self, sender: str, payload: dict[str, Any]) -> None:
        """A ``data.*`` message from a peer (called by the runtime on its loop)."""
        kind = payload.get("t")
        if kind == "data.rep":
            entry = self._calls.get(payload.get("id"))  # type: ignore[arg-type]
            if entry is not None and entry[0] == sender and not entry[1].done():
                entry[1].set_result(payload.get("p"))
        elif kind == "data.req":
            self._spawn(self._serve(sender, payload))
        else:
            log.warning("dropped data message %r from %s", kind, sender)

    async def _serve(self, sender: str, msg: dict[str, Any]) -> None:
        try:
            reply = await self._branch_op(sender, msg)
        except errors.Error as exc:
            reply = error_out(exc)
        except Exception as exc:
            log.exception("branch op %r from %s failed", msg.get("op"), sender)
            reply = error_out(exc)
        self.runtime.send(sender, {"t": "data.rep", "id": msg.get("id"), "p": reply})

    async def _branch_op(self, sender: str, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg.get("op")
        bid = msg.get("b")
        if not isinstance(bid, str) or not bid.startswith(sender + "."):
            raise errors.BadArgument(f"branch {bid!r:.40} is not one of {sender}'s")
        if op == "branch.end":
            await self._end_branch(bid)
            return {}
        br = self.branches.get(bid)
        if br is None:
            if not msg.get("new") or bid in self._ended:
                raise errors.BranchRolledBack(f"branch {bid} is over on {self.name}")
            iso = msg.get("iso") or "serializable"
            if iso not in ("serializable", "snapshot"):
                raise errors.BadArgument(f"bad isolation {iso!r:.40}")
            br = self._open_branch(bid, iso, local=False)
        async with br.lock:
            br.last = time.monotonic()
            if self.branches.get(bid) is not br:
                raise errors.BranchRolledBack(f"branch {bid} is over on {self.name}")
            try:
                w = msg.get("w")
                if w:
                    await apply_writes(br.tx, w)
                reply = await execute(br.tx, str(op), msg)
            except (errors.Retryable, errors.TransactionClosed):
                # Doomed: only rolling back is left; do it now, not at the idle timeout.
                self.branches.pop(bid, None)
                self._mark_ended(bid)
                if br.tx._state is _State.ACTIVE:
                    await br.tx.rollback()
                raise
            finally:
                br.last = time.monotonic()
            if op in _WRITING_OPS or w:
                reply["d"] = True
            return reply

    async def rpc(self, node: str, msg: dict[str, Any], timeout: float | None = None) -> Any:
        """One data request to ``node``; ``Unavailable`` if it is down or does not answer."""
        if not self.is_up(node):
            raise errors.Unavailable(f"node {node} is not up")
        loop = asyncio.get_running_loop()
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = loop.create_future()
        self._calls[call_id] = (node, fut)
        self.stats["rpc"] += 1
        try:
            self.runtime.send(node, {"t": "data.req", "id": call_id, **msg})
            return await asyncio.wait_for(fut, timeout or self.config.rpc_timeout)
        except TimeoutError:
            raise errors.Unavailable(f"node {node} did not answer {msg.get('op')}") from None
        finally:
            self._calls.pop(call_id, None)

    def _on_node_state(self, action: Any) -> None:
        """A peer left Up: its pending data requests fail now, not at their timeout (B8).

        Once it is Down, the branches it coordinates here (open, never prepared:
        prepared ones are the resource manager's) are rolled back at once rather
        than after ``branch_idle``: their locks are not held for a dead session.
        If it was only slow, its next op on such a branch gets BranchRolledBack (retryable).
        """
        data = action.data
        if data.get("new") == "Up":
            return
        peer = data.get("peer")
        for node, fut in list(self._calls.values()):
            if node == peer and not fut.done():
                fut.set_exception(errors.Unavailable(f"node {peer} is {data.get('new')}"))
        if data.get("new") == "Down" and isinstance(peer, str):
            for session in list(self.sessions.values()):
                if session.state == "active" and peer in session.remote:
                    # Its transaction cannot commit any more: release its other
                    # branches now; the client hears Unavailable at its next op.
                    self._broken[session.sid] = f"node {peer} of the transaction is down"
                    while len(self._broken) > 10_000:
                        self._broken.popitem(last=False)
                    self.stats["sessions_broken"] += 1
                    self._spawn(self._close_session(session))
            prefix = f"{peer}."
            for bid, br in list(self.branches.items()):
                if bid.startswith(prefix) and not br.local:
                    log.info("branch %s: its coordinator %s is down; rolled back", bid, peer)
                    self.stats["orphan_rollbacks"] += 1
                    self._mark_ended(bid)
                    self._spawn(self._end_branch(bid))

    # ============================================================ cluster view
    def _cluster(self) -> Any:
        machine = self.runtime.machine
        return getattr(machine, "cluster", machine)

    def is_up(self, name: str) -> bool:
        """Up per the failure detector (or, without one, connected)."""
        if name == self.name:
            return True
        detector = getattr(self._cluster(), "detector", None)
        if detector is not None:
            return str(detector.state_of(name)) == "Up"
        return bool(self.runtime.connected(name))

    def members(self) -> list[str]:
        """The cluster's nodes: the committed view's members (or every known node)."""
        members = list(getattr(self._cluster(), "view_members", None) or [])
        if not members:
            members = self.known_nodes()
        return [self.name, *sorted(n for n in members if n != self.name)]

    def known_nodes(self) -> list[str]:
        view = set(getattr(self._cluster(), "view_members", None) or [])
        return sorted(view | set(self.runtime.peers) | {self.name})

    def nodes(self) -> list[dict[str, Any]]:
        """The ``nodes`` reply: name, address, location and up for every known node."""
        out = [
            {
                "name": self.name,
                "address": self.runtime.hello.address,
                "location": int(self.runtime.hello.location),
                "up": True,
            }
        ]
        for name in self.known_nodes():
            if name == self.name:
                continue
            hello = self.runtime.peers.get(name)
            address = self.runtime.addresses.get(name, (hello.address if hello else "", 0))[0]
            out.append(
                {
                    "name": name,
                    "address": address,
                    "location": None if hello is None else int(hello.location),
                    "up": self.is_up(name),
                }
            )
        return out

    # ================================================================= bulk
    async def _bulk(self, op: str, p: dict[str, Any]) -> dict[str, Any]:
        try:
            from nonstop.bulk.handlers import HANDLERS, BulkContext
        except ImportError as exc:
            raise errors.BadArgument(f"bulk operations are not available: {exc}") from None
        handler = HANDLERS.get(op)
        if handler is None:
            raise errors.BadArgument(f"unknown bulk op {op!r}")
        loop = asyncio.get_running_loop()
        context = BulkContext(self.db, self.name)
        result = await loop.run_in_executor(None, handler, context, p)
        return result if isinstance(result, dict) else {"r": result}


def _outcome_of(found: tuple[bool, Any]) -> dict[str, Any]:
    """A recorded request result → the commit reply it stands for."""
    ok, value = found
    if ok:
        return {"ok": True}
    name, message = ([*value, None, None])[:2] if isinstance(value, list) else (None, value)
    return {"error": name or "Aborted", "message": message or "aborted"}


class _AlreadyDone(errors.Error):
    """The commit's request id already has a recorded outcome (H1)."""

    def __init__(self, outcome: dict[str, Any]) -> None:
        super().__init__("request already done")
        self.outcome = outcome


def _raise_fatal(replies: list[Any]) -> None:
    """Re-raise the first failure of a fan-out that is not a node being unreachable.

    A node that answered with an error (a lock timeout, a bad argument, ...) has
    a verdict on the op; only ``Unavailable`` nodes may be left out of a result.
    """
    for r in replies:
        if isinstance(r, BaseException) and not isinstance(r, errors.Unavailable):
            raise r


_WRITING_OPS = ("branch.create", "branch.delete", "branch.call", "branch.write", "branch.overwrite")
"""Branch ops that (may) write: the participant marks its reply dirty (``d``)."""


class _Undecided(errors.Unavailable):
    """The commit was handed to two-phase commit and is not decided yet."""


# ====================================================================== ops
def check_type(name: Any, tv: Any) -> TypeInfo:
    """The node's managed type ``name``; UnknownType / TypeVersionMismatch against ``tv``."""
    if not isinstance(name, str):
        raise errors.BadArgument(f"type must be a type name, not {name!r:.40}")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise errors.UnknownType(f"managed type {name!r} is not defined on this node")
    info = type_info(cls)
    if tv is not None and tv != info.version:
        raise errors.TypeVersionMismatch(
            f"{name}: the client has version {tv!r}, this node version {info.version}"
        )
    return info


def types_reply() -> dict[str, Any]:
    """Every managed type this process knows, with its version and schema."""
    out = {}
    for name, cls in sorted(_REGISTRY.items()):
        try:
            info = type_info(cls)
        except errors.Error:
            continue
        out[name] = {"version": info.version, "schema": info.schema()}
    return out


def obj_of(e: Entry) -> list[Any]:
    return obj_out(e.ref, e.info.name, e.version, e.state)


async def execute(tx: AsyncTransaction, op: str, p: dict[str, Any]) -> dict[str, Any]:
    """Run one branch op on ``tx`` (the coordinator's own branch or a participant's)."""
    if op == "branch.get":
        info = check_type(p.get("type"), p.get("tv"))
        key = _unpacked(p.get("key"), "key")
        if not isinstance(key, dict) or len(key) != 1:
            raise errors.BadArgument("key must be one unique key {field: value}")
        # A probe of a cluster-scope lookup: no lock on an absent key's slot
        # (DataService._get says why); the object, if found, is locked below.
        probe = p.get("if_found") and p.get("lock") != "none"
        if probe and await tx.find(info.cls, lock="none", **key) is None:
            return {"o": None}
        found = await tx.find(info.cls, lock=p.get("lock"), **key)
        return {"o": None if found is None else obj_of(found._e)}
    if op == "branch.ref":
        found = await tx.by_ref(Ref(_ref(p.get("ref"))), lock=p.get("lock"))
        return {"o": None if found is None else obj_of(found._e)}
    if op == "branch.query":
        return await _run_query(tx, p)
    if op == "branch.count":
        info = check_type(p.get("type"), p.get("tv"))
        return {"n": await tx.count(info.cls)}
    if op == "branch.create":
        info = check_type(p.get("type"), p.get("tv"))
        state = _unpacked(p.get("st"), "st")
        if not isinstance(state, dict):
            raise errors.BadArgument("st must be a packed {field: value}")
        obj = await tx.create(info.cls, **state)
        return {"o": obj_of(obj._e)}
    if op == "branch.delete":
        target = await tx.by_ref(Ref(_ref(p.get("ref"))), lock="write")
        if target is None:
            raise errors.NotFound("no object with this reference")
        await tx.delete(target)
        return {}
    if op == "branch.call":
        return await _run_call(tx, p)
    if op == "branch.write":
        return {}
    if op == "branch.overwrite":
        from nonstop.bulk.handlers import overwrite_branch

        return await overwrite_branch(tx, check_type(p.get("type"), p.get("tv")), p)
    raise errors.BadArgument(f"unknown branch op {op!r:.40}")


async def _run_query(tx: AsyncTransaction, p: dict[str, Any]) -> dict[str, Any]:
    info = check_type(p.get("type"), p.get("tv"))
    q = tx.query(info.cls)
    where = _unpacked(p.get("where"), "where") if p.get("where") is not None else {}
    if not isinstance(where, dict):
        raise errors.BadArgument("where must be a packed {field: value}")
    refs = {k: v for k, v in where.items() if isinstance(v, Ref)}
    q.where(**{k: v for k, v in where.items() if k not in refs})
    for name in refs:  # a reference as such: its object may live on another node
        q._field(name)
        q._eq[name] = refs[name]
    rng = p.get("range")
    if rng is not None:
        rng = _unpacked(rng, "range")
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
    if limit is not None:
        q.limit(limit)
    if p.get("lock") is not None:
        q.lock(p.get("lock"))
    found = await q.all()
    objs = [obj_of(h._e) for h in found]
    reply: dict[str, Any] = {"os": objs}
    if q._order is not None:
        fname = q._order[0]
        reply["k"] = [encode_key(h._e.state[fname]) for h in found]
    return reply


def _not_found(skipped: list[str]) -> dict[str, Any]:
    """The reply of a unique lookup that found nothing on every node it asked."""
    if skipped:
        raise errors.Unavailable(
            f"not found on the nodes that are up; node(s) {', '.join(skipped)} could not be asked"
        )
    return {"o": None}


def _remote_marked(fn: Any) -> bool:
    return bool(getattr(fn, "__nonstop_remote__", False))


async def _run_call(tx: AsyncTransaction, p: dict[str, Any]) -> dict[str, Any]:
    method = p.get("m")
    if not isinstance(method, str) or not method or method.startswith("_"):
        raise errors.BadArgument(f"not a method name: {method!r:.40}")
    lock = p.get("lock") or "write"
    target = await tx.by_ref(Ref(_ref(p.get("ref"))), lock=lock)
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
    a = _unpacked(p.get("a"), "a") if p.get("a") is not None else [[], {}]
    if not (isinstance(a, list) and len(a) == 2 and isinstance(a[1], dict)):
        raise errors.BadArgument("a must be a packed [args, kwargs]")
    result = getattr(target, method)(*a[0], **a[1])
    if asyncio.iscoroutine(result):
        result = await result
    if isinstance(result, Managed):
        result = Ref(result._e.ref)
    try:
        packed = pack(result)
    except (TypeError, ValueError) as exc:
        raise errors.BadArgument(f"the result of {method} cannot be sent: {exc}") from None
    objs = [obj_of(target._e)] if target._e.status < DELETED else []
    for e in list(tx._entries.values()):
        if e is not target._e and e.status != CLEAN and e.status < DELETED:
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
        e = tx._entries.get(ref)
        if e is None or e.lock < WRITE:
            handle = await tx.by_ref(Ref(ref), lock="write")
            e = None if handle is None else handle._e
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
            tx._write_field(e, name, value)


def _has_changes(tx: AsyncTransaction) -> bool:
    if tx._state is not _State.ACTIVE:
        return False
    if tx._raw_ops or tx._async_calls:
        return True
    return any(e.status != CLEAN for e in tx._entries.values())


def _merge_write(pending: dict[bytes, list[Any]], w: list[Any]) -> None:
    """Later writes of one object add to the earlier ones (same read version)."""
    ref = bytes(w[0])
    old = pending.get(ref)
    if old is None:
        pending[ref] = list(w)
        return
    changes = unpack(old[3])
    changes.update(unpack(w[3]))
    pending[ref] = [old[0], old[1], old[2], pack(changes)]


def map_run_reply(reply: Any) -> dict[str, Any]:
    """The decision machine's ``run`` reply → the client's commit reply (data-path.md §5)."""
    if isinstance(reply, dict) and reply.get("ok"):
        return {"ok": True}
    if not isinstance(reply, dict):
        return error_out(errors.Error(f"unexpected commit reply {reply!r:.80}"))
    error = reply.get("error")
    why = str(reply.get("why") or reply.get("message") or "the decision log decided abort")
    if error == "Unavailable":
        return {"error": "Unavailable", "message": f"transaction rolled back: {why}"}
    if error == "Aborted":
        # "<node> voted no: <reason>" (dtx.protocol); the reason names the class.
        reason = why.partition("voted no: ")[2].strip().lower()
        name = RETRYABLE_REASONS.get(reason, "Aborted")
        return {"error": name, "message": f"transaction rolled back: {why}"}
    return {"error": "Error", "message": f"commit failed: {error}: {why}"}


def _ref(value: Any) -> bytes:
    if isinstance(value, Ref):
        return value.raw
    if not isinstance(value, bytes) or len(value) != REF_SIZE:
        raise errors.BadArgument(f"ref must be {REF_SIZE} bytes, not {value!r:.40}")
    return value


def _unpacked(value: Any, what: str) -> Any:
    if not isinstance(value, bytes):
        raise errors.BadArgument(f"{what} must be packed bytes")
    try:
        return unpack(value)
    except Exception as exc:
        raise errors.BadArgument(f"{what} cannot be decoded: {exc}") from None


def _parse_req(req: Any) -> tuple[str, int] | None:
    if req is None:
        return None
    if (
        isinstance(req, list | tuple)
        and len(req) == 2
        and isinstance(req[0], str)
        and req[0]
        and "\x00" not in req[0]
        and isinstance(req[1], int)
        and not isinstance(req[1], bool)
        and req[1] >= 0
    ):
        return req[0], req[1]
    raise errors.BadArgument("req must be [client id, seq >= 0]")


__all__ = [
    "CLIENT_OPS",
    "DataService",
    "ServiceConfig",
    "apply_writes",
    "check_type",
    "execute",
    "is_data_message",
    "is_data_op",
    "map_run_reply",
    "types_reply",
]
