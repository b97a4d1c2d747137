"""Queries (A5, local scope): unique and non-unique lookups, ordered and range iteration, counts.

A query picks an access path — one index (equality, range or order on a key
field) or the type's extent — scans what is committed in one LMDB snapshot,
then overlays what this transaction itself created, changed or deleted, so a
transaction always sees its own writes.  Then it locks and loads the objects
in the query's lock mode (default: read under serializable, none under
snapshot).  The lock mode applies to the objects returned; as in the seed,
objects created by others after the scan (phantoms) are not locked out.
"""

from __future__ import annotations

import gc
import heapq
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from nonstop.errors import BadArgument
from nonstop.model.codec import encode_key
from nonstop.model.entry import CLEAN, DELETED
from nonstop.model.managed import KeyInfo, Managed, TypeInfo
from nonstop.model.ref import Ref
from nonstop.tx.entries import NONE, Entry, Op, parse_lock

if TYPE_CHECKING:
    import lmdb

    from nonstop.tx.transaction import Transaction

M = TypeVar("M", bound=Managed)

# Objects read per page when a query is iterated without locks (see Query.__iter__).
DEFAULT_PAGE_SIZE = 1000


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while materialising many objects.

    Bulk reads allocate an entry and a handle per object; with the collector on,
    its generation scans grow with the heap and cost more than the reading
    (measured: 63k vs 159k objects/s for 200k objects).  Finished transactions
    break their own reference cycles (see Transaction._finish), so nothing is
    left for the collector to find; it resumes right after.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def release_if_unheld(e: Any) -> None:
    """Free a forgotten entry's handle now if nobody holds it (paged queries).

    An entry and its handle point at each other: left alone, the pair waits for
    the cyclic GC's full collection, which on a growing heap comes late, so
    memory would grow with the pages read.  Nobody else holds the handle when
    only the entry's attribute and this call's argument count it.
    """
    if e.handle is not None and sys.getrefcount(e.handle) <= 2:
        e.handle = None


def query_field(info: TypeInfo, name: str) -> Any:
    """The field ``name`` of ``info`` a query names; BadArgument if there is none.

    Shared by embedded and remote queries, so both refuse the same queries alike.
    """
    f = info.fields.get(name)
    if f is None:
        raise BadArgument(f"{info.name} has no field {name!r}")
    return f


def ordered_key(info: TypeInfo, name: str) -> KeyInfo:
    """The ordered key an ordered or range query needs; BadArgument otherwise."""
    query_field(info, name)
    key = info.keys.get(name)
    if key is None or not key.options.ordered:
        what = "not a key" if key is None else "not an ordered key"
        raise BadArgument(
            f"{info.name}.{name} is {what}; ordered and range queries need "
            f"`{name}: ... = nonstop.key(ordered=True)`"
        )
    return key


class Query(Generic[M]):
    """A query builder; each method returns the query, ``all()`` / ``count()`` run it."""

    def __init__(self, tx: Transaction, info: TypeInfo) -> None:
        tx.enter_types(info)  # (a bulk swap's type gate, data-path.md §6.3)
        self._tx = tx
        self._info = info
        self._eq: dict[str, Any] = {}
        self._range: tuple[str, bytes | None, bytes | None, bool, bool] | None = None
        self._order: tuple[str, bool] | None = None
        self._lock: int | None = None
        self._limit: int | None = None
        self._page_size = DEFAULT_PAGE_SIZE
        self._after: tuple[bytes, bytes] | None = None
        self._filters: list[Callable[[Any], bool]] = []

    # ------------------------------------------------------------ building
    def where(self, **equal: Any) -> Query[M]:
        """Keep objects whose fields equal these values (a key field uses its index)."""
        for name, value in equal.items():
            f = self._field(name)
            value = f.check(self._info.name, value)
            self._eq[name] = Ref(value._e.ref) if isinstance(value, Managed) else value
        return self

    def where_ref(self, **refs: Ref) -> Query[M]:
        """Keep objects whose reference fields hold these references, taken as such:
        the objects they name may live on another node (the data plane's queries)."""
        for name, ref in refs.items():
            self._field(name)
            self._eq[name] = ref
        return self

    def range(
        self,
        field: str,
        lo: Any = None,
        hi: Any = None,
        *,
        inclusive: tuple[bool, bool] = (True, False),
    ) -> Query[M]:
        """Objects whose key ``field`` is in [lo, hi) (by default), in ascending key order.

        ``None`` leaves that end open; ``inclusive=(True, True)`` closes the high end.
        """
        key = self._key(field)
        f = self._info.fields[field]
        lo_b = None if lo is None else encode_key(f.check(self._info.name, lo))
        hi_b = None if hi is None else encode_key(f.check(self._info.name, hi))
        self._range = (key.field, lo_b, hi_b, inclusive[0], inclusive[1])
        if self._order is None:
            self._order = (field, False)
        return self

    def order_by(self, field: str, *, descending: bool = False) -> Query[M]:
        """Iterate in the order of key ``field`` (both directions)."""
        self._key(field)
        self._order = (field, descending)
        return self

    def lock(self, mode: str | None) -> Query[M]:
        """Lock mode for the returned objects: 'none', 'read' or 'write'."""
        self._lock = parse_lock(mode)
        return self

    def limit(self, n: int) -> Query[M]:
        if n < 0:
            raise BadArgument("limit must be >= 0")
        self._limit = n
        return self

    def page_size(self, n: int) -> Query[M]:
        """Objects read per page when the query is iterated (default 1000).

        Iterating reads page by page from one store snapshot; the objects of pages
        already passed are forgotten by the transaction unless they were locked or
        changed, so memory stays bounded by a page however many objects match.
        """
        if n < 1:
            raise BadArgument("page_size must be >= 1")
        self._page_size = n
        return self

    def after(self, position: tuple[bytes, bytes] | None) -> Query[M]:
        """Only results past ``position`` (a :meth:`position_of`): keyset paging.

        The data plane pages a cluster query with it: each node resumes after the
        last object the client received, so no node keeps a cursor between pages.
        Positions order results as the query does: by (order key, reference) when
        ordered, else by reference.
        """
        self._after = position
        return self

    def position_of(self, handle: M) -> tuple[bytes, bytes]:
        """Where a result stands in this query's order (what :meth:`after` takes)."""
        e: Entry = handle._e
        return self._position(e.state, e.ref)

    def filter(self, predicate: Callable[[M], bool]) -> Query[M]:
        """Keep objects for which ``predicate(obj)`` is true (evaluated after locking)."""
        self._filters.append(predicate)
        return self

    @property
    def ordering(self) -> tuple[str, bool] | None:
        """(key field, descending) when results come in key order, else None."""
        return self._order

    def _field(self, name: str) -> Any:
        return query_field(self._info, name)

    def _key(self, name: str) -> KeyInfo:
        return ordered_key(self._info, name)

    # ------------------------------------------------------------- running
    def all(self) -> list[M]:
        return self._tx.drive(self._g_run())  # type: ignore[no-any-return]

    def first(self) -> M | None:
        saved, self._limit = self._limit, 1
        try:
            found = self.all()
        finally:
            self._limit = saved
        return found[0] if found else None

    def count(self) -> int:
        """How many objects match (read committed plus this transaction's changes; no locks)."""
        key, path = self._access_key()
        simple = set(self._eq) <= ({key.field} if key is not None else set())
        # A range on another key than the access path's is checked only by loading.
        simple = simple and (self._range is None or path == "range")
        if self._filters or not simple:
            saved, self._lock = self._lock, NONE
            try:
                return len(self.all())
            finally:
                self._lock = saved
        return len(self._candidates())

    def __iter__(self) -> Iterator[M]:
        """Stream the results in pages when nothing needs locking, else run :meth:`all`.

        Streaming needs an unlocked read (snapshot isolation, or ``lock("none")``)
        in ascending or no order of committed objects only: a locking read keeps a
        lock per object anyway, and this transaction's own changes of the type (and
        a descending order) are sorted in memory, so those cases read everything first.
        """
        return self._stream() if self._streams() else iter(self.all())

    def _streams(self) -> bool:
        """Whether iterating can read page by page (see :meth:`__iter__`)."""
        tx = self._tx
        tx.check_usable()
        mode = tx.default_lock if self._lock is None else self._lock
        if mode != NONE or self._limit == 0:
            return False
        if self._order is not None:
            # In order only when the scan itself runs in that order, ascending.
            key, path = self._access_key()
            if self._order[1] or path != "range" or key is None or key.field != self._order[0]:
                return False
        cls = self._info.cls
        return not any(e.status != CLEAN and isinstance(e.handle, cls) for e in tx.entries())

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
        """The results as a ``pyarrow.Table``, one column per field, built page by page.

        References become their raw bytes.  Needs pyarrow (``pip install pyarrow``
        or ``nonstop[spark]``); no Spark.
        """
        from nonstop.tx.export import to_arrow

        return to_arrow(self._info, self.pages())

    def to_pandas(self) -> Any:
        """The results as a ``pandas.DataFrame`` (through :meth:`to_arrow`; needs pandas)."""
        from nonstop.tx.export import to_pandas

        return to_pandas(self._info, self.pages())

    def _stream(self) -> Iterator[M]:
        tx = self._tx
        store = tx.engine.store
        key, path = self._access_key()
        entries = tx.entry_map()
        scanned = set() if key is None else {key.field}
        check = bool(set(self._eq) - scanned) or (
            self._range is not None and self._range[0] not in scanned
        )
        limit = self._limit
        after = self._after
        produced = 0
        with tx.committed(NONE) as rtxn:  # lock-free: a snapshot transaction's view
            scan = self._scan(rtxn, key, path)
            while True:
                page: list[Entry] = []
                added: list[Entry] = []
                with gc_paused():  # not across the yields below: user code runs there
                    for _, ref in scan:
                        e = entries.get(ref)
                        if e is None:
                            raw = rtxn.get(ref, db=store.objects)
                            if raw is None:
                                continue
                            rec = store.record(raw, ref)
                            if key is not None and not self._type_ok(rec[0]):
                                continue
                            e = tx.entry_from_record(ref, rec, NONE)
                            added.append(e)
                        elif e.status >= DELETED:
                            continue
                        if check and not self._matches_index(e.state):
                            continue
                        if after is not None and self._position(e.state, ref) <= after:
                            continue
                        page.append(e)
                        if len(page) >= self._page_size:
                            break
                for e in page:
                    handle = e.handle
                    if self._filters and not all(p(handle) for p in self._filters):
                        continue
                    yield handle
                    produced += 1
                    if limit is not None and produced >= limit:
                        return
                handle = None
                full = len(page) >= self._page_size
                page.clear()
                # Forget what this page loaded and nobody locked or changed since.
                for e in added:
                    if e.status == CLEAN and e.lock == NONE and entries.get(e.ref) is e:
                        del entries[e.ref]
                        release_if_unheld(e)
                if not full:
                    return

    # ------------------------------------------------------------ internals
    def _access_key(self) -> tuple[KeyInfo | None, str]:
        info = self._info
        for name, value in self._eq.items():
            key = info.keys.get(name)
            if key is not None and key.options.unique and value is not None:
                return key, "eq"
        for name, value in self._eq.items():
            key = info.keys.get(name)
            # A unique index does not hold None: scan for that one instead.
            if key is not None and (value is not None or not key.options.unique):
                return key, "eq"
        if self._range is not None:
            return info.keys[self._range[0]], "range"
        if self._order is not None:
            return info.keys[self._order[0]], "range"
        return None, "extent"

    def _candidates(self) -> list[tuple[bytes, bytes, Any]]:
        """(sort key, ref, committed record or None) for everything that may match."""
        tx = self._tx
        store = tx.engine.store
        key, path = self._access_key()
        out: list[tuple[bytes, bytes, Any]] = []
        mine = {
            e.ref: e
            for e in tx.entries()
            if e.status != CLEAN and isinstance(e.handle, self._info.cls) and tx.in_scope(e.ref)
        }
        want_records = self._lock == NONE or (self._lock is None and tx.default_lock == NONE)
        mode = tx.default_lock if self._lock is None else self._lock
        with gc_paused(), tx.committed(mode) as rtxn:
            for sort_key, ref in self._scan(rtxn, key, path):
                if ref in mine:
                    continue
                rec = None
                if want_records or key is not None:
                    raw = rtxn.get(ref, db=store.objects)
                    if raw is None:
                        continue
                    rec = store.record(raw, ref)
                    if key is not None and not self._type_ok(rec[0]):
                        continue
                out.append((sort_key, ref, rec))
        for ref, e in mine.items():
            if e.status >= DELETED or not self._matches_index(e.state):
                continue
            out.append((self._sort_key(e.state, ref), ref, None))
        if self._order is not None:
            out.sort(key=lambda c: (c[0], c[1]), reverse=self._order[1])
        elif mine:
            out.sort(key=lambda c: c[1])
        return out

    def _type_ok(self, type_name: str) -> bool:
        if type_name == self._info.name:
            return True
        return issubclass(self._tx.engine.type_by_name(type_name).cls, self._info.cls)

    def _scan(
        self, rtxn: lmdb.Transaction, key: KeyInfo | None, path: str
    ) -> Iterator[tuple[bytes, bytes]]:
        """(sort key, ref) of what may match, in (sort key, ref) order where paging needs it:
        the extent in reference order across subtypes, an index in key order; only the
        objects of the transaction's scope (``tx.restrict_to``: each partition once)."""
        scan = self._scan_all(rtxn, key, path)
        scope = self._tx.scope
        if scope is None:
            return scan
        return ((sort_key, ref) for sort_key, ref in scan if ref[:8] in scope)

    def _scan_all(
        self, rtxn: lmdb.Transaction, key: KeyInfo | None, path: str
    ) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`_scan` without the scope."""
        store = self._tx.engine.store
        after = self._after
        if key is None:
            start = b"" if after is None or self._order is not None else after[1]
            extents = [
                self._scan_extent(rtxn, info.name.encode() + b"\x00", start)
                for info in self._info.concrete_types()
            ]
            yield from extents[0] if len(extents) == 1 else heapq.merge(*extents)
            return
        db = store.index_db(key.db_name, unique=key.options.unique)
        # Any: lmdb's stubs type reads as bytes | memoryview; our environments read bytes.
        cur: Any = rtxn.cursor(db=db)
        if path == "eq":
            kb = encode_key(self._eq[key.field])
            if key.options.unique:
                ref = cur.get(kb)
                if ref is not None:
                    yield kb, ref
            else:
                resume = after[1] if after is not None and self._order is None else None
                found = cur.set_key(kb) if resume is None else cur.set_range_dup(kb, resume)
                if found:
                    for ref in cur.iternext_dup():
                        yield kb, ref
            return
        lo = hi = None
        lo_inc = hi_inc = True
        if self._range is not None and self._range[0] == key.field:
            _, lo, hi, lo_inc, hi_inc = self._range
        if after is not None and self._order is not None and (lo is None or after[0] > lo):
            lo, lo_inc = after[0], True  # resume at the last page's key; the rest is skipped later
        positioned = cur.set_range(lo) if lo is not None else cur.first()
        if not positioned:
            return
        for kb, ref in cur.iternext():
            if lo is not None and not lo_inc and kb == lo:
                continue
            if hi is not None and (kb > hi or (kb == hi and not hi_inc)):
                break
            yield kb, ref

    def _scan_extent(
        self, rtxn: lmdb.Transaction, prefix: bytes, start: bytes
    ) -> Iterator[tuple[bytes, bytes]]:
        plen = len(prefix)
        cur = rtxn.cursor(db=self._tx.engine.store.extents)
        if not cur.set_range(prefix + start):
            return
        for ext in cur.iternext(keys=True, values=False):
            key = cast(bytes, ext)  # store.read(): bytes, not buffers
            if not key.startswith(prefix):
                break
            ref = key[plen:]
            yield ref, ref

    def _position(self, state: dict[str, Any], ref: bytes) -> tuple[bytes, bytes]:
        if self._order is not None:
            return encode_key(state[self._order[0]]), ref
        return ref, ref

    def _sort_key(self, state: dict[str, Any], ref: bytes) -> bytes:
        if self._order is not None:
            return encode_key(state[self._order[0]])
        return ref

    def _matches_index(self, state: dict[str, Any]) -> bool:
        for name, value in self._eq.items():
            if state[name] != value:
                return False
        if self._range is not None:
            name, lo, hi, lo_inc, hi_inc = self._range
            kb = encode_key(state[name])
            if lo is not None and (kb < lo or (kb == lo and not lo_inc)):
                return False
            if hi is not None and (kb > hi or (kb == hi and not hi_inc)):
                return False
        return True

    def _read_unlocked(self) -> list[Any]:
        """Lock-free read in one pass and one LMDB snapshot (the bulk/snapshot fast path).

        Nothing to wait for and no user code to run, so it scans, decodes and
        materialises in a tight loop with the cyclic GC paused.
        """
        tx = self._tx
        store = tx.engine.store
        key, path = self._access_key()
        cls = self._info.cls
        entries = tx.entry_map()
        mine = {
            ref: e
            for ref, e in entries.items()
            if e.status != CLEAN and isinstance(e.handle, cls) and tx.in_scope(ref)
        }
        # The scan itself enforces the access key's equality or range; check the
        # rest (equality on other fields, a range on another key) per object.
        scanned = set() if key is None else {key.field}
        check = bool(set(self._eq) - scanned) or (
            self._range is not None and self._range[0] not in scanned
        )
        ordered = self._order is not None or bool(mine)
        limit = self._limit
        after = self._after
        keyed: list[tuple[bytes, bytes, Any]] = []
        results: list[Any] = []
        make = tx.entry_from_record
        matches = self._matches_index
        # Objects whose stored type version and field count match their class take
        # the short way (no transparent upgrade needed); others go through make().
        current: dict[str, TypeInfo] = {t.name: t for t in self._info.concrete_types() if t.version}
        with gc_paused(), tx.committed(NONE) as rtxn:  # a snapshot transaction's view
            get = rtxn.get
            objects = store.objects
            for sort_key, ref in self._scan(rtxn, key, path):
                if ref in mine:
                    continue
                e = entries.get(ref)
                if e is None:
                    raw = get(ref, db=objects)
                    if raw is None:
                        continue
                    rec = store.record(raw, ref)
                    type_name, type_version, version, state = rec
                    info = current.get(type_name)
                    if info is None:
                        if key is not None and not self._type_ok(type_name):
                            continue
                        e = make(ref, rec, NONE)
                    elif type_version == info.version and len(state) == len(info.fields):
                        e = Entry(tx, ref, info, state, version, NONE, CLEAN)
                        entries[ref] = e
                    else:
                        e = make(ref, rec, NONE)
                if check and not matches(e.state):
                    continue
                if after is not None and self._position(e.state, ref) <= after:
                    continue
                if ordered:
                    keyed.append((sort_key, ref, e.handle))
                else:
                    results.append(e.handle)
                    if limit is not None and len(results) >= limit:
                        break
        if not ordered:
            return results
        for ref, e in mine.items():
            if after is not None and self._position(e.state, ref) <= after:
                continue
            if e.status < DELETED and matches(e.state):
                keyed.append((self._sort_key(e.state, ref), ref, e.handle))
        if self._order is not None:
            keyed.sort(key=lambda c: (c[0], c[1]), reverse=self._order[1])
        else:
            keyed.sort(key=lambda c: c[1])
        handles = [h for _, _, h in keyed]
        return handles if limit is None else handles[:limit]

    def _g_run(self) -> Op:
        tx = self._tx
        tx.check_usable()
        mode = tx.default_lock if self._lock is None else self._lock
        results: list[Any] = []
        limit = self._limit
        if limit == 0:
            return results
        if mode == NONE and not self._filters:
            return self._read_unlocked()
        candidates = self._candidates()
        for _, ref, rec in candidates:
            e: Entry | None = tx.entry(ref)
            if e is None and mode == NONE and rec is not None:
                e = tx.entry_from_record(ref, rec, NONE)
            else:
                e = yield from tx.g_load(ref, mode)
            if e is None or not isinstance(e.handle, self._info.cls):
                continue
            if not self._matches_index(e.state):
                continue  # changed between the scan and the lock
            if self._after is not None and self._position(e.state, ref) <= self._after:
                continue
            handle = e.handle
            if self._filters and not all(p(handle) for p in self._filters):
                continue
            results.append(handle)
            if limit is not None and len(results) >= limit:
                break
        return results
