"""Bulk writes under routing by partition (``[ha] data = "partitions"``, data-path.md §6.5).

Under node routing a bulk batch is one local store transaction on the node that
receives it (:func:`nonstop.bulk.handlers.upsert`), and its objects are named by
that node's own location.  Under routing by partition that would leave them
outside every partition and off the partitions' replicas, so a batch is applied
instead as an **ordinary transaction of the data plane**: the session op
``tx.upsert`` (``dataplane/bulk_upsert.py``) maps every row's unique key with
the type's binding to its partition (the mapper ``tx.create`` uses), places
each partition on its active node (fenced by the partition's epoch), and runs
this module's :func:`upsert_branch` there as the ``branch.upsert`` op; the
client's ``tx.commit`` commits it as any transaction is committed — through
the replication hook, so the batch is on every sync replica before it is
acknowledged.

This module holds the pieces the data plane and the bulk handlers share:

* :func:`key_values` / :func:`partitions_of` -- the checked key values of a
  batch and the partition of each (the routing key is the value packed, as
  ``dataplane.placement.routing_key`` packs it);
* :func:`route` -- ``bulk.route``: that mapping for a client (the Spark writer
  groups a batch's rows by the partitions' active nodes with it);
* :func:`upsert_branch` -- the rows of some partitions inserted or updated by
  key in a branch's transaction, one transaction entry per row (so that
  ``tx/replica.write_set_records`` sees every object: the raw fast path of
  :mod:`nonstop.bulk.fast` is not replicated and is not used here), new
  objects created with ``create_in`` (named by their partition at its epoch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from nonstop.bulk.handlers import (
    BulkContext,
    Steps,
    absent_keys,
    batch_columns,
    batch_format,
    bulk_type,
    checked_column,
    decode_rows,
    run_steps_sliced,
    unique_key_of,
)
from nonstop.bulk.stream_marks import g_chunk_applied, record_chunk, stream_arg
from nonstop.errors import BadArgument, FieldError
from nonstop.model.codec import encode_key, pack, pack_each
from nonstop.model.ref import check_epoch, check_location

if TYPE_CHECKING:
    from nonstop.model.managed import KeyInfo, TypeInfo
    from nonstop.tx.async_transaction import AsyncTransaction

ROUTING_OFF = (
    "bulk writes are routed by partition only when the cluster routes by partition "
    '([ha] data = "partitions"); this node routes by node'
)


class RowPlacement(Protocol):
    """What :func:`partitions_of` needs of ``dataplane.placement.Placement``."""

    def partition_for(self, type_name: str, key: bytes | None) -> str: ...


class ManyRowPlacement(RowPlacement, Protocol):
    """A placement that maps a whole column of routing keys at once."""

    def partitions_for(self, type_name: str, keys: list[bytes]) -> list[str]: ...


def refusal(what: str) -> str:
    """Why an unreplicated bulk op is refused under routing by partition."""
    return (
        f"{what} is not available when the cluster routes by partition "
        '([ha] data = "partitions"): its objects would live outside the partitions and '
        "off their replicas; write with tx.upsert (the Spark writer does)"
    )


def key_values(info: TypeInfo, key: KeyInfo, rows: Any, fmt: str) -> list[Any]:
    """The key column of a batch, checked as a write checks it (only that column is
    decoded from Arrow); FieldError for a missing column or a null key."""
    if fmt == "arrow":
        import pyarrow as pa

        if not isinstance(rows, bytes):
            raise BadArgument("'rows' must be bytes (an Arrow IPC stream)")
        try:
            table = pa.ipc.open_stream(rows).read_all()
        except pa.ArrowInvalid as exc:
            raise BadArgument(f"'rows' is not an Arrow IPC stream: {exc}") from None
        if key.field not in table.column_names:
            raise FieldError(f"the rows have no column {key.field!r}, the key of {info.name}")
        values: list[Any] = table.column(key.field).to_pylist()
    else:
        cols = decode_rows(rows, fmt)
        if key.field not in cols:
            raise FieldError(f"the rows have no column {key.field!r}, the key of {info.name}")
        values = cols[key.field]
    if None in values:
        raise FieldError(f"row {values.index(None)}: null in key column {info.name}.{key.field}")
    return checked_column(info, key.field, values)


def partitions_of(placement: RowPlacement, type_name: str, values: list[Any]) -> list[str]:
    """The partition of each key value: the binding's mapper over the value packed
    (``routing_key``), exactly as a ``tx.create`` of an object with that key."""
    if hasattr(placement, "partitions_for"):  # (BindingPlacement: one pass per batch)
        many: ManyRowPlacement = placement  # type: ignore[assignment]
        return many.partitions_for(type_name, list(map(pack_each, values)))
    return [placement.partition_for(type_name, pack(v)) for v in values]


def route(ctx: BulkContext, payload: dict[str, Any]) -> dict[str, Any]:
    """``bulk.route``: the partition of each row of a batch (``rows``: at least its key
    column).  Reply ``{"partitions": [names], "of": [index into partitions per row]}``."""
    if ctx.placement is None:
        raise BadArgument(ROUTING_OFF)
    info = bulk_type(ctx, payload)
    key = unique_key_of(info, payload)
    values = key_values(info, key, payload.get("rows"), batch_format(payload))
    names = partitions_of(ctx.placement, info.name, values)
    order = sorted(set(names))
    index = {name: i for i, name in enumerate(order)}
    return {"partitions": order, "of": [index[n] for n in names]}


def groups_arg(value: Any, n_rows: int) -> list[tuple[int, int, list[int]]]:
    """``parts`` of ``branch.upsert``: ``[[location, epoch, [row index, ...]], ...]``."""
    if not isinstance(value, list) or not value:
        raise BadArgument("parts must be a non-empty list of [location, epoch, [rows]]")
    out = []
    for g in value:
        if not (isinstance(g, list | tuple) and len(g) == 3 and isinstance(g[2], list)):
            raise BadArgument("each part is [location, epoch, [row indices]]")
        location, epoch, rows = g
        if not isinstance(location, int) or not isinstance(epoch, int):
            raise BadArgument("a part's location and epoch are integers")
        if not all(isinstance(i, int) and 0 <= i < n_rows for i in rows):
            raise BadArgument(f"a part's row indices must be in [0, {n_rows})")
        out.append((location, epoch, rows))
    return out


async def upsert_branch(
    tx: AsyncTransaction, info: TypeInfo, payload: dict[str, Any]
) -> dict[str, Any]:
    """``branch.upsert``: insert or update rows by key in ``tx`` (module doc).  The rows
    are validated whole first (a bad row fails the batch, nothing written); the
    coordinator has mapped them and fenced their partitions (``parts``)."""
    key = unique_key_of(info, payload)
    names, cols, kbs = batch_columns(info, key, payload)
    groups = groups_arg(payload.get("parts"), len(cols[0]) if cols else 0)
    raw_stream = payload.get("stream")
    stream = None if raw_stream is None else stream_arg(raw_stream)
    steps = _g_upsert(tx, info, key, names, cols, groups, stream, kbs)
    return await run_steps_sliced(tx, steps)  # type: ignore[no-any-return]


def _creates_directly(info: TypeInfo, names: list[str], key: KeyInfo) -> bool:
    """Can a row whose key is absent be created from its checked columns directly
    (:func:`_g_create_absent`)?  Only if every required field is a column (else the
    general path raises the FieldError ``create_in`` raises).  A reference column is
    already a ``Ref`` or None (``checked_column``), which ``create_in`` takes as such."""
    return key.field in names and all(f.name in names for f in info.required)


def _g_create_absent(
    tx: AsyncTransaction,
    info: TypeInfo,
    key: KeyInfo,
    kb: bytes,
    row: dict[str, Any],
    seen_at: int,
    location: int,
    epoch: int,
) -> Steps:
    """Create the object of ``row``, whose key ``kb`` the batch's one snapshot read
    found free at ``seen_at`` (the store's ``commit_seq``), as ``find`` + ``create_in``
    would, without reading the index twice or checking the checked columns again;
    False when the key turned out taken (the caller takes the general path)."""
    free = yield ("adrive", (tx.g_claim_absent(key, kb, seen_at),), {})
    if not free:
        return False
    state = {n: row[n] if n in row else f.make_default() for n, f in info.fields.items()}
    for name in info.keys:
        if name != key.field:
            encode_key(state[name])  # KeyTooLong / bad key type, as create_in checks
    yield ("adrive", (tx.g_insert(info, state, (key, kb), location, epoch),), {})
    return True


def _g_upsert(
    tx: AsyncTransaction,
    info: TypeInfo,
    key: KeyInfo,
    names: list[str],
    cols: list[list[Any]],
    groups: list[tuple[int, int, list[int]]],
    stream: tuple[str, int, str] | None = None,
    kbs: list[bytes] | None = None,
) -> Steps:
    inserted = updated = replayed = 0
    fields = info.fields
    # Most rows of a load are new: their keys are read in ONE snapshot of the unique
    # index first, and a row whose key was absent is created with a single claim (the
    # lock, and the index read again only if anything committed since), as the by-node
    # upsert does (handlers.absent_keys): no per-row lookup (data-path.md §6.5).
    direct = kbs is not None and _creates_directly(info, names, key)
    absent, seen_at = absent_keys(tx, key, kbs) if direct and kbs else (set(), 0)
    if direct:
        tx.engine.ensure_type(info.cls)
    for location, epoch, indices in groups:
        if direct:
            check_location(location)
            check_epoch(epoch)
        if stream is not None:  # a streaming sink's chunk: once per partition (§6.7)
            if (yield from g_chunk_applied(tx, location, *stream)):
                replayed += 1
                continue
            before = inserted, updated
        for i in indices:
            row = {n: col[i] for n, col in zip(names, cols, strict=True)}
            if kbs is not None and kbs[i] in absent:
                made = yield from _g_create_absent(
                    tx, info, key, kbs[i], row, seen_at, location, epoch
                )
                if made:
                    inserted += 1
                    continue
            # A reference is taken as such (its object may live in another partition,
            # on another node: as a reference written over the data path).
            obj = yield ("find", (info.cls,), {"lock": "write", key.field: row[key.field]})
            if obj is None:
                yield ("create_in", (info.cls, location, epoch), row)
                inserted += 1
                continue
            e = tx.entry_of(obj)
            changed = False
            for n, value in row.items():
                current = e.state[n]
                if current == value and type(current) is type(value):
                    continue
                if fields[n].kind == "ref" and current == value:
                    continue
                tx.write_field(e, n, value)
                changed = True
            updated += changed
        if stream is not None:  # (written even when no row changed: a replay then skips)
            counts = {"inserted": inserted - before[0], "updated": updated - before[1]}
            record_chunk(tx, location, *stream, counts)
    return {"inserted": inserted, "updated": updated, "replayed": replayed}


__all__ = [
    "ROUTING_OFF",
    "key_values",
    "partitions_of",
    "refusal",
    "route",
    "upsert_branch",
]
