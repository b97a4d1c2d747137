"""Bulk writes under routing by partition, node side, in process (bulk/partitioned.py).

* ``bulk.route`` maps each row's key with the placement, exactly as a create's
  routing key (``dataplane.placement.routing_key``), and refuses under node routing;
* ``branch.upsert`` (:func:`upsert_branch`) creates each new object in its
  partition at the epoch given (its reference's location names it), updates an
  existing one in place, validates the whole batch before writing anything, and
  leaves transaction entries the replication path sees (``write_set_records``);
* under routing by partition the unreplicated writes (``bulk.upsert``, a swap in one
  store) are refused with one line naming the way that works;
* a streaming sink's chunk (``branch.upsert`` with ``stream``) applies once per
  partition, its records (bulk/stream_marks.py) replicated with the partition and
  loaded with its copy;
* an overwrite's staged part names its partition, and the branch swap of some
  partitions (bulk/partition_swap.py) replaces exactly their objects with
  replicated transaction entries.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import nonstop
from nonstop.bulk.handlers import BulkContext, handle, run_steps_sliced
from nonstop.bulk.partition_swap import overwrite_partitions_branch
from nonstop.bulk.partitioned import key_values, partitions_of, upsert_branch
from nonstop.bulk.stream_marks import (
    WRITE_SET_KEY as MARK_KEY,
)
from nonstop.bulk.stream_marks import (
    g_commit_stream,
    last_batch,
    location_keys,
    mark_key,
)
from nonstop.dataplane.placement import routing_key
from nonstop.dataplane.replicated_records import replicated_records
from nonstop.errors import Aborted, BadArgument, DuplicateKey, FieldError
from nonstop.ha.mapper import ConsistentHashMapper
from nonstop.model.managed import type_info
from nonstop.model.ref import Ref
from nonstop.node.replica_store import load_copy, partition_write_sets
from nonstop.spark.partition_writes import ipc
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.entries import Isolation
from nonstop.tx.replica import write_set_records
from tests.spark.model import Item

PARTS = [f"default.{i}" for i in range(8)]
P0, P1 = 0x1111_0000_0000_0001, 0x2222_0000_0000_0002


class HashPlacement:
    """The default binding's mapper over eight partitions (ha.md §4)."""

    def __init__(self) -> None:
        self.mapper = ConsistentHashMapper()

    def partition_for(self, type_name: str, key: bytes | None) -> str:
        return self.mapper.partition_for(key, PARTS)

    def unique_field(self, type_name: str) -> str | None:
        return "sku"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[nonstop.Database]:
    d = nonstop.open(tmp_path / "s", durability="none", lock_timeout=5.0)
    yield d
    d.close()


def rows(skus: list[Any], qtys: list[int]) -> bytes:
    return ipc(pa.table({"sku": pa.array(skus, pa.string()), "qty": qtys}))


def test_route_maps_each_row_as_a_create_of_its_key_would(db: nonstop.Database) -> None:
    ctx = BulkContext(db, "n1", HashPlacement())
    skus = [f"k{i}" for i in range(40)]
    reply = handle(
        ctx,
        {
            "op": "bulk.route",
            "type": "pipe.Item",
            "key": "sku",
            "rows": rows(skus, list(range(40))),
            "format": "arrow",
        },
    )
    got = [reply["partitions"][i] for i in reply["of"]]
    assert got == [HashPlacement().partition_for("pipe.Item", routing_key(s)) for s in skus]
    assert len(set(got)) > 2
    with pytest.raises(FieldError, match="null in key column"):
        key_values(type_info(Item), type_info(Item).keys["sku"], rows(["a", None], [1, 2]), "arrow")
    # Under node routing there is nothing to map with.
    with pytest.raises(BadArgument, match="routes by node"):
        handle(
            BulkContext(db, "n1"),
            {"op": "bulk.route", "type": "pipe.Item", "rows": rows(["a"], [1]), "format": "arrow"},
        )


def _branch(db: nonstop.Database, payload: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    async def run() -> tuple[dict[str, Any], list[Any]]:
        tx = AsyncTransaction(db, Isolation.SERIALIZABLE, 5.0)
        try:
            reply = await upsert_branch(tx, type_info(Item), payload)
            records = replicated_records(tx)
            await tx.commit()
            return reply, records
        except BaseException:
            await tx.rollback()
            raise

    return asyncio.run(run())


def _stored(db: nonstop.Database) -> dict[str, tuple[int, int, int]]:
    """sku -> (qty, location, epoch of its reference)."""
    with db.transaction() as tx:
        out = {}
        for item in tx.query(Item):
            ref = Ref(tx.ref(item).raw)
            out[item.sku] = (item.qty, ref.location, ref.epoch)
        return out


def test_branch_upsert_creates_in_each_partition_and_updates_in_place(
    db: nonstop.Database,
) -> None:
    base = {"type": "pipe.Item", "key": "sku", "format": "arrow"}
    first = {
        **base,
        "rows": rows(["a", "b", "c"], [1, 2, 3]),
        "parts": [[P0, 4, [0, 2]], [P1, 7, [1]]],
    }
    reply, records = _branch(db, first)
    assert reply == {"inserted": 3, "updated": 0, "replayed": 0}
    assert sorted(r[0] for r in records) == ["c", "c", "c"]  # every create is replicated
    assert _stored(db) == {"a": (1, P0, 4), "b": (2, P1, 7), "c": (3, P0, 4)}

    # Again with one value changed and one new row: an update in place, a create.
    again = {
        **base,
        "rows": rows(["a", "b", "d"], [1, 20, 4]),
        "parts": [[P0, 5, [0, 2]], [P1, 7, [1]]],
    }
    reply, records = _branch(db, again)
    assert reply == {"inserted": 1, "updated": 1, "replayed": 0}
    assert sorted(r[0] for r in records) == ["c", "u"]
    assert _stored(db) == {"a": (1, P0, 4), "b": (20, P1, 7), "c": (3, P0, 4), "d": (4, P0, 5)}

    # A bad batch writes nothing: a duplicate key, a row index out of range.
    with pytest.raises(DuplicateKey):
        _branch(db, {**base, "rows": rows(["e", "e"], [1, 2]), "parts": [[P0, 5, [0, 1]]]})
    with pytest.raises(BadArgument, match="row indices"):
        _branch(db, {**base, "rows": rows(["e"], [1]), "parts": [[P0, 5, [3]]]})
    assert "e" not in _stored(db)


def test_unreplicated_bulk_writes_are_refused_under_partitions(db: nonstop.Database) -> None:
    ctx = BulkContext(db, "n1", HashPlacement())
    payload = {"type": "pipe.Item", "key": "sku", "rows": rows(["a"], [1]), "format": "arrow"}
    with pytest.raises(BadArgument, match=r"write with tx\.upsert"):
        handle(ctx, {"op": "bulk.upsert", **payload})
    with pytest.raises(BadArgument, match="routes by partition"):
        handle(ctx, {"op": "bulk.overwrite.commit", "type": "pipe.Item", "job": "j1"})
    # Node routing keeps them.
    assert handle(BulkContext(db, "n1"), {"op": "bulk.upsert", **payload})["inserted"] == 1


def _swap(
    db: nonstop.Database, job: str, groups: list[list[Any]]
) -> tuple[dict[str, Any], list[Any]]:
    async def run() -> tuple[dict[str, Any], list[Any]]:
        tx = AsyncTransaction(db, Isolation.SERIALIZABLE, 5.0)
        try:
            payload = {"type": "pipe.Item", "job": job, "partitions": groups}
            reply = await overwrite_partitions_branch(tx, type_info(Item), payload)
            records = write_set_records(tx)
            await tx.commit()
            return reply, records
        except BaseException:
            await tx.rollback()
            raise

    return asyncio.run(run())


def test_a_staged_part_names_its_partition_and_the_swap_takes_exactly_its_parts(
    db: nonstop.Database,
) -> None:
    """``bulk.overwrite.part`` under partitions checks each row maps to the part's
    partition; the branch swap (data-path.md §6.6) deletes the type's objects of the
    partitions it is given (and of the own location), creates the parts' rows in their
    partition at the epoch given -- all transaction entries the replication path sees --
    leaves other partitions alone, refuses a missing part, and replays once done."""
    placement = HashPlacement()
    ctx = BulkContext(db, "n1", placement)
    of = {k: placement.partition_for("pipe.Item", routing_key(k)) for k in "abcdefghij"}
    p_a = of["a"]
    same = [k for k in of if of[k] == p_a]
    other = next(k for k in of if of[k] != p_a)
    base = {"type": "pipe.Item", "key": "sku", "format": "arrow", "job": "j1"}
    with pytest.raises(BadArgument, match="'partition' must name"):
        handle(
            ctx, {"op": "bulk.overwrite.part", "tag": "0/0/0/x", "rows": rows(["a"], [1]), **base}
        )
    with pytest.raises(FieldError, match=f"maps to partition {of[other]}, not {p_a}"):
        handle(
            ctx,
            {
                "op": "bulk.overwrite.part",
                "tag": f"0/0/0/{p_a}",
                "partition": p_a,
                "rows": rows(["a", other], [1, 2]),
                **base,
            },
        )
    # Old objects: two in P0 (the partition swapped), one in P1 (another partition).
    _branch(
        db,
        {
            "type": "pipe.Item",
            "key": "sku",
            "format": "arrow",
            "rows": rows(["old1", "old2", "keep"], [1, 2, 3]),
            "parts": [[P0, 4, [0, 1]], [P1, 7, [2]]],
        },
    )
    tag = f"0/0/0/{p_a}"
    assert handle(
        ctx,
        {
            "op": "bulk.overwrite.part",
            "tag": tag,
            "partition": p_a,
            "rows": rows(same, [10] * len(same)),
            **base,
        },
    ) == {"rows": len(same)}
    with pytest.raises(Aborted, match="not on its active node"):
        _swap(db, "j1", [[P0, 5, [tag, "1/0/0/x"]]])
    reply, records = _swap(db, "j1", [[P0, 5, [tag]]])
    assert reply == {"deleted": 2, "inserted": len(same), "replayed": False}
    assert Counter(r[0] for r in records) == Counter({"d": 2, "c": len(same)})
    want = {k: (10, P0, 5) for k in same} | {"keep": (3, P1, 7)}
    assert _stored(db) == want
    assert _swap(db, "j1", [[P0, 5, [tag]]])[0]["replayed"] is True
    assert _stored(db) == want


def test_partitions_of_uses_the_routing_key_of_a_create() -> None:
    placement = HashPlacement()
    values = ["x", "y", "z"]
    assert partitions_of(placement, "pipe.Item", values) == [
        placement.partition_for("pipe.Item", routing_key(v)) for v in values
    ]


def _commit_stream(db: nonstop.Database, locations: list[int], batch: int) -> list[Any]:
    """``branch.stream.commit``'s steps in a transaction of their own; its records."""

    async def run() -> list[Any]:
        tx = AsyncTransaction(db, Isolation.SERIALIZABLE, 5.0)
        await run_steps_sliced(tx, g_commit_stream(tx, locations, "orders", batch))
        records = replicated_records(tx)
        await tx.commit()
        return records

    return asyncio.run(run())


def _last(db: nonstop.Database, location: int) -> int | None:
    with db.transaction() as tx:
        return last_batch(tx, location, "orders")


def test_a_stream_chunk_applies_once_per_partition_and_its_records_ride_the_partition(
    db: nonstop.Database,
) -> None:
    """data-path.md §6.7: a chunk's tag is written per partition with its rows, as a
    replicated record of that partition; the chunk again (a replayed task, other
    values even) changes nothing; the commit moves each partition's mark and drops the
    tags; a chunk of a committed batch is skipped; a promoted store takes the records
    with the copy (and drops its own stale ones)."""
    base = {"type": "pipe.Item", "key": "sku", "format": "arrow"}
    chunk = {
        **base,
        "rows": rows(["a", "b", "c"], [1, 2, 3]),
        "parts": [[P0, 4, [0, 2]], [P1, 7, [1]]],
        "stream": ["orders", 0, "0/0/d1"],
    }
    reply, records = _branch(db, chunk)
    assert reply == {"inserted": 3, "updated": 0, "replayed": 0}
    tags = [r for r in records if r[0] == "m"]
    assert len(tags) == 2 and all(r[2] is not None for r in tags)  # one per partition
    of = {P0: "p0", P1: "p1"}
    sets = partition_write_sets(records, lambda ref: of.get(Ref(ref).location))
    assert [sum(k.startswith(MARK_KEY) for k in sets[p]) for p in ("p0", "p1")] == [1, 1]

    replay = {**chunk, "rows": rows(["a", "b", "c"], [100, 200, 300])}
    assert _branch(db, replay)[0] == {"inserted": 0, "updated": 0, "replayed": 2}
    assert _stored(db) == {"a": (1, P0, 4), "b": (2, P1, 7), "c": (3, P0, 4)}

    committed = _commit_stream(db, [P0, P1], 0)
    assert sorted((r[1] == mark_key(P0, "orders"), r[2] is None) for r in committed) == [
        (False, False),  # P1's mark
        (False, True),  # P0's tag dropped
        (False, True),  # P1's tag dropped
        (True, False),  # P0's mark
    ]
    assert (_last(db, P0), _last(db, P1)) == (0, 0)
    # A chunk of the committed batch (a zombie task, a replay after the commit): skipped.
    late = {**replay, "stream": ["orders", 0, "7/0/d9"]}
    assert _branch(db, late)[0]["replayed"] == 2
    assert _stored(db)["a"] == (1, P0, 4)
    assert _commit_stream(db, [P0], 0) == []  # the mark never moves back: nothing written
    # The next batch applies.
    assert _branch(db, {**late, "stream": ["orders", 1, "0/0/d2"]})[0]["updated"] == 3

    # A promoted store takes P0's records with the copy; its own stale one of P0 goes.
    p0 = partition_write_sets(committed, lambda ref: of.get(Ref(ref).location))["p0"]
    with nonstop.open(Path(db.path).parent / "replica", durability="none") as replica:
        _commit_stream(replica, [P0], 5)  # (stale: not in the copy)
        asyncio.run(load_copy(replica, P0, p0))
        assert _last(replica, P0) == 0
        assert location_keys(replica.engine.store, P0) == [mark_key(P0, "orders")]
