"""The streaming sink's exactly-once records under routing by partition (data-path.md §6.7).

Under node routing a stream's records are per node (``s/<stream>``, ``t/<tag>``
in the ``bulk`` database, :mod:`nonstop.bulk.handlers`): a node's store holds
them and nothing replicates them.  Under routing by partition a failover moves
a partition to a replica whose store never saw them, so a replayed micro-batch
would be applied again there.  Here they are **records of a partition**, kept
in the ``bulk`` database under the partition's location and written in the
transaction of the rows they describe, so that they ride that transaction's
replicated write set (``m:<key hex>`` in the partition's write set,
:func:`mark_records`, ``node/replica_store.py``) and are loaded with the
partition's copy on promotion:

=====================================================  ==================================
key (``bulk`` database)                                value
=====================================================  ==================================
``m/<location>/<stream>\\0b``                          the stream's last committed
                                                       micro-batch id in this partition
``m/<location>/<stream>\\0t<batch (8 bytes)><tag>``    a chunk of an uncommitted
                                                       micro-batch applied here:
                                                       ``{"inserted", "updated"}``
=====================================================  ==================================

(``<location>`` is the partition's 8-byte location code.)

* :func:`g_chunk_applied` -- in the chunk's transaction (``branch.upsert`` with
  ``stream``), per partition: read-lock the partition's mark and write-lock the
  chunk's tag; the chunk's rows of that partition are skipped when its
  micro-batch is committed there already or the tag is recorded (a replay);
* :func:`g_record_chunk` -- the tag, written with the rows;
* :func:`g_commit_stream` -- ``branch.stream.commit``: per partition, the mark
  moves to the batch (never back) and the tags of batches up to it go.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nonstop.bulk import swap_apply
from nonstop.bulk.handlers import Steps
from nonstop.errors import BadArgument
from nonstop.model.codec import pack, unpack
from nonstop.model.ref import LOCATION_BYTES, REF_SIZE, location_prefix
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.tx.async_transaction import AsyncTransaction
    from nonstop.tx.transaction import Transaction

PREFIX = b"m/"
"""Key prefix of every stream record of a partition in the ``bulk`` database."""
WRITE_SET_KEY = "m:"
"""Write-set key prefix of such a record (``m:<bulk key hex>``, module doc)."""
MAX_NAME = 200
"""Longest stream id or chunk tag, in bytes (a key of the ``bulk`` database)."""
_NEED = "need"
_BATCH = 8


def _name(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise BadArgument(f"the stream's {what} must be a non-empty string")
    raw = value.encode()
    if b"\0" in raw or len(raw) > MAX_NAME:
        raise BadArgument(f"the stream's {what} must be at most {MAX_NAME} bytes, without NUL")
    return raw


def stream_id(value: Any) -> str:
    """A stream's id, checked (a part of the ``bulk`` keys of its records)."""
    _name(value, "id")
    return str(value)


def batch_arg(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 63:
        raise BadArgument("a micro-batch id is an int >= 0")
    return value


def stream_arg(value: Any) -> tuple[str, int, str]:
    """``stream`` of ``tx.upsert`` / ``branch.upsert``: ``[stream id, batch id, chunk tag]``."""
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise BadArgument("'stream' must be [stream id, micro-batch id, chunk tag]")
    stream, batch, tag = value
    _name(stream, "id")
    _name(tag, "chunk tag")
    return stream, batch_arg(batch), tag


def _base(location: int, stream: str) -> bytes:
    return PREFIX + location_prefix(location) + _name(stream, "id") + b"\0"


def mark_key(location: int, stream: str) -> bytes:
    return _base(location, stream) + b"b"


def tag_key(location: int, stream: str, batch: int, tag: str) -> bytes:
    return _tags(location, stream) + batch.to_bytes(_BATCH, "big") + _name(tag, "chunk tag")


def _tags(location: int, stream: str) -> bytes:
    return _base(location, stream) + b"t"


def location_ref(key: bytes) -> bytes:
    """A reference of the location a record's key names (for ``partition_of``)."""
    return key[len(PREFIX) : len(PREFIX) + LOCATION_BYTES] + bytes(REF_SIZE - LOCATION_BYTES)


def location_keys(store: Any, location: int) -> list[bytes]:
    """Every stream record of ``location`` in the store's ``bulk`` database."""
    return swap_apply.keys_with(store, PREFIX + location_prefix(location))


def mark_records(tx: Transaction) -> list[list[Any]]:
    """What ``tx`` writes of partitions' stream records, as replication records
    ``["m", key, value or None]`` (None: deleted)."""
    bulk = swap_apply.bulk_db(tx.engine.store)
    return [
        ["m", bytes(key), bytes(value) if is_put and value is not None else None]
        for is_put, db, key, value in tx.raw_ops()
        if db is bulk and bytes(key[: len(PREFIX)]) == PREFIX
    ]


def last_batch(tx: Transaction | AsyncTransaction, location: int, stream: str) -> int | None:
    """The stream's last committed micro-batch id in the partition at ``location``."""
    bulk = swap_apply.bulk_db(tx.db.engine.store)
    raw = tx.db.engine.get_raw(bulk, mark_key(location, stream))
    return None if raw is None else int(unpack(bytes(raw)))


def g_chunk_applied(
    tx: Transaction | AsyncTransaction, location: int, stream: str, batch: int, tag: str
) -> Steps:
    """Steps: whether the chunk's rows of this partition are in already (module doc).
    The locks stay until the transaction ends: a commit of the stream waits for the
    chunks being written, and two attempts of one chunk take turns."""
    yield (_NEED, (("bulk", mark_key(location, stream)), LockMode.READ), {})
    last = last_batch(tx, location, stream)
    if last is not None and batch <= last:
        return True
    slot = tag_key(location, stream, batch, tag)
    yield (_NEED, (("bulk", slot), LockMode.WRITE), {})
    bulk = swap_apply.bulk_db(tx.db.engine.store)
    return tx.db.engine.get_raw(bulk, slot) is not None


def record_chunk(
    tx: Transaction | AsyncTransaction,
    location: int,
    stream: str,
    batch: int,
    tag: str,
    counts: dict[str, int],
) -> None:
    """The chunk's tag in this partition, in the transaction of its rows."""
    bulk = swap_apply.bulk_db(tx.db.engine.store)
    tx.write_raw([(True, bulk, tag_key(location, stream, batch, tag), pack(counts))])


def g_commit_stream(
    tx: Transaction | AsyncTransaction, locations: list[int], stream: str, batch: int
) -> Steps:
    """Steps of ``branch.stream.commit`` (module doc); replies ``{"partitions", "moved"}``.
    The marks are locked in the order given: the coordinator's, partition name order, as
    ``branch.upsert`` takes them (so a late chunk and a commit cannot deadlock)."""
    store = tx.db.engine.store
    bulk = swap_apply.bulk_db(store)
    moved = 0
    for location in locations:
        key = mark_key(location, stream)
        yield (_NEED, (("bulk", key), LockMode.WRITE), {})
        last = last_batch(tx, location, stream)
        ops: list[tuple[bool, Any, bytes, bytes | None]] = []
        if last is None or batch > last:
            ops.append((True, bulk, key, pack(batch)))
            moved += 1
        ops += [(False, bulk, k, None) for k in _tags_upto(store, location, stream, batch)]
        if ops:
            tx.write_raw(ops)
    return {"partitions": len(locations), "moved": moved}


def _tags_upto(store: Any, location: int, stream: str, batch: int) -> Iterator[bytes]:
    prefix = _tags(location, stream)
    for key in swap_apply.keys_with(store, prefix):
        if int.from_bytes(key[len(prefix) : len(prefix) + _BATCH], "big") <= batch:
            yield key


__all__ = [
    "PREFIX",
    "WRITE_SET_KEY",
    "batch_arg",
    "g_chunk_applied",
    "g_commit_stream",
    "last_batch",
    "location_keys",
    "location_ref",
    "mark_key",
    "mark_records",
    "record_chunk",
    "stream_arg",
    "stream_id",
    "tag_key",
]
