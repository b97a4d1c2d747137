"""The object store behind the replication machine on a real node (replication.md §10c).

The replication machine (:mod:`nonstop.replication`) keeps its own copy of each
partition (``rep/`` keys) and speaks in **write sets**: ``<ref hex>`` ->
``[type name, version, packed state]`` (``None``: deleted).  The node's object
store (LMDB, :mod:`nonstop.tx`) is the copy clients read.  This module moves
data between the two:

* :func:`partition_write_sets` -- what a transaction writes, split by partition,
  from :func:`~nonstop.tx.replica.write_set_records` (whole states, so a write
  set needs no earlier one to be applied);
* :func:`replicated_commit` -- a one-node commit that waits for its write sets
  to be on every in-sync sync replica (``replicate``) before the store commit,
  holding the transaction's locks throughout; a refusal rolls it back;
* :func:`load_copy` -- when the node starts acting for a partition (promotion,
  handover after a restore) the store takes the machine's copy of it: every
  object of the copy as a ``c`` record (applied only over an older version),
  every object of the partition's location the copy lacks deleted, in store
  transactions of :data:`LOAD_BATCH` records
  (:func:`~nonstop.tx.replica.apply_write_set_async`) with the event loop run between
  them: the node does not serve the partition until the whole load is done
  (``ready``), and a load cut short is done again from the machine's durable copy
  (each record is idempotent), so batches cost no atomicity a reader could see, and
  the loop keeps answering keep-alives (one transaction of a 6,600-object partition,
  five at once, stalled it 0.6-3 s under load: its peers saw it Down);
* :func:`install` -- a prepared record resolved as committed at promotion: its
  after-images into the store.

Request records (H2, docs/design/requests.md) ride in the same write sets:
``r:<results key hex>`` -> the packed result (None: deleted), in every partition
the transaction writes on this node (:func:`~nonstop.tx.requests.result_records`);
a load or an install writes them to the store's ``results`` database in one
transaction of their own, before the objects.

Queued asynchronous calls and timers (A6, D20; ha.md "Queued calls and timers move
with their partition") ride the same way: ``q:<queue key hex>`` -> the packed call
(None: it ran), in the write set of the partition of the call's target
(:func:`~nonstop.tx.asyncmethods.queue_records`).  A load makes the store's queue of
the partition's location the copy's (puts, and deletes of entries the copy lacks) in
the same transaction as the request records; the node's dispatcher then picks them up
(``nonstop.node.replicated_calls``).

A streaming sink's records of a partition (its last committed micro-batch, the tags
of the chunks applied since: :mod:`nonstop.bulk.stream_marks`, data-path.md §6.7) ride
the same way: ``m:<bulk key hex>`` -> the packed value (None: deleted), in the write set
of the partition the key names.  A load makes the store's records of the partition's
location the copy's, in the same transaction as the request records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from nonstop.bulk.stream_marks import WRITE_SET_KEY as MARK_KEY
from nonstop.bulk.stream_marks import location_keys, location_ref
from nonstop.bulk.swap_apply import bulk_db
from nonstop.dataplane.replicated_records import side_records
from nonstop.model.ref import REF_SIZE, Ref, location_prefix
from nonstop.store.group_commit import Op as StoreOp
from nonstop.tx import gc_hold
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.database import Database
from nonstop.tx.entries import TxState
from nonstop.tx.replica import apply_write_set_async, copy_batch, entry_records

WriteSets = dict[str, dict[str, Any]]
"""Partition -> its write set (module doc)."""

RESULT_KEY = "r:"
"""Write-set key prefix of a request record (module doc)."""
QUEUE_KEY = "q:"
"""Write-set key prefix of a queued asynchronous call or timer (module doc)."""

LOAD_LOCK_TIMEOUT = 30.0
"""Seconds a copy load waits for a lock (an in-doubt branch of this node's participant)."""
LOAD_BATCH = 500
"""Records per store transaction of a load (module doc): a few milliseconds of the loop."""


def partition_write_sets(
    records: list[list[Any]], partition_of: Callable[[bytes], str | None]
) -> WriteSets:
    """``write_set_records`` output -> one write set per partition; objects outside every
    partition (a node's own location) are not replicated."""
    sets: WriteSets = {}
    results: dict[str, Any] = {}
    _split(records, partition_of, sets, results)
    return _with_results(sets, results)


SPLIT_SLICE = 5000
"""Records split by partition per loop turn (:func:`partition_write_sets_sliced`)."""


async def partition_write_sets_sliced(
    records: list[list[Any]], partition_of: Callable[[bytes], str | None]
) -> WriteSets:
    """:func:`partition_write_sets`, :data:`SPLIT_SLICE` records per loop turn: a swap's
    400,000 records held the loop in one step (runtime.md, "A busy loop")."""
    sets: WriteSets = {}
    results: dict[str, Any] = {}
    for start in range(0, len(records), SPLIT_SLICE):
        if start:
            await asyncio.sleep(0)  # keep-alives and other clients' ops run between
        _split(records[start : start + SPLIT_SLICE], partition_of, sets, results)
    return _with_results(sets, results)


def _split(
    records: list[list[Any]],
    partition_of: Callable[[bytes], str | None],
    sets: WriteSets,
    results: dict[str, Any],
) -> None:
    for record in records:
        if record[0] == "r":  # a request record: with every partition written (module doc)
            results[RESULT_KEY + record[1].hex()] = record[2]
            continue
        if record[0] == "m":  # a stream record: with the partition it names (module doc)
            partition = partition_of(location_ref(record[1]))
            if partition is not None:
                sets.setdefault(partition, {})[MARK_KEY + record[1].hex()] = record[2]
            continue
        if record[0] == "q":  # a queued call: with its target's partition (module doc)
            key = record[1]
            partition = partition_of(key[:REF_SIZE])
            if partition is not None:
                sets.setdefault(partition, {})[QUEUE_KEY + key.hex()] = record[2]
            continue
        kind, ref, type_name = record[0], record[1], record[2]
        partition = partition_of(ref)
        if partition is None:
            continue
        value = None if kind == "d" else [type_name, record[3], record[4]]
        sets.setdefault(partition, {})[ref.hex()] = value


def _with_results(sets: WriteSets, results: dict[str, Any]) -> WriteSets:
    for writes in sets.values():
        writes.update(results)
    return sets


RECORDS_SLICE = 500
"""Entries whose records are made per loop turn (each packs an object's state: a few
milliseconds of the loop, where a 5,000-row Spark batch held it 0.4 s in one step)."""


async def records_sliced(tx: AsyncTransaction) -> list[list[Any]]:
    """``write_set_records(tx)``, :data:`RECORDS_SLICE` entries per loop turn (the write
    set is final: the transaction is committing, nothing changes its entries)."""
    entries = list(tx.entries())
    out: list[list[Any]] = []
    for start in range(0, len(entries), RECORDS_SLICE):
        if start:
            await asyncio.sleep(0)  # keep-alives and other clients' ops run between
        out.extend(entry_records(entries[start : start + RECORDS_SLICE]))
    return out


async def replicated_commit(
    tx: AsyncTransaction,
    replicate: Callable[[list[list[Any]]], Awaitable[dict[str, Any] | None]],
) -> dict[str, Any] | None:
    """Commit ``tx`` once ``replicate(records)`` returned None (module doc).

    ``replicate`` raises (``NotActive``: nothing replicated, retry; an abort decided) or
    returns the error reply of an outcome not known here (a record failed after it was
    made: it may be on the promoted copy); the transaction is then rolled back, its locks
    released, and that reply returned (``branch.commit`` answers ``{"unknown": reply}``).
    """
    ws = tx._prepare_commit()  # triggers and prepare notifiers: the write set is final
    if ws is None:
        tx._finish(TxState.COMMITTED)
        return None
    try:
        records = await records_sliced(tx)  # (replicated_records, the objects' in slices)
        unknown = await replicate(records + side_records(tx))
    except BaseException:
        tx._finish(TxState.ROLLED_BACK)
        raise
    if unknown is not None:
        tx._finish(TxState.ROLLED_BACK)
        return unknown
    await tx._durable(ws, TxState.COMMITTED)
    return None


def _copy_records(db: Database, values: Mapping[str, Any]) -> list[list[Any]]:
    """``c`` records of a write set's objects; ``d`` records of its deletes that the store
    holds (a delete carries no type: it is read from the store)."""
    return _copy_records_of(db, sorted(values.items()))


async def _copy_records_sliced(db: Database, values: Mapping[str, Any]) -> list[list[Any]]:
    """:func:`_copy_records`, :data:`SPLIT_SLICE` objects per loop turn (a partition's
    whole copy at a promotion: 0.4 s of the loop in one step, runtime.md "A busy loop")."""
    items = sorted(values.items())
    out: list[list[Any]] = []
    for start in range(0, len(items), SPLIT_SLICE):
        if start:
            await asyncio.sleep(0)
        out += _copy_records_of(db, items[start : start + SPLIT_SLICE])
    return out


def _copy_records_of(db: Database, items: list[tuple[str, Any]]) -> list[list[Any]]:
    store = db.engine.store
    out: list[list[Any]] = []
    gone: list[bytes] = []
    for key, value in items:
        if key.startswith((RESULT_KEY, QUEUE_KEY, MARK_KEY)):
            continue  # a request record, a queued call or a stream record: _load_results
        if value is None:
            gone.append(bytes.fromhex(key))
        else:
            type_name, version, packed = value
            out.append(["c", bytes.fromhex(key), type_name, version, packed])
    if gone:
        with store.read() as rtxn:
            for ref in gone:
                raw = rtxn.get(ref, db=store.objects)
                if raw is not None:
                    out.append(["d", ref, store.record(raw, ref)[0]])
    return out


async def _load_results(
    db: Database, values: Mapping[str, Any], queue_of: int | None = None
) -> int:
    """The request records, queued calls and stream records of a write set or a copy into
    the store's ``results``, ``asyncq`` and ``bulk``; with ``queue_of`` (a location:
    ``values`` is that partition's whole copy) the location's queued calls and stream
    records the copy lacks are deleted."""
    store = db.engine.store
    ops: list[StoreOp] = []
    queued: set[bytes] = set()
    marks: set[bytes] = set()
    bulk = None
    for key, value in sorted(values.items()):
        if key.startswith(MARK_KEY):
            raw = bytes.fromhex(key[len(MARK_KEY) :])
            marks.add(raw)
            bulk = bulk or bulk_db(store)
            ops.append((value is not None, bulk, raw, None if value is None else bytes(value)))
            continue
        if key.startswith(RESULT_KEY):
            raw = bytes.fromhex(key[len(RESULT_KEY) :])
            ops.append(
                (value is not None, store.results, raw, None if value is None else bytes(value))
            )
        elif key.startswith(QUEUE_KEY):
            raw = bytes.fromhex(key[len(QUEUE_KEY) :])
            queued.add(raw)
            ops.append(
                (value is not None, store.asyncq, raw, None if value is None else bytes(value))
            )
    if queue_of is not None:
        stale = [k for k in location_keys(store, queue_of) if k not in marks]
        if stale:
            bulk = bulk or bulk_db(store)
            ops += [(False, bulk, k, None) for k in stale]
        prefix = location_prefix(queue_of)
        with store.read() as rtxn:
            cursor = rtxn.cursor(db=store.asyncq)
            if cursor.set_range(prefix):
                for held in cursor.iternext(keys=True, values=False):
                    key_held = bytes(held)
                    if not key_held.startswith(prefix):
                        break
                    if key_held not in queued:
                        ops.append((False, store.asyncq, key_held, None))
    if ops:
        async with db.transaction(lock_timeout=LOAD_LOCK_TIMEOUT) as tx:
            tx.write_raw(ops)
    return len(ops)


async def load_copy(db: Database, location: int, values: Mapping[str, Any]) -> int:
    """The store's objects of ``location`` become the machine's copy ``values`` (module
    doc); the number of records applied.  The cyclic collector is paused meanwhile, as
    under a swap (``tx/gc_hold.py``): a full collection over a promoted node's heap held
    its loop 0.4-0.8 s between two batches (``bench/results/spark-partitions.md``)."""
    with gc_hold.paused():
        return await _load_copy(db, location, values)


async def _load_copy(db: Database, location: int, values: Mapping[str, Any]) -> int:
    loaded = await _load_results(db, values, queue_of=location)
    records = await _copy_records_sliced(db, values)
    after: bytes | None = None
    while True:
        batch, after = copy_batch(db.engine, location, after, LOAD_BATCH)
        for record in batch:
            if record[1].hex() not in values:
                records.append(["d", record[1], record[2]])
        if after is None:
            break
        await asyncio.sleep(0)  # between reads of the store: the loop runs
    for start in range(0, len(records), LOAD_BATCH):
        chunk = records[start : start + LOAD_BATCH]
        await apply_write_set_async(db, chunk, lock_timeout=LOAD_LOCK_TIMEOUT)
        await asyncio.sleep(0)  # keep-alives and other partitions' traffic between batches
    return loaded + len(records)


async def install(db: Database, writes: Mapping[str, Any]) -> None:
    """A committed prepared record's after-images into the store (module doc)."""
    await _load_results(db, writes)
    records = _copy_records(db, writes)
    if records:
        await apply_write_set_async(db, records, lock_timeout=LOAD_LOCK_TIMEOUT)


def location_of(ref: bytes) -> int:
    return Ref(ref).location


__all__ = [
    "QUEUE_KEY",
    "RESULT_KEY",
    "WriteSets",
    "install",
    "load_copy",
    "location_of",
    "partition_write_sets",
    "partition_write_sets_sliced",
    "replicated_commit",
]
