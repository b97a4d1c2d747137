"""Remote transactions: the embedded transaction API, run on a cluster node over the network.

``cluster.transaction()`` (``cluster = nonstop.connect(...)``) returns a
:class:`RemoteTransaction`: the same methods as
:class:`nonstop.Transaction`, so one ``@nonstop.transactional`` function runs
unchanged against a :class:`~nonstop.Database` or a cluster.  The wire contract
is ``docs/design/data-path.md`` §2–3.

What a client sees:

* **Handles are real instances** of the managed class.  Reading a field reads
  the state the node returned with the object (no round trip); ``isinstance``,
  ``==``/``hash`` and plain methods work over that cached state.
* **Field writes are deferred (C5).**  They are checked locally at once (unknown
  field, wrong type, immutable key: the same errors as embedded, nothing sent)
  and buffered per object; the buffer travels as ``w`` with the next query,
  delete, remote call or the commit, so a transfer costs one round trip per
  lookup plus the commit.  A lock a write needs is taken on the node at that
  flush; take it with the lookup (``lock="write"``) to avoid deadlocks there.
* **One round trip per operation.**  The session begins with the first
  operation (``begin`` folded into it): a transfer is two lookups and a commit.
* **Methods marked** ``@nonstop.remote`` run on the object's master node
  (``tx.call``: pending writes flushed first, the resulting states copied back).
* **Errors** come back as the same :mod:`nonstop.errors` classes;
  ``Retryable`` ones (Deadlock, LockTimeout, Conflict) make ``@transactional``
  replay the function.  A lost connection before commit raises
  :class:`~nonstop.errors.TransactionLost` (B8; an ``Unavailable`` that is
  ``Retryable``): the node rolls the session back, so ``@transactional`` replays it.
* **Exactly-once commit (H1)**: see :meth:`RemoteTransaction.commit`.

The protocol logic (what to send, what a reply means) lives in
:class:`RemoteTransactionBase` as generators that yield request payloads and
receive replies, so the blocking and the asyncio flavours
(:mod:`nonstop.client.remote_async`) share it; they differ only in how they
wait for the network.  A transaction reaches the network only through its
client's session interface (:mod:`nonstop.client.session`: open, send, commit,
roll back), where fail-over and the exactly-once commit live, once for both
flavours.  A transaction is used by one thread or task at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from typing import Any, Generic, TypeVar

from nonstop.client.session import CommonSessions, Link, Request, Sessions
from nonstop.errors import (
    BadArgument,
    Deleted,
    FieldError,
    ImmutableKey,
    NotFound,
    ObjectNotInTransaction,
    Retryable,
    TransactionClosed,
    Unavailable,
)
from nonstop.model.codec import encode_key, pack, unpack
from nonstop.model.entry import CLEAN, CREATED, DELETED
from nonstop.model.managed import KeyInfo, Managed, TypeInfo, lookup_type, type_info
from nonstop.model.ref import Ref
from nonstop.model.wire import AUDITS, WIRE_ISOLATION, obj_in, raise_error, write_out
from nonstop.tx.entries import (
    NONE,
    READ,
    WRITE,
    TxState,
    describe_key,
    parse_lock,
    unique_lookup,
)
from nonstop.tx.query import DEFAULT_PAGE_SIZE, ordered_key, query_field, release_if_unheld

M = TypeVar("M", bound=Managed)

SCOPES = ("local", "cluster")
ISOLATIONS = WIRE_ISOLATION

Op = Generator[Request, Any, Any]
"""A protocol step: yields request payloads, receives each reply (errors already raised)."""


class RemoteEntry:
    """A remote transaction's view of one object: its cached state and pending writes."""

    __slots__ = ("changes", "handle", "info", "lock", "ref", "state", "status", "tx", "version")

    def __init__(
        self,
        tx: RemoteTransactionBase,
        ref: bytes,
        info: TypeInfo,
        state: dict[str, Any],
        version: int,
        lock: int,
        status: int,
    ) -> None:
        self.tx = tx
        self.ref = ref
        self.info = info
        self.state = state
        self.version = version  # the version the node read (0: created in this transaction)
        self.lock = lock
        self.status = status
        self.changes: dict[str, Any] = {}  # deferred writes not sent yet
        handle = info.cls.__new__(info.cls)
        object.__setattr__(handle, "_e", self)
        # Any: None once the transaction ended (see _ended), a live handle until then.
        self.handle: Any = handle


def check_scope(scope: Any) -> Any:
    if isinstance(scope, str):
        if scope not in SCOPES:
            raise BadArgument(
                f"scope must be 'local', 'cluster' or a list of node names: {scope!r}"
            )
        return scope
    if isinstance(scope, list | tuple) and scope and all(isinstance(n, str) for n in scope):
        return list(scope)
    raise BadArgument(f"scope must be 'local', 'cluster' or a list of node names, not {scope!r}")


def check_audit(audit: Any) -> str:
    if audit not in AUDITS:
        raise BadArgument(f"audit must be one of {', '.join(AUDITS)}, not {audit!r}")
    return str(audit)


def _lock_name(mode: str | None) -> str | None:
    parse_lock(mode)  # BadArgument for anything else
    return mode


class RemoteQueryBase(Generic[M]):
    """The query builder of a remote transaction (the embedded ``Query`` API plus scope/audit).

    ``where``/``range``/``order_by``/``lock``/``limit`` run on the nodes;
    ``filter`` predicates run here, over the returned handles.  The default
    scope is the whole cluster (``"cluster"``), each object once, with audit
    ``"skip_down"`` (nodes that are down are skipped).
    """

    def __init__(self, tx: RemoteTransactionBase, info: TypeInfo) -> None:
        self._tx = tx
        self._info = info
        self._eq: dict[str, Any] = {}
        self._range: list[Any] | None = None
        self._order: list[Any] | None = None
        self._lock: str | None = None
        self._limit: int | None = None
        self._filters: list[Callable[[Any], bool]] = []
        self._scope: Any = "cluster"
        self._audit = "skip_down"
        self._page_size = DEFAULT_PAGE_SIZE

    def where(self, **equal: Any) -> Any:
        """Keep objects whose fields equal these values."""
        for name, value in equal.items():
            f = self._field(name)
            value = f.check(self._info.name, value)
            self._eq[name] = Ref(value._e.ref) if isinstance(value, Managed) else value
        return self

    def range(
        self,
        field: str,
        lo: Any = None,
        hi: Any = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
    ) -> Any:
        """Objects whose ordered key ``field`` is in [lo, hi) (by default), in key order."""
        self._key(field)
        f = self._info.fields[field]
        lo = None if lo is None else f.check(self._info.name, lo)
        hi = None if hi is None else f.check(self._info.name, hi)
        for v in (lo, hi):
            if v is not None:
                encode_key(v)
        self._range = [field, lo, hi, bool(inclusive[0]), bool(inclusive[1])]
        if self._order is None:
            self._order = [field, False]
        return self

    def order_by(self, field: str, *, descending: bool = False) -> Any:
        """Iterate in the order of key ``field`` (merge-sorted across nodes)."""
        self._key(field)
        self._order = [field, bool(descending)]
        return self

    def lock(self, mode: str | None) -> Any:
        """Lock mode for the returned objects: 'none', 'read' or 'write'."""
        self._lock = _lock_name(mode)
        return self

    def limit(self, n: int) -> Any:
        if not isinstance(n, int) or n < 0:
            raise BadArgument("limit must be an int >= 0")
        self._limit = n
        return self

    def filter(self, predicate: Callable[[M], bool]) -> Any:
        """Keep objects for which ``predicate(obj)`` is true (evaluated on the client)."""
        self._filters.append(predicate)
        return self

    def page_size(self, n: int) -> Any:
        """Objects per page when the query is iterated (default 1000).

        Iterating an unlocked query (``lock("none")`` or a snapshot transaction)
        asks the cluster for one page at a time (the data plane's keyset paging)
        and forgets the unchanged objects of the pages passed, so it takes
        constant memory on the client and on the nodes, however many match.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadArgument("page_size must be an int >= 1")
        self._page_size = n
        return self

    def scope(self, scope: str | list[str]) -> Any:
        """Where to look: ``"local"`` (the attached node), ``"cluster"``, or node names."""
        self._scope = check_scope(scope)
        return self

    def audit(self, mode: str) -> Any:
        """``"at_least_one"``, ``"skip_down"`` (default) or ``"fail_if_down"``."""
        self._audit = check_audit(mode)
        return self

    def _field(self, name: str) -> Any:
        return query_field(self._info, name)

    def _key(self, name: str) -> KeyInfo:
        return ordered_key(self._info, name)

    def _payload(self, lock: str | None, limit: int | None) -> Request:
        return {
            "op": "tx.query",
            "type": self._info.name,
            "tv": self._info.version,
            "where": pack(self._eq),
            "range": None if self._range is None else pack(self._range),
            "order": self._order,
            "limit": None if self._filters else limit,
            "lock": lock,
            "scope": self._scope,
            "audit": self._audit,
        }

    def _streams(self) -> bool:
        """Whether iterating reads page by page: unlocked, ascending or unordered."""
        descending = self._order is not None and bool(self._order[1])
        return self._tx._lock_mode(self._lock) == NONE and not descending and self._limit != 0

    def _g_page(self, after: list[bytes] | None) -> Op:
        """One page: (handles, resume position, more may follow, entries it added)."""
        payload = self._payload("none", None)
        payload["page"] = self._page_size
        payload["after"] = after
        page = yield from self._tx._g_query_page(payload)
        return page

    def _g_all(self, lock: str | None = None, limit: Any = ...) -> Op:
        limit = self._limit if limit is ... else limit
        if limit == 0:
            return []
        found = yield from self._tx._g_query(
            self._payload(self._lock if lock is None else lock, limit), self._lock
        )
        if self._filters:
            found = [h for h in found if all(p(h) for p in self._filters)]
            if limit is not None:
                found = found[:limit]
        return found

    def _g_count(self) -> Op:
        if not (self._eq or self._range or self._filters):
            n = yield from self._tx._g_count(self._info, self._scope, self._audit)
            return n
        found = yield from self._g_all(lock="none", limit=None)
        return len(found)


class RemoteQuery(RemoteQueryBase[M]):
    """A remote query of a blocking transaction: ``all()``, ``first()``, ``count()``."""

    _tx: RemoteTransaction

    def all(self) -> list[M]:
        return self._tx._drive(self._g_all())  # type: ignore[no-any-return]

    def first(self) -> M | None:
        found = self._tx._drive(self._g_all(limit=1))
        return found[0] if found else None

    def count(self) -> int:
        """How many objects match in the scope (no locks)."""
        return self._tx._drive(self._g_count())  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[M]:
        """Page by page when unlocked (see :meth:`page_size`), else :meth:`all`."""
        if not self._streams():
            return iter(self.all())
        return self._stream()

    def pages(self) -> Iterator[list[M]]:
        """The results as lists of at most ``page_size`` objects (see :meth:`__iter__`)."""
        page: list[M] = []
        for obj in self:
            page.append(obj)
            if len(page) >= self._page_size:
                yield page
                page = []
        if page:
            yield page

    def to_arrow(self) -> Any:
        """The results as a ``pyarrow.Table`` (one column per field), read page by page.

        No Spark needed; pyarrow is (``pip install pyarrow``).
        """
        from nonstop.tx.export import to_arrow

        return to_arrow(self._info, self.pages())

    def to_pandas(self) -> Any:
        """The results as a ``pandas.DataFrame`` (through :meth:`to_arrow`)."""
        from nonstop.tx.export import to_pandas

        return to_pandas(self._info, self.pages())

    def _stream(self) -> Iterator[M]:
        after: list[bytes] | None = None
        produced = 0
        while True:
            handles, after, more, added = self._tx._drive(self._g_page(after))
            for h in handles:
                if self._filters and not all(p(h) for p in self._filters):
                    continue
                yield h
                produced += 1
                if self._limit is not None and produced >= self._limit:
                    return
            h = None  # hold nothing of the page: _forget frees what nobody else holds
            handles.clear()
            self._tx._forget(added)
            if not more:
                return


class RemoteTransactionBase:
    """The protocol logic shared by the blocking and asyncio remote transactions."""

    __nonstop_transaction__ = True  # @transactional joins it instead of starting another
    _is_async = False

    def __init__(self, sessions: CommonSessions, isolation: str = "serializable") -> None:
        if isolation not in ISOLATIONS:
            raise BadArgument(f"isolation must be 'serializable' or 'snapshot', not {isolation!r}")
        self.sessions = sessions
        self.isolation = isolation
        self._iso = ISOLATIONS[isolation]
        self._default_lock = READ if isolation == "serializable" else NONE
        self._state = TxState.ACTIVE
        self._doomed: BaseException | None = None
        self._entries: dict[bytes, RemoteEntry] = {}
        self._dirty: dict[bytes, RemoteEntry] = {}
        self._s: int | None = None  # the node's session id once begun
        self._wrote = False  # anything sent that changes data (create, delete, call, writes)
        # Asynchronous method calls (A6) not shipped yet: (handle, method, args, kwargs,
        # delay: a timer's, D20).
        self._queued_calls: list[
            tuple[Any, str, tuple[Any, ...], dict[str, Any], float | None]
        ] = []
        # Unique key value -> reference, for objects this transaction already holds:
        # looking one up again needs no round trip (see _cached).
        self._keyed: dict[tuple[str, str, bytes], bytes] = {}
        self._link: Link | None = None  # the connection the session lives on
        # A replay's age (set by @transactional): seconds since its first attempt began.
        # Its ``begin`` carries it, so the node ranks it from then in wound-wait (the
        # node bounds the claim; docs/design/deadlocks.md section 2b).
        self.replay_age: float | None = None

    # ----------------------------------------------------------- checks
    @property
    def active(self) -> bool:
        return self._state is TxState.ACTIVE

    @property
    def node(self) -> str | None:
        """The name of the node coordinating this transaction (None before the first op)."""
        hello = None if self._link is None else self._link.node
        return None if hello is None else hello.name

    def _check_usable(self) -> None:
        if self._state is not TxState.ACTIVE:
            raise TransactionClosed(f"remote transaction is {self._state.value}")
        if self._doomed is not None:
            raise self._doomed

    def _entry_of(self, obj: Any) -> RemoteEntry:
        if not isinstance(obj, Managed):
            raise BadArgument(f"expected a managed object, got {type(obj).__name__}")
        entry = obj._e
        if entry.tx is not self:
            raise ObjectNotInTransaction(
                f"{type(obj).__name__} object was obtained in another transaction; "
                "get it again in this one"
            )
        self._check_usable()
        self._adopt(entry)
        return entry  # type: ignore[no-any-return]

    def _type(self, cls: Any) -> TypeInfo:
        if isinstance(cls, str):
            return lookup_type(cls)
        return type_info(cls)

    # ------------------------------------------------------ field access
    def read_field(self, e: RemoteEntry, name: str) -> Any:
        if self._state is not TxState.ACTIVE:
            raise ObjectNotInTransaction(
                f"{e.info.name} object used outside its transaction (which is {self._state.value})"
            )
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object was deleted in this transaction")
        value = e.state[name]
        if value is not None and name in e.info.ref_fields:
            return self._deref(value)
        return value

    def _deref(self, ref: Ref) -> Any:
        """A reference field's value as a handle: the blocking and asyncio classes differ."""
        raise TypeError(f"{type(self).__name__} must define _deref")

    def write_field(self, e: RemoteEntry, name: str, value: Any) -> None:
        if self._state is not TxState.ACTIVE:
            raise ObjectNotInTransaction(
                f"{e.info.name} object used outside its transaction (which is {self._state.value})"
            )
        self._check_usable()
        self._adopt(e)
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object was deleted in this transaction")
        f = e.info.fields[name]
        value = f.check(e.info.name, value)
        if f.kind == "ref" and value is not None:
            value = Ref(self._entry_of(value).ref)
        if f.key is not None:
            if not f.key.mutable and e.status != CREATED:
                raise ImmutableKey(
                    f"{e.info.name}.{name} is an immutable key; it cannot change after create"
                )
            encode_key(value)  # KeyTooLong now, not at the flush
        elif f.kind in ("any", "list", "dict"):
            _check_storable(e.info.name, name, value)
        e.state[name] = value
        e.changes[name] = value
        self._dirty[e.ref] = e

    # -------------------------------------------------------- wire helpers
    def _writes(self) -> list[list[Any]]:
        return [
            write_out(e.ref, e.info.name, e.version, e.changes)
            for e in self._dirty.values()
            if e.changes
        ]

    def _flushed(self, sent: list[list[Any]]) -> None:
        """The node took the writes sent: forget them (later writes start a new buffer)."""
        if sent:
            self._wrote = True
        for w in sent:
            e = self._dirty.pop(w[0], None)
            if e is not None:
                e.changes = {}

    def _with_writes(self, payload: Request) -> tuple[Request, list[list[Any]]]:
        sent = self._writes()
        if sent:
            payload["w"] = sent
        return payload, sent

    def _intake(self, obj: Any, lock: int) -> RemoteEntry:
        """Cache an object a reply carried; the handle is the same for the same reference."""
        ref, type_name, version, state = obj_in(obj)
        e = self._entries.get(ref)
        if e is not None:
            if lock > e.lock:
                e.lock = lock
            if not e.changes and e.status < DELETED:
                # Nothing of ours pending on it: the node's state is the newer one.
                e.state = _complete(e.info, state)
                e.version = version
            return e
        info = lookup_type(type_name)
        e = RemoteEntry(self, ref, info, _complete(info, state), version, lock, CLEAN)
        self._entries[ref] = e
        return e

    def _lock_mode(self, lock: str | None) -> int:
        mode = parse_lock(lock)
        return self._default_lock if mode is None else int(mode)

    # ------------------------------------------------- protocol operations
    def _g_lookup(self, cls: Any, lock: str | None, key: dict[str, Any]) -> Op:
        info = self._type(cls)
        k, value = unique_lookup(info, key)
        name = k.field
        if isinstance(value, Managed):
            value = Ref(self._entry_of(value).ref)
        if value is None:
            return None  # unique keys do not index None
        slot = (info.name, name, encode_key(value))
        mode = self._lock_mode(lock)
        hit = self._cached(slot, name, value, mode)
        if hit is not None:
            return hit
        payload: Request = {
            "op": "tx.get",
            "type": info.name,
            "tv": info.version,
            "key": pack({name: value}),
            "lock": lock,
        }
        sent: list[list[Any]] = []
        if any(name in e.changes for e in self._dirty.values() if e.info.keys):
            # A pending change of a key: the node must see it to answer right.
            payload, sent = self._with_writes(payload)
        reply = yield payload
        self._flushed(sent)
        obj = reply.get("o")
        if obj is None:
            return None
        e = self._intake(obj, mode)
        if e.status >= DELETED:
            return None
        self._keyed[slot] = e.ref
        return e.handle

    def _cached(self, slot: tuple[str, str, bytes], name: str, value: Any, mode: int) -> Any:
        """The handle a unique lookup found before in this transaction, if still valid:
        not deleted, still holding that key value, and locked at least as asked (so
        nobody else can have moved or deleted it since)."""
        ref = self._keyed.get(slot)
        if ref is None:
            return None
        e = self._entries.get(ref)
        if e is None or e.status >= DELETED or e.state.get(name) != value:
            return None
        if e.lock < mode and e.status != CREATED:
            return None
        return e.handle

    def _g_by_ref(self, ref: Any, lock: str | None) -> Op:
        if not isinstance(ref, Ref):
            raise BadArgument(f"by_ref takes a Ref, not {type(ref).__name__}")
        mode = self._lock_mode(lock)
        e = self._entries.get(ref.raw)
        if e is not None and (e.lock >= mode or e.status == CREATED):
            return None if e.status >= DELETED else e.handle
        reply = yield {"op": "tx.ref", "ref": ref.raw, "lock": lock}
        obj = reply.get("o")
        if obj is None:
            return None
        e = self._intake(obj, mode)
        return None if e.status >= DELETED else e.handle

    def _g_lock(self, obj: Any, mode: str) -> Op:
        e = self._entry_of(obj)
        m = parse_lock(mode) or NONE
        if m <= e.lock or e.status == CREATED:
            return None
        reply = yield {"op": "tx.ref", "ref": e.ref, "lock": mode}
        if reply.get("o") is None:
            raise Deleted(f"{e.info.name} object no longer exists")
        self._intake(reply["o"], int(m))
        return None

    def _g_create(self, cls: Any, node: str | None, values: dict[str, Any]) -> Op:
        info = self._type(cls)
        fields = info.fields
        unknown = [n for n in values if n not in fields]
        if unknown:
            raise FieldError(f"{info.name} has no field(s) {', '.join(map(repr, unknown))}")
        missing = [f.name for f in info.required if f.name not in values]
        if missing:
            raise FieldError(f"{info.name} needs a value for {', '.join(map(repr, missing))}")
        if node is not None and not isinstance(node, str):
            raise BadArgument(f"node must be a node name, not {node!r}")
        state: dict[str, Any] = {}
        for name, f in fields.items():
            if name in values:
                v = f.check(info.name, values[name])
                if f.kind == "ref" and v is not None:
                    v = Ref(self._entry_of(v).ref)
                state[name] = v
            else:
                state[name] = f.make_default()
        for name in info.keys:
            encode_key(state[name])
        packed = _pack_state(info, state)
        payload: Request = {
            "op": "tx.create",
            "type": info.name,
            "tv": info.version,
            "st": packed,
            "node": node,
        }
        self._wrote = True
        reply = yield payload
        ref, _, version, node_state = obj_in(reply["o"])
        e = RemoteEntry(self, ref, info, _complete(info, node_state), version, WRITE, CREATED)
        self._entries[ref] = e
        for name, k in info.keys.items():
            if k.options.unique and e.state[name] is not None:
                self._keyed[(info.name, name, encode_key(e.state[name]))] = ref
        return e.handle

    def _g_delete(self, obj: Any) -> Op:
        e = self._entry_of(obj)
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object is already deleted")
        payload, sent = self._with_writes({"op": "tx.delete", "ref": e.ref})
        self._wrote = True
        yield payload
        self._flushed(sent)
        e.status = DELETED
        e.changes = {}
        self._dirty.pop(e.ref, None)
        return None

    def _g_count(self, info: TypeInfo, scope: Any, audit: str) -> Op:
        reply = yield {
            "op": "tx.count",
            "type": info.name,
            "tv": info.version,
            "scope": check_scope(scope),
            "audit": check_audit(audit),
        }
        return int(reply["n"])

    def _g_query(self, payload: Request, lock: str | None) -> Op:
        mode = self._lock_mode(lock)
        payload, sent = self._with_writes(payload)
        reply = yield payload
        self._flushed(sent)
        objects = list(reply.get("os") or [])
        more = reply.get("more")
        while more is not None:
            # A reply over the frame limit comes in pages (data-path.md §3, tx.more).
            page = yield {"op": "tx.more", "c": more}
            objects.extend(page.get("os") or [])
            more = page.get("more")
        out: list[Any] = []
        seen: set[bytes] = set()
        for obj in objects:
            e = self._intake(obj, mode)
            if e.ref in seen or e.status >= DELETED:
                continue  # each object once, even if two nodes answered for it
            seen.add(e.ref)
            out.append(e.handle)
        return out

    def _g_query_page(self, payload: Request) -> Op:
        """A paged query's request: its handles, where to resume, whether more may follow,
        and the entries it added (which :meth:`_forget` drops once the page is passed)."""
        payload, sent = self._with_writes(payload)
        reply = yield payload
        self._flushed(sent)
        objects = list(reply.get("os") or [])
        more = reply.get("more")
        while more is not None:  # a page over the frame limit is split too (tx.more)
            split = yield {"op": "tx.more", "c": more}
            objects.extend(split.get("os") or [])
            more = split.get("more")
        out: list[Any] = []
        added: list[RemoteEntry] = []
        for obj in objects:
            known = obj_in(obj)[0] in self._entries
            e = self._intake(obj, NONE)
            if not known:
                added.append(e)
            if e.status < DELETED:
                out.append(e.handle)
        after = reply.get("after")
        return out, after, bool(reply.get("rest")) and after is not None, added

    def _forget(self, entries: list[RemoteEntry]) -> None:
        """Drop the entries of a passed page nobody locked or changed (constant memory)."""
        for e in entries:
            if (
                e.status == CLEAN
                and e.lock == NONE
                and not e.changes
                and self._entries.get(e.ref) is e
            ):
                del self._entries[e.ref]
                release_if_unheld(e)

    def _adopt(self, e: RemoteEntry) -> None:
        """Take back an entry a paged query forgot, before it is used to change anything."""
        held = self._entries.get(e.ref)
        if held is e:
            return
        if held is None:
            self._entries[e.ref] = e
            return
        raise ObjectNotInTransaction(
            f"{e.info.name} object from an earlier page of a streamed query was loaded again "
            "since; use the object loaded last"
        )

    def _g_call(
        self,
        obj: Any,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None = None,
    ) -> Op:
        e = self._entry_of(obj)
        if e.status >= DELETED:
            raise Deleted(f"{e.info.name} object was deleted in this transaction")
        try:
            packed_args = pack([_refs_out(list(args)), _refs_out(kwargs)])
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadArgument(
                f"argument of remote {e.info.name}.{method} cannot be sent: {exc}"
            ) from None
        call: Request = {"op": "tx.call", "ref": e.ref, "m": method, "a": packed_args}
        if delay is not None:
            call["after"] = delay  # a timer (D20): queued on the master, due after delay
        payload, sent = self._with_writes(call)
        self._wrote = True  # a method may change anything
        reply = yield payload
        self._flushed(sent)
        for state in reply.get("os") or []:
            self._intake(state, WRITE)
        result = reply.get("r")
        return None if result is None else self._refs_in(unpack(result))

    def queue_async_call(
        self,
        entry: Any,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        delay: float | None = None,
    ) -> None:
        """An ``@asynchronous`` call on a remote object (A6): queued, shipped before the next op.

        Like a deferred write (C5) it leaves with the next op or the commit, as a
        ``tx.call`` of the asynchronous method on the object's master node, which
        queues it in its own branch: it runs there after the commit, exactly once,
        and not at all if the transaction rolls back.  With ``delay`` it is a timer
        (D20): the node queues it due ``delay`` seconds after it receives it.
        """
        self._check_usable()
        if entry.status >= DELETED:
            raise Deleted(f"{entry.info.name} object was deleted in this transaction")
        try:
            pack([_refs_out(list(args)), _refs_out(kwargs)])
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadArgument(
                f"argument of asynchronous {entry.info.name}.{method} cannot be sent: {exc}"
            ) from None
        self._queued_calls.append((entry.handle, method, args, kwargs, delay))

    def _refs_in(self, value: Any) -> Any:
        """Results of remote calls: references to objects this transaction holds become handles."""
        if isinstance(value, Ref):
            e = self._entries.get(value.raw)
            return value if e is None else e.handle
        if isinstance(value, list):
            return [self._refs_in(v) for v in value]
        if isinstance(value, dict):
            return {k: self._refs_in(v) for k, v in value.items()}
        return value

    def _first(self, payload: Request) -> Request:
        """The session's first op, which also begins it (``begin``: one round trip less)."""
        payload.pop("s", None)
        payload["begin"] = self._iso
        if self.replay_age is not None:
            payload["age"] = self.replay_age
        return payload

    def _took_session(self, link: Link, reply: Any) -> None:
        """Remember the session the node opened for the first op (also on an error reply)."""
        self._link = link
        s = reply.get("s") if isinstance(reply, dict) else None
        if isinstance(s, int) and not isinstance(s, bool):
            self._s = s

    def _commit_payload(self) -> tuple[Request, list[Any] | None]:
        """The commit request and its exactly-once id (None for a read-only transaction:
        nothing to apply twice, and the node then commits without writing anything)."""
        payload, sent = self._with_writes({"op": "tx.commit", "s": self._s})
        req = self.sessions.take_request_id() if sent or self._wrote else None
        payload["req"] = req
        if req is not None and sent:
            # The request's home (docs/design/requests.md): its record is kept with
            # the partition of this object, so any node can answer for it.
            payload["home"] = min(bytes(w[0]) for w in sent)
        return payload, req

    def _session_link(self) -> Link:
        """The link of the open session (set with the session id by the first op)."""
        if self._link is None:
            raise TransactionClosed("the transaction has no session")
        return self._link

    def _start_commit(self) -> tuple[Link, Request, list[Any] | None]:
        """The link, the commit request and its exactly-once id; the state says COMMITTING."""
        self._state = TxState.COMMITTING
        payload, req = self._commit_payload()
        return self._session_link(), payload, req

    def _commit_over(self, link: Link, req: list[Any] | None) -> None:
        """Whatever the outcome: the link may carry the next transaction (a lost one was
        closed: nothing to keep), and the request id's lane the next commit."""
        self.sessions.release(link)
        if req is not None:
            self.sessions.request_id_done(req)

    def _committed_without_session(self) -> bool:
        """True when no session was ever opened: nothing to commit, the transaction is
        committed at once (and its link, if it took one, released)."""
        if self._s is not None:
            return False
        self._ended(TxState.COMMITTED)
        if self._link is not None:
            self.sessions.release(self._link)
        return True

    @contextlib.contextmanager
    def _commit_outcome(self, link: Link, req: list[Any] | None) -> Iterator[None]:
        """Around the wait for the commit's reply: committed if it returns, rolled back if
        it raises (``Unavailable``: the outcome is unknown); then :meth:`_commit_over`."""
        try:
            yield
        except BaseException:
            self._ended(TxState.ROLLED_BACK)
            raise
        else:
            self._ended(TxState.COMMITTED)
        finally:
            self._commit_over(link, req)

    def _end_for_rollback(self) -> tuple[Link, int] | None:
        """Mark the transaction rolled back; the session the node must still roll back
        (None: nothing to send -- already over, or no session begun)."""
        if self._state not in (TxState.ACTIVE, TxState.COMMITTING):
            return None
        link, s = self._link, self._s
        self._ended(TxState.ROLLED_BACK)
        if link is None:
            return None
        if s is None:
            self.sessions.release(link)
            return None
        return link, s

    # ------------------------------------------------------------- endings
    def _ended(self, outcome: TxState) -> None:
        self._state = outcome
        # Break handle <-> entry cycles; kept handles still say their transaction is over.
        for e in self._entries.values():
            e.handle = None
        self._entries = {}
        self._dirty = {}
        self._keyed = {}

    def _absorb(self, exc: BaseException) -> None:
        """A failed request: retryable errors and lost connections doom the transaction."""
        if isinstance(exc, Retryable | Unavailable):
            self._doomed = exc

    def ref(self, obj: Managed) -> Ref:
        """The object's reference (C1)."""
        return Ref(self._entry_of(obj).ref)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.isolation} {self._state.value} s={self._s}>"


class RemoteTransaction(RemoteTransactionBase):
    """A blocking transaction run on a cluster node; see the module docstring.

    Obtain one with ``cluster.transaction()`` or through ``@nonstop.transactional``.
    """

    sessions: Sessions

    def __init__(self, sessions: Sessions, isolation: str = "serializable") -> None:
        super().__init__(sessions, isolation)

    # ----------------------------------------------------------- driving
    def _drive(self, op: Op) -> Any:
        self._check_usable()
        self._ship_queued_calls()
        return self._drive_one(op)

    def _ship_queued_calls(self) -> None:
        """Asynchronous method calls go before the op that follows them (see queue_async_call)."""
        while self._queued_calls:
            handle, method, args, kwargs, delay = self._queued_calls.pop(0)
            self._drive_one(self._g_call(handle, method, args, kwargs, delay))

    def _drive_one(self, op: Op) -> Any:
        try:
            payload = next(op)
            while True:
                reply = self._send(payload)
                payload = op.send(reply)
        except StopIteration as stop:
            return stop.value

    def _send(self, payload: Request) -> Any:
        try:
            if self._s is None:
                link, reply = self.sessions.open(self._first(payload))
                self._took_session(link, reply)
            else:
                payload["s"] = self._s
                reply = self.sessions.send(self._session_link(), payload)
            return raise_error(reply)
        except BaseException as exc:
            self._absorb(exc)
            raise

    def _deref(self, ref: Ref) -> Any:
        return self._drive(self._g_by_ref(ref, None))

    def remote_call(
        self, obj: Managed, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return self._drive(self._g_call(obj, method, args, kwargs))

    # --------------------------------------------------------------- API
    def create(self, cls: type[M], /, *, node: str | None = None, **values: Any) -> M:
        """Create an object, mastered on ``node`` (default: the attached node).

        DuplicateKey (nothing written) if a unique key is taken; BadArgument for an
        unknown node name.
        """
        return self._drive(self._g_create(cls, node, values))  # type: ignore[no-any-return]

    def find(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M | None:
        """Unique lookup by one unique key anywhere in the cluster; None if absent."""
        return self._drive(self._g_lookup(cls, lock, key))  # type: ignore[no-any-return]

    def get(self, cls: type[M], /, *, lock: str | None = None, **key: Any) -> M:
        """Like :meth:`find` but raises NotFound when there is no such object."""
        obj = self.find(cls, lock=lock, **key)
        if obj is None:
            raise NotFound(f"no {getattr(cls, '__name__', cls)} with {describe_key(key)}")
        return obj

    def get_or_create(
        self,
        cls: type[M],
        /,
        *,
        defaults: dict[str, Any] | None = None,
        node: str | None = None,
        **key: Any,
    ) -> tuple[M, bool]:
        """Select-or-create under a write lock on the key: returns (object, created)."""
        found = self.find(cls, lock="write", **key)
        if found is not None:
            return found, False
        return self.create(cls, node=node, **{**(defaults or {}), **key}), True

    def by_ref(self, ref: Ref, /, *, lock: str | None = None) -> Managed | None:
        """The object with this reference, or None if it does not exist."""
        return self._drive(self._g_by_ref(ref, lock))  # type: ignore[no-any-return]

    def lock(self, obj: Managed, mode: str = "write") -> None:
        """Take a lock on the object's master node now."""
        self._drive(self._g_lock(obj, mode))

    def delete(self, obj: Managed) -> None:
        """Delete the object (its delete trigger runs on its master node)."""
        self._drive(self._g_delete(obj))

    def count(
        self, cls: type[Managed], /, *, scope: str | list[str] = "cluster", audit: str = "skip_down"
    ) -> int:
        """Cardinality of the type's extent in ``scope`` (A2), with this transaction's changes."""
        self._check_usable()
        return self._drive(self._g_count(self._type(cls), scope, audit))  # type: ignore[no-any-return]

    def extent(
        self,
        cls: type[M],
        /,
        *,
        lock: str | None = None,
        scope: str | list[str] = "cluster",
        audit: str = "skip_down",
    ) -> list[M]:
        """Every object of the type and its subtypes in ``scope``, each once."""
        return self.query(cls).lock(lock).scope(scope).audit(audit).all()  # type: ignore[no-any-return]

    def query(self, cls: type[M], /) -> RemoteQuery[M]:
        """Start a query: ``tx.query(Account).range("owner", "a", "m").scope("cluster").all()``."""
        self._check_usable()
        return RemoteQuery(self, self._type(cls))

    def commit(self) -> None:
        """Send the deferred writes and commit; returns once the outcome is durable.

        Exactly once (H1): the commit carries ``(client id, sequence number)``.
        If its reply is lost (timeout, connection reset), the client reconnects to
        the same node and asks for the recorded outcome (``request.result``,
        waiting while it is still running) instead of committing again; it returns
        or raises the first outcome.  If that node cannot be reached, the outcome
        is unknown: :class:`~nonstop.errors.Unavailable` is raised and the
        transaction may or may not have committed — the application must check
        (for example by a unique key the transaction created).
        """
        self._check_usable_or_rollback()
        if self._queued_calls:
            try:
                self._ship_queued_calls()
            except BaseException:
                self.rollback()
                raise
        if self._committed_without_session():
            return
        link, payload, req = self._start_commit()
        with self._commit_outcome(link, req):
            self.sessions.commit(link, payload, req)

    def _check_usable_or_rollback(self) -> None:
        try:
            self._check_usable()
        except TransactionClosed:
            raise
        except BaseException:
            self.rollback()
            raise

    def rollback(self) -> None:
        """Drop every change; the node releases every lock (B5).  Safe to call twice."""
        session = self._end_for_rollback()
        if session is not None:
            self.sessions.rollback(*session)

    # ---------------------------------------------------------- context
    def __enter__(self) -> RemoteTransaction:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            if self._state is TxState.ACTIVE:
                self.commit()
        else:
            self.rollback()


# ---------------------------------------------------------------- helpers
def _complete(info: TypeInfo, state: dict[str, Any]) -> dict[str, Any]:
    """A state with exactly the client's fields (defaults for fields the node lacks)."""
    fields = info.fields
    if len(state) == len(fields) and all(n in state for n in fields):
        return state
    return {n: state[n] if n in state else f.make_default() for n, f in fields.items()}


def _pack_state(info: TypeInfo, state: dict[str, Any]) -> bytes:
    try:
        return pack(state)
    except (TypeError, ValueError, OverflowError):
        for name, value in state.items():
            _check_storable(info.name, name, value)
        raise


def _check_storable(type_name: str, name: str, value: Any) -> None:
    try:
        pack(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FieldError(f"{type_name}.{name} cannot be stored: {exc}") from None


def _refs_out(value: Any) -> Any:
    """Managed handles in remote-call arguments travel as references."""
    if isinstance(value, Managed):
        return Ref(value._e.ref)
    if isinstance(value, tuple | list):
        return [_refs_out(v) for v in value]
    if isinstance(value, dict):
        return {k: _refs_out(v) for k, v in value.items()}
    return value


__all__ = [
    "RemoteEntry",
    "RemoteQuery",
    "RemoteQueryBase",
    "RemoteTransaction",
    "RemoteTransactionBase",
]
