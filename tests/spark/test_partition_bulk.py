"""Bulk writes under routing by partition, node side, in process (bulk/partitioned.py).

* ``bulk.route`` maps each row's key with the placement, exactly as a create's
  routing key (``dataplane.placement.routing_key``), and refuses under node routing;
* ``branch.upsert`` (:func:`upsert_branch`) creates each new object in its
  partition at the epoch given (its reference's location names it), updates an
  existing one in place, validates the whole batch before writing anything, and
  leaves transaction entries the replication path sees (``write_set_records``);
* under routing by partition the unreplicated writes (``bulk.upsert``, a staged
  overwrite) are refused with one line naming the way that works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import nonstop
from nonstop.bulk.handlers import BulkContext, handle
from nonstop.bulk.partitioned import key_values, partitions_of, upsert_branch
from nonstop.dataplane.placement import routing_key
from nonstop.errors import BadArgument, DuplicateKey, FieldError
from nonstop.ha.mapper import ConsistentHashMapper
from nonstop.model.managed import type_info
from nonstop.model.ref import Ref
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
            records = write_set_records(tx)
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
    assert reply == {"inserted": 3, "updated": 0}
    assert sorted(r[0] for r in records) == ["c", "c", "c"]  # every create is replicated
    assert _stored(db) == {"a": (1, P0, 4), "b": (2, P1, 7), "c": (3, P0, 4)}

    # Again with one value changed and one new row: an update in place, a create.
    again = {
        **base,
        "rows": rows(["a", "b", "d"], [1, 20, 4]),
        "parts": [[P0, 5, [0, 2]], [P1, 7, [1]]],
    }
    reply, records = _branch(db, again)
    assert reply == {"inserted": 1, "updated": 1}
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
        handle(ctx, {"op": "bulk.overwrite.begin", "type": "pipe.Item"})
    with pytest.raises(BadArgument, match="routes by partition"):
        handle(ctx, {"op": "bulk.overwrite.part", "job": "j1", "tag": "0/0/0", **payload})
    # Node routing keeps them.
    assert handle(BulkContext(db, "n1"), {"op": "bulk.upsert", **payload})["inserted"] == 1


def test_partitions_of_uses_the_routing_key_of_a_create() -> None:
    placement = HashPlacement()
    values = ["x", "y", "z"]
    assert partitions_of(placement, "pipe.Item", values) == [
        placement.partition_for("pipe.Item", routing_key(v)) for v in values
    ]
