"""Bulk operations for the Spark pipeline (data-path.md §6): node side, blocking.

The node's data service runs ``HANDLERS[op](BulkContext(db, node), payload)``
in a worker thread and replies with the return value; an exception becomes an
error reply.  Every handler also works in-process against ``nonstop.open(path)``.

Columns travel in one of two formats (``format`` in the payload):

* ``"arrow"`` (what Spark uses): an Arrow IPC stream of one record batch.  The
  node decodes each object once (msgpack, C) into Python column lists and
  ``pyarrow`` turns each list into a column in C; the Spark side hands the
  batch to Spark as is, so no per-row Python work happens on the reading side
  at all — the fastest end to end, since Spark's Python data source turns
  tuples into Arrow itself otherwise.
* ``"columns"``: ``codec.pack({field: [values]})`` — no pyarrow needed, every
  field kind (lists, dicts, ``Any``) survives; for Python clients.

Arrow column types: bool, int64, float64, string, binary,
``timestamp[us, UTC]`` (naive datetimes are taken as UTC), date32,
``decimal128(38, 18)``, references as their text form ``"<loc>-<ts>-<n>"``.
Lists, dicts and ``Any`` have no Arrow form here: selecting them with the
arrow format is a :class:`~nonstop.errors.SchemaError` naming the field.

Writes go through ordinary serializable transactions (locks, unique-key
claims, indexes, triggers), so bulk loads and online transactions see each
other exactly as two transactions do; for plain types an upsert builds its
write set without a transaction entry per row (:mod:`nonstop.bulk.fast`).
Bookkeeping lives in the store's ``bulk`` database, written in the same
commit as the data it describes:

=====================  =============================================
key                    value
=====================  =============================================
``t/<tag>``            an applied upsert batch (a replay is skipped)
``s/<stream>``         last committed micro-batch id of a stream sink
``j/<job>``            a staged overwrite: its type
``o/<job>/<tag>``      one staged part of an overwrite (packed columns)
``d/<job>``            a committed overwrite's result (commit is idempotent)
``p/<job>``            a committed bounded swap not fully applied yet, and how far
``k/<job>/<key>``      a bounded swap's scratch: the key values checked so far
=====================  =============================================
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as _dt
import difflib
import heapq
import itertools
import math
import secrets
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from nonstop.bulk import fast as bulk_fast
from nonstop.bulk import fast_swap, swap_apply
from nonstop.bulk import records as bulk_records
from nonstop.bulk.keys import encode_keys
from nonstop.errors import (
    BadArgument,
    DuplicateKey,
    Error,
    FieldError,
    Retryable,
    SchemaError,
    TooManyRetries,
    TypeVersionMismatch,
    UnknownType,
)
from nonstop.model.codec import encode_key, pack, unpack
from nonstop.model.managed import KeyInfo, TypeInfo, registered_types
from nonstop.model.ref import REF_SIZE, Ref
from nonstop.store.group_commit import WriteSet
from nonstop.tx import gc_hold
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.tx.async_transaction import AsyncTransaction
    from nonstop.tx.database import Database
    from nonstop.tx.transaction import Transaction

FORMATS = ("arrow", "columns")
ROWS_PER_RANGE = 50_000
"""Largest range ``bulk.plan`` hands out: one scan of it fits a frame and one snapshot."""
REF_COLUMN = "_ref"
"""Pseudo-field: the object's reference as text (read-only)."""
ARROW_KINDS = frozenset(
    {"bool", "int", "float", "str", "bytes", "datetime", "date", "decimal", "ref"}
)
DECIMAL_PRECISION, DECIMAL_SCALE = 38, 18
FILTER_OPS = ("eq", "lt", "le", "gt", "ge", "in")
RETRIES = 20
_MISSING: Any = object()


@dataclass(slots=True)
class BulkContext:
    """What a bulk handler runs against: the node's open database and its name."""

    db: Database
    node: str = ""
    placement: Any = None
    """The data plane's ``Placement`` under routing by partition (None: by node): the
    unreplicated writes refuse then, and ``bulk.route`` maps with it."""


# ------------------------------------------------------------------ helpers
def _refuse_under_partitions(ctx: BulkContext, what: str) -> None:
    """These writes commit store transactions of their own, in the node's own location,
    without replication: under routing by partition they are refused (data-path.md §6.5)."""
    if ctx.placement is not None:
        from nonstop.bulk.partitioned import refusal

        raise BadArgument(refusal(what))


def _bulk_db(db: Database) -> Any:
    return swap_apply.bulk_db(db.engine.store)


def bulk_type(ctx: BulkContext, payload: dict[str, Any]) -> TypeInfo:
    name = payload.get("type")
    if not isinstance(name, str) or not name:
        raise BadArgument("a bulk operation needs 'type': the managed type's name")
    swap_apply.resume(ctx.db)  # (once per store: swaps a restart interrupted)
    try:
        info = ctx.db.engine.type_by_name(name)
    except UnknownType:
        raise UnknownType(unknown_type_message(name, ctx.node or str(ctx.db.path))) from None
    tv = payload.get("tv")
    if tv is not None and tv != info.version:
        raise TypeVersionMismatch(
            f"{name}: the client has version {tv}, node {ctx.node or ctx.db.path!r} has "
            f"version {info.version}"
        )
    return info


def unknown_type_message(name: str, node: str) -> str:
    """What a client (Spark's side) needs when a node does not know a type: that the
    nodes lack it (not the client), which types they know, and the closest name."""
    known = sorted(registered_types())
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"; closest: {close[0]!r}" if close else ""
    shown = ", ".join(known[:20]) + (f" and {len(known) - 20} more" if len(known) > 20 else "")
    return (
        f"node {node} does not know the managed type {name!r} (no application module "
        f"of the nodes defines it){hint}; known types: {shown or 'none'}"
    )


def _fields(info: TypeInfo, wanted: Any, fmt: str) -> list[str]:
    if wanted is None:
        names = list(info.fields)
    elif isinstance(wanted, list | tuple) and all(isinstance(f, str) for f in wanted):
        names = list(wanted)
    else:
        raise BadArgument("'fields' must be a list of field names")
    unknown = [n for n in names if n not in info.fields and n != REF_COLUMN]
    if unknown:
        raise FieldError(
            f"{info.name} has no field(s) {', '.join(map(repr, unknown))} "
            f"(fields: {', '.join(info.fields)})"
        )
    if fmt == "arrow":
        for n in names:
            if n != REF_COLUMN and info.fields[n].kind not in ARROW_KINDS:
                raise SchemaError(
                    f"{info.name}.{n} is a {info.fields[n].kind} field, which has no Arrow/Spark "
                    "column type; leave it out (Spark option 'exclude') or use format 'columns'"
                )
    return names


def batch_format(payload: dict[str, Any]) -> str:
    fmt = payload.get("format", "columns")
    if fmt not in FORMATS:
        raise BadArgument(f"format must be one of {FORMATS}, not {fmt!r}")
    return str(fmt)


def _ref_arg(value: Any, what: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes) and len(value) == REF_SIZE:
        return value
    raise BadArgument(f"'{what}' must be a {REF_SIZE}-byte reference or None")


# ------------------------------------------------------------- arrow columns
def arrow_type(kind: str) -> Any:
    """The Arrow type of a field kind (see the module docstring)."""
    import pyarrow as pa

    return {
        "bool": pa.bool_(),
        "int": pa.int64(),
        "float": pa.float64(),
        "str": pa.string(),
        "bytes": pa.binary(),
        "datetime": pa.timestamp("us", tz="UTC"),
        "date": pa.date32(),
        "decimal": pa.decimal128(DECIMAL_PRECISION, DECIMAL_SCALE),
        "ref": pa.string(),
    }[kind]


def _to_arrow(info: TypeInfo, names: list[str], cols: list[list[Any]]) -> bytes:
    import pyarrow as pa

    arrays = []
    for name, values in zip(names, cols, strict=True):
        kind = "ref" if name == REF_COLUMN else info.fields[name].kind
        if kind == "ref":
            values = [None if v is None else str(v) for v in values]
        try:
            arrays.append(pa.array(values, type=arrow_type(kind)))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise FieldError(f"{info.name}.{name} has a value Arrow cannot hold: {exc}") from None
    batch = pa.RecordBatch.from_arrays(arrays, names=names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as out:
        out.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def decode_rows(rows: Any, fmt: str) -> dict[str, list[Any]]:
    """Rows of a write: Arrow IPC bytes or packed columns → {column: [python values]}."""
    if not isinstance(rows, bytes):
        raise BadArgument("'rows' must be bytes (Arrow IPC stream or packed columns)")
    if fmt == "arrow":
        import pyarrow as pa

        try:
            table = pa.ipc.open_stream(rows).read_all()
        except pa.ArrowInvalid as exc:
            raise BadArgument(f"'rows' is not an Arrow IPC stream: {exc}") from None
        return {name: table.column(name).to_pylist() for name in table.column_names}
    try:
        cols = unpack(rows)
    except Exception as exc:
        raise BadArgument(f"'rows' is not packed columns: {exc}") from None
    if not isinstance(cols, dict) or not all(isinstance(v, list) for v in cols.values()):
        raise BadArgument("'rows' must pack a map of column name -> list of values")
    return cols


def encode_rows(cols: dict[str, list[Any]]) -> bytes:
    """Packed-columns form of ``{column: [values]}`` (the ``columns`` format)."""
    return pack(cols)


# ------------------------------------------------------------------- plan
def plan(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Split a type's local extent into reference ranges ``[lo, hi)`` for parallel scans.

    ``splits``: ranges wanted (at least); a range never holds more than
    ``max_rows`` (default :data:`ROWS_PER_RANGE`) objects, so that one scan of
    it is one reply and one snapshot.  The first range starts at None and the
    last ends at None, so objects created after planning are still covered.
    """
    info = bulk_type(ctx, payload)
    swap_apply.wait_open(ctx.db, info)  # (not while a swap of it is applied)
    splits = payload.get("splits", 1)
    max_rows = payload.get("max_rows") or ROWS_PER_RANGE
    if not isinstance(splits, int) or splits < 1 or not isinstance(max_rows, int):
        raise BadArgument("'splits' must be an int >= 1 and 'max_rows' an int")
    store = ctx.db.engine.store
    names = [t.name for t in info.concrete_types()]
    with store.read() as rtxn:
        snapshot = rtxn.id()
        if len(names) == 1:
            refs = list(store.iter_extent(rtxn, names[0]))
        else:
            refs = sorted(r for n in names for r in store.iter_extent(rtxn, n))
    n = len(refs)
    parts = max(splits, math.ceil(n / max(1, max_rows)), 1)
    parts = min(parts, max(1, n))
    step = math.ceil(n / parts) if n else 1
    bounds: list[bytes | None] = [None, *(refs[i] for i in range(step, n, step)), None]
    ranges = [[bounds[i], bounds[i + 1]] for i in range(len(bounds) - 1)]
    return {"snapshot": snapshot, "count": n, "ranges": ranges, "node": ctx.node}


# ------------------------------------------------------------------- scan
_extent_refs = swap_apply.extent_refs


def _compile_filters(info: TypeInfo, filters: Any) -> list[tuple[str, str, Any]]:
    if not filters:
        return []
    if not isinstance(filters, list):
        raise BadArgument("'filters' must be a list of [field, op, value]")
    out = []
    for f in filters:
        if not (isinstance(f, list | tuple) and len(f) == 3 and f[1] in FILTER_OPS):
            raise BadArgument(f"a filter is [field, op, value] with op in {FILTER_OPS}: {f!r}")
        name, op, value = f
        if name not in info.fields or info.fields[name].kind not in ARROW_KINDS - {"decimal"}:
            raise BadArgument(f"cannot filter on {info.name}.{name!s}")
        if op == "in":
            value = {encode_key(_coerce(info, name, v)) for v in value}
        else:
            value = encode_key(_coerce(info, name, value))
        out.append((name, op, value))
    return out


def _coerce(info: TypeInfo, name: str, value: Any) -> Any:
    kind = info.fields[name].kind
    if kind == "ref" and isinstance(value, str):
        return Ref.parse(value)
    if kind == "float" and isinstance(value, int):
        return float(value)
    return value


def _passes(state: dict[str, Any], filters: list[tuple[str, str, Any]]) -> bool:
    for name, op, kb in filters:
        v = state.get(name)
        if v is None:
            return False  # SQL semantics: a comparison with NULL is not true
        k = encode_key(v)
        if op == "eq":
            ok = k == kb
        elif op == "in":
            ok = k in kb
        elif op == "lt":
            ok = k < kb
        elif op == "le":
            ok = k <= kb
        elif op == "gt":
            ok = k > kb
        else:
            ok = k >= kb
        if not ok:
            return False
    return True


def scan(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Read a reference range of a type's local extent from ONE read snapshot, as columns.

    ``lo``/``hi``: the range ``[lo, hi)`` (None: open); ``after``: resume
    strictly after this reference (the previous reply's ``next``); ``limit``:
    at most this many rows, then ``next`` is the last reference returned (None
    when the range is exhausted); ``filters``: ``[[field, op, value], ...]``
    ANDed, ``op`` in eq/lt/le/gt/ge/in.  An equality on a unique key reads
    through its index instead of scanning.
    """
    info = bulk_type(ctx, payload)
    swap_apply.wait_open(ctx.db, info)  # (not while a swap of it is applied)
    fmt = batch_format(payload)
    names = _fields(info, payload.get("fields"), fmt)
    lo = _ref_arg(payload.get("lo"), "lo")
    hi = _ref_arg(payload.get("hi"), "hi")
    after = _ref_arg(payload.get("after"), "after")
    limit = payload.get("limit")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise BadArgument("'limit' must be an int >= 1 or None")
    filters = _compile_filters(info, payload.get("filters"))
    store = ctx.db.engine.store
    types = {t.name: t for t in info.concrete_types()}
    start = max(x for x in (lo, after) if x is not None) if (lo or after) else None
    with gc_hold.paused():  # tens of thousands of state dicts: see query.gc_paused
        if not filters and len(types) == 1:
            snapshot, refs, states, more = _scan_extent(store, info.name, start, after, hi, limit)
        else:
            snapshot, refs, states, more = _scan_filtered(
                info, filters, store, types, lo, hi, after, start, limit
            )
        cols: list[list[Any]] = []
        for n in names:
            if n == REF_COLUMN:
                cols.append([Ref(r) for r in refs])
                continue
            try:
                col = list(map(itemgetter(n), states))
            except KeyError:  # written by an older version of the type: the default
                field = info.fields[n]
                col = [st.get(n, _MISSING) for st in states]
                col = [field.make_default() if v is _MISSING else v for v in col]
            cols.append(col)
        count = len(states)
        last = refs[-1] if refs else None
        if fmt == "arrow":
            rows = _to_arrow(info, names, cols)
        else:
            rows = encode_rows(dict(zip(names, cols, strict=True)))
    return {"rows": rows, "n": count, "next": last if more else None, "snapshot": snapshot}


def _scan_extent(
    store: Any,
    type_name: str,
    start: bytes | None,
    after: bytes | None,
    hi: bytes | None,
    limit: int | None,
) -> tuple[int, list[bytes], list[dict[str, Any]], bool]:
    """A range of one type's extent without filters, with the least Python per object:
    the references in one loop, the records by one C-level ``get`` each, and all of them
    unpacked by ONE msgpack call (as an array of records)."""
    prefix = type_name.encode() + b"\x00"
    plen = len(prefix)
    stop = prefix + hi if hi is not None else prefix[:-1] + b"\x01"
    refs: list[bytes] = []
    more = False
    # One more than asked tells whether there is more; 'after' itself may come first.
    cap = None if limit is None else limit + 1 + (after is not None)
    with store.read() as rtxn:
        snapshot = rtxn.id()
        cur = rtxn.cursor(db=store.extents)
        if cur.set_range(prefix + (start or b"")):
            # The keys below 'stop', at most 'cap' of them, walked in C (no Python per key).
            keys = itertools.takewhile(
                stop.__gt__, itertools.islice(cur.iternext(keys=True, values=False), cap)
            )
            refs = [key[plen:] for key in keys]
        if after is not None and refs and refs[0] == after:
            del refs[0]  # 'after' is exclusive
        if limit is not None and len(refs) > limit:
            del refs[limit:]
            more = True
        get, objects = rtxn.get, store.objects
        raws = [get(r, db=objects) for r in refs]
    if None in raws:  # (extent and objects change in one commit: cannot happen; be safe)
        refs = [r for r, raw in zip(refs, raws, strict=True) if raw is not None]
        raws = [raw for raw in raws if raw is not None]
    recs = bulk_records.decode_all(store, raws, refs)  # checksums verified
    if any(rec[0] != type_name for rec in recs):  # (one extent: cannot happen; be safe)
        keep = [i for i, rec in enumerate(recs) if rec[0] == type_name]
        refs, recs = [refs[i] for i in keep], [recs[i] for i in keep]
    return snapshot, refs, list(map(itemgetter(3), recs)), more


def _scan_filtered(
    info: TypeInfo,
    filters: list[tuple[str, str, Any]],
    store: Any,
    types: dict[str, TypeInfo],
    lo: bytes | None,
    hi: bytes | None,
    after: bytes | None,
    start: bytes | None,
    limit: int | None,
) -> tuple[int, list[bytes], list[dict[str, Any]], bool]:
    """A range with filters or of several concrete types: object by object."""
    found_refs: list[bytes] = []
    states: list[dict[str, Any]] = []
    more = False
    with store.read() as rtxn:
        snapshot = rtxn.id()
        points = _point_refs(info, filters, store, rtxn)
        refs: Iterable[bytes]
        if points is None:
            gens = [_extent_refs(store, rtxn, t, start) for t in types]
            refs = gens[0] if len(gens) == 1 else heapq.merge(*gens)
        else:
            refs = points
        get = rtxn.get
        objects = store.objects
        cap = -1 if limit is None else limit
        for ref in refs:
            if (after is not None and ref <= after) or (lo is not None and ref < lo):
                continue
            if hi is not None and ref >= hi:
                break
            if len(states) == cap:
                more = True
                break
            raw = get(ref, db=objects)
            if raw is None:
                continue
            type_name, _, _, state = store.record(raw, ref)
            if type_name not in types or (filters and not _passes(state, filters)):
                continue
            found_refs.append(ref)
            states.append(state)
    return snapshot, found_refs, states, more


def _point_refs(
    info: TypeInfo, filters: list[tuple[str, str, Any]], store: Any, rtxn: Any
) -> list[bytes] | None:
    """An equality filter on a unique key: the (at most one) reference from its index."""
    for name, op, kb in filters:
        key = info.keys.get(name)
        if op == "eq" and key is not None and key.options.unique:
            ref = rtxn.get(kb, db=store.index_db(key.db_name, unique=True))
            return [] if ref is None else [bytes(ref)]
    return None


# ------------------------------------------------------------------ writes
def unique_key_of(info: TypeInfo, payload: dict[str, Any]) -> KeyInfo:
    uniques = [k for k in info.keys.values() if k.options.unique]
    name = payload.get("key")
    if name is None:
        if not uniques:
            raise SchemaError(f"{info.name} has no unique key: bulk writes upsert by one")
        return uniques[0]
    key = info.keys.get(name)
    if key is None or not key.options.unique:
        raise BadArgument(
            f"{info.name}.{name} is not a unique key "
            f"(unique keys: {', '.join(k.field for k in uniques) or '(none)'})"
        )
    return key


def batch_columns(
    info: TypeInfo, key: KeyInfo, payload: dict[str, Any]
) -> tuple[list[str], list[list[Any]], list[bytes]]:
    """Validate a batch column by column: known fields, equal lengths, values of the
    field's type (converted as ``Field.check`` does), keys present, unique, not null.

    Returns the column names, the columns and the encoded key values."""
    cols = decode_rows(payload.get("rows"), batch_format(payload))
    unknown = [c for c in cols if c not in info.fields]
    if unknown:
        raise FieldError(
            f"column(s) {', '.join(map(repr, unknown))} are not fields of {info.name} "
            f"(fields: {', '.join(info.fields)})"
        )
    if key.field not in cols:
        raise FieldError(f"the rows have no column {key.field!r}, the key of {info.name}")
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise BadArgument(f"columns have different lengths: {sorted(lengths)}")
    kcol = cols[key.field]
    if None in kcol:
        raise FieldError(f"row {kcol.index(None)}: null in key column {info.name}.{key.field}")
    names = list(cols)
    out = [checked_column(info, n, cols[n]) for n in names]
    kcol = out[names.index(key.field)]
    kbs = encode_keys(kcol)
    if len(set(kbs)) != len(kbs):
        seen: set[bytes] = set()
        for value, kb in zip(kcol, kbs, strict=True):
            if kb in seen:
                raise DuplicateKey(
                    f"{info.name}.{key.field} = {value!r} appears twice in one batch"
                )
            seen.add(kb)
    return names, out, kbs


# Field kinds whose valid values are exactly these Python types (Arrow and msgpack hand
# out nothing else for them): a column of them needs no per-value check.
_EXACT: dict[str, frozenset[type]] = {
    "int": frozenset({int}),
    "float": frozenset({float}),
    "bool": frozenset({bool}),
    "str": frozenset({str}),
    "bytes": frozenset({bytes}),
}


def checked_column(info: TypeInfo, name: str, col: list[Any]) -> list[Any]:
    f = info.fields[name]
    exact = _EXACT.get(f.kind)
    if exact is not None:
        kinds = set(map(type, col))
        if f.optional:
            kinds.discard(type(None))
        if kinds <= exact:
            return col
    return list(map(_converter(info, name), col))


def _converter(info: TypeInfo, name: str) -> Callable[[Any], Any]:
    f = info.fields[name]
    kind = f.kind

    def check(value: Any) -> Any:
        return f.check(info.name, value)

    if kind == "ref":

        def ref(value: Any) -> Any:
            if value is None or isinstance(value, Ref):
                return value
            try:
                if isinstance(value, str):
                    return Ref.parse(value)
                if isinstance(value, bytes | bytearray):
                    return Ref(bytes(value))
            except ValueError as exc:
                raise FieldError(f"{info.name}.{name}: {exc}") from None
            raise FieldError(f"{info.name}.{name} takes a reference, not {type(value).__name__}")

        return ref
    if kind == "datetime":

        def datetime(value: Any) -> Any:
            # Arrow hands out zoneinfo UTC; store the stdlib UTC (same instant, same bytes
            # as objects written by Python code).
            if isinstance(value, _dt.datetime) and value.tzinfo is not None:
                value = value.astimezone(_dt.UTC)
            return check(value)

        return datetime
    return check


def _load_refs(tx: Transaction, info: TypeInfo, row: dict[str, Any]) -> dict[str, Any]:
    """Reference fields become handles in ``tx`` (the API's rule); a dangling one is an error."""
    if not info.ref_fields:
        return row
    return _run_steps(tx, _g_refs(info, row))  # type: ignore[no-any-return]


# A transaction body written once for both flavours of transaction: a generator
# that yields the transaction calls it needs, ``(method, args, kwargs)``, and is
# sent each call's result.  ``_run_steps`` runs it against a blocking Transaction
# (the bulk handlers' worker thread), ``run_steps_sliced`` against an AsyncTransaction
# (a branch of the data service, on the node's event loop).
Step = tuple[str, tuple[Any, ...], dict[str, Any]]
Steps = Generator[Step, Any, Any]
_NEED = "need"
"""Step: take a lock on a resource (``tx.need``)."""


def _run_steps(tx: Transaction, steps: Steps) -> Any:
    value: Any = None
    failure: Exception | None = None
    while True:
        try:  # a failed call is raised inside the body, where it may be handled
            name, args, kwargs = steps.throw(failure) if failure else steps.send(value)
        except StopIteration as stop:
            return stop.value
        failure = None
        try:
            if name == _NEED:
                value = tx.drive(tx.need(*args))
            elif name == fast_swap.NEED_ALL:
                value = tx.drive(tx.need_all(*args))
            elif name == swap_apply.COMMIT:
                tx.engine.committer.commit(*args)
                value = None
            else:
                value = getattr(tx, name)(*args, **kwargs)
        except Exception as exc:
            failure = exc


SLICE = 0.01
"""Seconds of work after which :func:`run_steps_sliced` lets the node's event loop run."""


async def run_steps_sliced(tx: AsyncTransaction, steps: Steps) -> Any:
    """Run ``steps`` on the node's event loop in slices of about :data:`SLICE` s:
    between them the loop answers keep-alives, other transactions and requests,
    so a swap of any size never holds the node (data-path.md §6.2)."""
    value: Any = None
    failure: Exception | None = None
    slice_end = time.monotonic() + SLICE
    while True:
        if time.monotonic() >= slice_end:
            await asyncio.sleep(0)  # one loop turn: whatever is ready runs now
            slice_end = time.monotonic() + SLICE
        try:
            name, args, kwargs = steps.throw(failure) if failure else steps.send(value)
        except StopIteration as stop:
            return stop.value
        failure = None
        try:
            if name == _NEED:
                value = await tx.adrive(tx.need(*args))
            elif name == fast_swap.NEED_ALL:
                value = await tx.adrive(tx.need_all(*args))
            elif name == swap_apply.COMMIT:
                await _acommit(tx, *args)
                value = None
            else:
                value = await getattr(tx, name)(*args, **kwargs)
        except Exception as exc:
            failure = exc


async def _acommit(tx: AsyncTransaction, ws: WriteSet) -> None:
    """Commit ``ws`` (a swap's scratch, not the transaction's) without blocking the loop."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()

    def landed(exc: BaseException | None) -> None:  # (the committer's thread)
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    tx.engine.committer.submit(ws, landed)
    await asyncio.wrap_future(done)


def _g_refs(info: TypeInfo, row: dict[str, Any]) -> Steps:
    """Steps of :func:`_load_refs`."""
    if not info.ref_fields:
        return row
    out = dict(row)
    for name in info.ref_fields & row.keys():
        ref = row[name]
        if ref is None:
            continue
        obj = yield ("by_ref", (ref,), {"lock": "read"})
        if obj is None:
            raise FieldError(f"{info.name}.{name}: no object with reference {ref}")
        ref_type = info.fields[name].ref_type
        if ref_type is not None and not isinstance(obj, ref_type):
            raise FieldError(f"{info.name}.{name}: {ref} is a {type(obj).__name__}")
        out[name] = obj
    return out


def _apply_upsert(
    tx: Transaction, info: TypeInfo, key: KeyInfo, rows: list[dict[str, Any]]
) -> tuple[int, int]:
    inserted = updated = 0
    kbs = [encode_key(row[key.field]) for row in rows]
    absent, seq = absent_keys(tx, key, kbs)
    for row, kb in zip(rows, kbs, strict=True):
        if kb in absent and _create_fast(tx, info, key, kb, row, seq):
            inserted += 1
            continue
        row = _load_refs(tx, info, row)
        obj = tx.find(info.cls, lock="write", **{key.field: row[key.field]})
        if obj is None:
            tx.create(info.cls, **row)
            inserted += 1
            continue
        state = tx.entry_of(obj).state
        changed = False
        for name, value in row.items():
            current = state[name]
            if info.fields[name].kind == "ref" and value is not None:
                same = current is not None and current == tx.ref(value)
            else:
                same = current == value and type(current) is type(value)
            if not same:
                setattr(obj, name, value)
                changed = True
        updated += changed
    return inserted, updated


def absent_keys(tx: Transaction, key: KeyInfo, kbs: list[bytes]) -> tuple[set[bytes], int]:
    """Key values of the batch no committed object holds, read in ONE snapshot.

    Only for the fast create path (:func:`_create_fast`), which still locks each
    value and re-checks it if anything committed since this read.
    """
    store = tx.engine.store
    index = store.index_db(key.db_name, unique=True)
    seq = store.commit_seq  # (bumped before any lock is released: see Store)
    with store.read() as rtxn:
        get = rtxn.get
        return {kb for kb in kbs if get(kb, db=index) is None}, seq


def _create_fast(
    tx: Transaction, info: TypeInfo, key: KeyInfo, kb: bytes, row: dict[str, Any], seq: int
) -> bool:
    """Create the object of a row whose key was absent, as ``tx.create`` would but
    without re-reading and re-checking what the batch already did; False when the key
    turned out to be taken (the caller takes the general path)."""
    if not tx.drive(tx.g_claim_absent(key, kb, seq)):
        return False  # created meanwhile (or earlier in the batch): update it instead
    if info.ref_fields:
        _load_refs(tx, info, row)  # every reference names an object of the right type
    missing = [f.name for f in info.required if f.name not in row]
    if missing:
        raise FieldError(f"{info.name} needs a value for {', '.join(map(repr, missing))}")
    state = {n: row[n] if n in row else f.make_default() for n, f in info.fields.items()}
    # (A key value too long raises KeyTooLong when the write set is built: rolled back.)
    tx.drive(tx.g_insert(info, state, claimed=(key, kb)))
    return True


def _lock(tx: Transaction, slot: bytes) -> None:
    # Two attempts of one Spark task (a retry, a speculative copy) racing on the
    # same tag serialize here; the second then sees the first one's record.
    tx.drive(tx.need(("bulk", slot), LockMode.WRITE))


def _retrying(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (one transaction) again on deadlock or conflict, as @transactional does."""
    for attempt in range(RETRIES):
        try:
            return fn()
        except Retryable:
            if attempt == RETRIES - 1:
                raise
            time.sleep(min(0.2, 0.005 * 2**attempt))
    raise TooManyRetries("bulk write kept conflicting")  # pragma: no cover


def upsert(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Insert or update rows by the type's unique key, in ONE transaction.

    ``tag``: an id of this batch that is the same on every retry (e.g. job,
    Spark partition, batch number).  It is recorded in the same commit; a batch
    whose tag is already recorded changes nothing and replies ``replayed``.
    ``stream``: ``[stream id, batch id]`` — also record the micro-batch id as
    the stream's last committed one, in the same commit.  Bad rows (unknown
    field, wrong type, null or duplicate key, immutable key change) raise and
    write nothing.  ``per_row: true`` forces the per-row path even where the fast
    path (:mod:`nonstop.bulk.fast`) applies (comparisons, tests).
    """
    _refuse_under_partitions(ctx, "bulk.upsert")
    info = bulk_type(ctx, payload)
    swap_apply.wait_open(ctx.db, info)  # (not while a swap of it is applied)
    key = unique_key_of(info, payload)
    names, cols, kbs = batch_columns(info, key, payload)
    fast = bulk_fast.covers(info, key) and not payload.get("per_row")
    rows = [] if fast else [dict(zip(names, v, strict=True)) for v in zip(*cols, strict=True)]
    tag = payload.get("tag")
    if tag is not None and not isinstance(tag, str):
        raise BadArgument("'tag' must be a string or None")
    db = ctx.db
    bulk = _bulk_db(db)

    def run() -> dict[str, Any]:
        with db.transaction() as tx:
            if tag is not None:
                slot = b"t/" + tag.encode()
                _lock(tx, slot)
                done = db.engine.get_raw(bulk, slot)
                if done is not None:
                    return {**unpack(done), "replayed": True}
            if fast:
                inserted, updated = bulk_fast.upsert(tx, info, key, names, cols, kbs)
            else:
                inserted, updated = _apply_upsert(tx, info, key, rows)
            result = {"inserted": inserted, "updated": updated, "replayed": False}
            if tag is not None:
                record = {"inserted": inserted, "updated": updated, "at": time.time()}
                tx.write_raw([(True, bulk, slot, pack(record))])
            return result

    if not fast:
        return _retrying(run)  # type: ignore[no-any-return]
    with gc_hold.paused():  # ~10 objects per row, all freed by reference counting
        return _retrying(run)  # type: ignore[no-any-return]


def forget(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Drop the upsert tags starting with ``prefix`` (a finished job's bookkeeping)."""
    prefix = payload.get("prefix")
    if not isinstance(prefix, str) or not prefix:
        raise BadArgument("'prefix' must be a non-empty string")
    keys = _keys_with(ctx.db, b"t/" + prefix.encode())
    if keys:
        bulk = _bulk_db(ctx.db)
        ctx.db.engine.committer.commit(WriteSet([(False, bulk, k, None) for k in keys]))
    return {"forgotten": len(keys)}


def _keys_with(db: Database, prefix: bytes) -> list[bytes]:
    return swap_apply.keys_with(db.engine.store, prefix)


# ----------------------------------------------------------------- streams
def _stream_slot(payload: dict[str, Any]) -> bytes:
    stream = payload.get("stream")
    if not isinstance(stream, str) or not stream:
        raise BadArgument("'stream' must be a non-empty string (the sink's id)")
    return b"s/" + stream.encode()


def stream_last(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """The last micro-batch id committed for ``stream`` on this node (None: none yet)."""
    slot = _stream_slot(payload)
    bulk = _bulk_db(ctx.db)  # before the read: a read snapshot cannot see a newer database
    raw = ctx.db.engine.get_raw(bulk, slot)
    return {"batch": None if raw is None else unpack(raw)}


def stream_commit(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Record ``batch`` as committed for ``stream`` (never moves backwards)."""
    slot = _stream_slot(payload)
    batch = payload.get("batch")
    if not isinstance(batch, int) or batch < 0:
        raise BadArgument("'batch' must be an int >= 0")
    db = ctx.db
    bulk = _bulk_db(db)

    def run() -> dict[str, Any]:
        with db.transaction() as tx:
            _lock(tx, slot)
            raw = db.engine.get_raw(bulk, slot)
            last = None if raw is None else unpack(raw)
            if last is None or batch > last:
                tx.write_raw([(True, bulk, slot, pack(batch))])
                last = batch
            return {"batch": last}

    return _retrying(run)  # type: ignore[no-any-return]


# --------------------------------------------------------------- overwrite
def job_id(payload: dict[str, Any]) -> str:
    job = payload.get("job")
    if not isinstance(job, str) or not job or "/" in job:
        raise BadArgument("'job' must be the id bulk.overwrite.begin returned")
    return job


def overwrite_begin(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Start a staged overwrite of a type; returns its ``job`` id.

    ``job`` may be given (the Spark writer passes one id to every node).
    """
    info = bulk_type(ctx, payload)
    job = payload.get("job") or secrets.token_hex(8)
    job = job_id({"job": job})
    bulk = _bulk_db(ctx.db)
    record = pack({"type": info.name, "at": time.time()})
    ctx.db.engine.committer.commit(WriteSet([(True, bulk, b"j/" + job.encode(), record)]))
    return {"job": job}


def overwrite_part(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Stage rows of an overwrite, invisibly.  The same ``tag`` again replaces that part.

    Under routing by partition the part names its ``partition`` (every row's key must
    map to it) and the job's record is written with its first part: the rows go to
    each partition's active node, which need not have been up at the job's start
    (data-path.md §6.6)."""
    job = job_id(payload)
    info = bulk_type(ctx, payload)
    key = unique_key_of(info, payload)
    names, cols, _ = batch_columns(info, key, payload)  # bad rows fail now, before the swap
    tag = payload.get("tag")
    if not isinstance(tag, str) or not tag:
        raise BadArgument("'tag' must name this part (the same on a retry)")
    db = ctx.db
    bulk = _bulk_db(db)
    jslot = b"j/" + job.encode()
    meta = db.engine.get_raw(bulk, jslot)
    ops: list[tuple[bool, Any, bytes, bytes | None]] = []
    if ctx.placement is not None:
        from nonstop.bulk.partition_swap import check_staged_part

        check_staged_part(ctx, info, key, cols, names, payload.get("partition"))
        if meta is None:
            meta = pack({"type": info.name, "at": time.time()})
            ops.append((True, bulk, jslot, meta))
    if meta is None:
        raise BadArgument(f"no staged overwrite {job!r} on this node (aborted or committed?)")
    if unpack(meta)["type"] != info.name:
        raise BadArgument(f"overwrite {job!r} is of type {unpack(meta)['type']}, not {info.name}")
    staged = pack({"key": key.field, "names": names, "cols": cols})
    ops.append((True, bulk, f"o/{job}/{tag}".encode(), staged))
    db.engine.committer.commit(WriteSet(ops))
    return {"rows": len(cols[0]) if cols else 0}


def overwrite_commit(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Swap in the staged objects: ONE transaction deletes the type's objects and creates
    the staged ones.  A reader sees the old set or the new.  Committing again replies
    the same result; a duplicate key across parts aborts the swap and changes nothing.

    ``parts``: tag prefixes of the parts to take (Spark passes ``"<partition>/<attempt>/"``
    of each successful task, so parts of a failed attempt are dropped, not swapped in).

    This is ONE node's swap (the single-store ``bulk_server``); on a cluster the
    data service's ``tx.overwrite`` runs :func:`overwrite_branch` on every node in
    one distributed transaction instead (data-path.md §6).
    """
    _refuse_under_partitions(ctx, "bulk.overwrite.commit (a swap in one store)")
    job = job_id(payload)
    info = bulk_type(ctx, payload)
    parts = payload.get("parts")
    db = ctx.db

    def run() -> dict[str, Any]:
        with db.transaction() as tx:
            return _run_steps(tx, _g_swap(tx, info, job, parts))  # type: ignore[no-any-return]

    result = _retrying(run)
    swap_apply.wait_applied(db, info.name)  # (a bounded swap lands after its commit)
    return result  # type: ignore[no-any-return]


async def overwrite_branch(
    tx: AsyncTransaction, info: TypeInfo, payload: dict[str, Any]
) -> dict[str, Any]:
    """The swap of :func:`overwrite_commit` in a branch ``tx`` of a distributed
    transaction (``branch.overwrite``): nothing is committed here; the session's
    commit makes every node's swap visible at once, or none (two-phase commit)."""
    job = job_id(payload)
    # The transaction grows by an entry per object swapped and lives until the
    # two-phase commit ends: the cyclic GC stays off until then (tx/gc_hold.py).
    gc_hold.hold()
    tx.on_commit(gc_hold.release)
    tx.on_rollback(gc_hold.release)
    return await run_steps_sliced(tx, _g_swap(tx, info, job, payload.get("parts")))  # type: ignore[no-any-return]


def _g_swap(tx: Transaction, info: TypeInfo, job: str, parts_arg: Any) -> Steps:
    """Steps of one node's swap: lock the job, replay its recorded result if it is
    done, else delete the type's objects, create the chosen parts' rows, drop the
    staged records and record the result — all in ``tx``, which it only reads and
    adds raw records to: its other calls are steps."""
    db = tx.db
    bulk = _bulk_db(db)
    jslot = b"j/" + job.encode()
    dslot = b"d/" + job.encode()
    # Two commits of one job (a retried job commit) serialize here; the second
    # then sees the first one's done record.
    yield (_NEED, (("bulk", jslot), LockMode.WRITE), {})
    store = db.engine.store
    with store.read() as rtxn:
        done = rtxn.get(dslot, db=bulk)
        staged_meta = rtxn.get(jslot, db=bulk)
    if done is not None:
        return {**unpack(bytes(done)), "replayed": True}
    if staged_meta is None:
        raise BadArgument(f"no staged overwrite {job!r} on this node (aborted?)")
    staged = _keys_with(db, f"o/{job}/".encode())
    parts = _chosen(staged, f"o/{job}/".encode(), parts_arg)
    bounded_key = swap_apply.covered_key(info)
    if bounded_key is not None:  # memory bounded per page, applied after the commit
        deleted, inserted = yield from swap_apply.g_swap(tx, info, bounded_key, job, parts)
        result = {"deleted": deleted, "inserted": inserted}
        tx.write_raw([(True, bulk, dslot, pack(result))])
        return {**result, "replayed": False}
    fast_key = fast_swap.covered_key(info)
    deleted = 0
    for name in sorted(t.name for t in info.concrete_types()):
        for page in _extent_pages(db, name):
            if fast_key is not None:
                deleted += yield from fast_swap.g_delete_page(tx, info, page)
            else:
                deleted += yield from g_delete_objects(page)
    inserted = 0
    seen: set[bytes] = set()  # (the fast path's key values of earlier parts)
    for slot in parts:
        raw = db.engine.get_raw(bulk, slot)
        if raw is None:  # (the job's lock is held: its parts cannot go away)
            raise BadArgument(f"staged part {slot!r} of {job!r} is gone")
        names, cols = _part_columns(unpack(raw))
        for lo in range(0, len(cols[0]) if cols else 0, SWAP_PAGE):
            chunk = [c[lo : lo + SWAP_PAGE] for c in cols]
            if fast_key is not None:
                inserted += yield from fast_swap.g_create_part(
                    tx, info, fast_key, names, chunk, seen
                )
                continue
            for values in zip(*chunk, strict=True):
                row = dict(zip(names, values, strict=True))
                if info.ref_fields:
                    row = yield from _g_refs(info, row)
                try:
                    yield ("create", (info.cls,), row)
                except DuplicateKey as exc:
                    raise DuplicateKey(f"overwrite {job!r}: {exc} (in two parts)") from None
                inserted += 1
    return finish_swap(tx, bulk, staged, jslot, dslot, deleted, inserted)


def finish_swap(
    tx: Any, bulk: Any, staged: list[bytes], jslot: bytes, dslot: bytes, deleted: int, inserted: int
) -> dict[str, Any]:
    """A swap's last entries, in its transaction: the staged parts and the job's slot go,
    the done-slot records the result (so a replayed commit answers it, not a second swap)."""
    result = {"deleted": deleted, "inserted": inserted}
    ops: list[tuple[bool, Any, bytes, bytes | None]] = [(False, bulk, s, None) for s in staged]
    ops += [(False, bulk, jslot, None), (True, bulk, dslot, pack(result))]
    tx.write_raw(ops)
    return {**result, "replayed": False}


SWAP_PAGE = 1000
"""References a swap reads from its node's extent at a time (memory bound per page)."""


def _extent_pages(db: Database, type_name: str) -> Iterator[list[bytes]]:
    """Every reference of one concrete type's extent, a page of :data:`SWAP_PAGE` at
    a time in reference order, each page read from a fresh snapshot (so nothing holds
    the whole extent in memory).  Objects created meanwhile with a later reference
    come in later pages; the query rule on phantoms (data-path.md §6.2) covers the
    others, as for a locking scan."""
    store = db.engine.store
    lo: bytes | None = None
    while True:
        with store.read() as rtxn:
            page = list(itertools.islice(_extent_refs(store, rtxn, type_name, lo), SWAP_PAGE))
        if not page:
            return
        yield page
        lo = page[-1] + b"\x00"  # the next reference after the page's last


def g_delete_objects(page: list[bytes]) -> Steps:
    """Steps deleting the objects of a page of references under write locks, one
    transaction entry each (the per-object path); returns how many there were."""
    deleted = 0
    for raw in page:
        obj = yield ("by_ref", (Ref(raw),), {"lock": "write"})
        if obj is not None:  # (deleted by a transaction that committed meanwhile)
            yield ("delete", (obj,), {})
            deleted += 1
    return deleted


_part_columns = swap_apply.part_columns


def _chosen(staged: list[bytes], prefix: bytes, parts: Any) -> list[bytes]:
    """The staged parts to swap in: those whose tag starts with one of ``parts`` (the
    successful task attempts), or all of them when ``parts`` is None."""
    if parts is None:
        return staged
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise BadArgument("'parts' must be a list of tag prefixes or None")
    wanted = tuple(prefix + p.encode() for p in parts)
    return [s for s in staged if s.startswith(wanted)] if wanted else []


def overwrite_abort(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Drop a staged overwrite (nothing of it was ever visible).  Idempotent."""
    job = job_id(payload)
    db = ctx.db
    bulk = _bulk_db(db)
    if db.engine.get_raw(bulk, b"p/" + job.encode()) is not None:
        return {"dropped": 0}  # committed: its swap is being applied and needs its parts
    keys = _keys_with(db, f"o/{job}/".encode()) + _keys_with(db, f"k/{job}/".encode())
    if db.engine.get_raw(bulk, b"j/" + job.encode()) is not None:
        keys.append(b"j/" + job.encode())
    if keys:
        db.engine.committer.commit(WriteSet([(False, bulk, k, None) for k in keys]))
    return {"dropped": len(keys)}


# ------------------------------------------------------------------ schema
def schema(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """The type's schema as stored (``TypeInfo.schema()``) plus its unique keys."""
    info = bulk_type(ctx, payload)
    swap_apply.wait_open(ctx.db, info)  # (not while a swap of it is applied)
    out = info.schema()
    out["unique"] = [k.field for k in info.keys.values() if k.options.unique]
    out["count"] = sum(ctx.db.engine.store.count(t.name) for t in info.concrete_types())
    return out


def route(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """``bulk.route``: the partition of each row (:func:`nonstop.bulk.partitioned.route`)."""
    from nonstop.bulk import partitioned

    return partitioned.route(ctx, payload)


HANDLERS: dict[str, Callable[[BulkContext, dict[str, Any]], Any]] = {
    "bulk.schema": schema,
    "bulk.plan": plan,
    "bulk.scan": scan,
    "bulk.upsert": upsert,
    "bulk.route": route,
    "bulk.forget": forget,
    "bulk.stream.last": stream_last,
    "bulk.stream.commit": stream_commit,
    "bulk.overwrite.begin": overwrite_begin,
    "bulk.overwrite.part": overwrite_part,
    "bulk.overwrite.commit": overwrite_commit,
    "bulk.overwrite.abort": overwrite_abort,
}
"""``op`` → handler; the data service runs ``HANDLERS[op](BulkContext(db, node), payload)``."""


def handle(ctx: BulkContext, payload: dict[str, Any]) -> Any:
    """Dispatch one ``bulk.*`` request (BadArgument for an unknown op)."""
    op = payload.get("op")
    fn = HANDLERS.get(op) if isinstance(op, str) else None
    if fn is None:
        raise BadArgument(f"unknown bulk op {op!r} (known: {', '.join(sorted(HANDLERS))})")
    return fn(ctx, payload)


__all__ = ["FORMATS", "HANDLERS", "BulkContext", "Error", "arrow_type", "decode_rows", "handle"]
