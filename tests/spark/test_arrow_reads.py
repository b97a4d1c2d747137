"""The reader's Arrow batches, field kind by field kind, and filters the node applies.

Spark takes a ``pyarrow.RecordBatch`` from ``DataSourceReader.read`` as is only if
its schema is exactly the one Spark derives from the source's schema (types and
nullability), so each kind is checked here at that level, in this process, with
no Spark session: the values written, the exact Arrow type, None kept.  Spark's
own round trip of every kind is ``test_source.test_round_trip_every_field_kind``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan, StringStartsWith
from pyspark.sql.pandas.types import to_arrow_schema

from nonstop.bulk.handlers import decode_rows, encode_rows
from nonstop.client.bulk import BulkClient
from nonstop.spark.source import NonstopFilteringDataSource, NonstopReader
from tests.spark.conftest import Endpoint, free_port

ITEM = "pipe.Item"
MADE = dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, list[Any]]]]:
    """One bulk endpoint holding three items whose fields take every kind's edge values
    (None in each optional field); the columns as written."""
    folder: Path = tmp_path_factory.mktemp("arrow-reads")
    ep = Endpoint(folder / "n1", "n1", free_port(), [])
    try:
        with BulkClient(ep.address) as c:
            c.call("bulk.upsert", type="pipe.Owner", rows=encode_rows({"name": ["ann"]}))
            reply = c.call("bulk.scan", type="pipe.Owner", fields=["_ref"])
            ann = str(decode_rows(reply["rows"], "columns")["_ref"][0])
            cols: dict[str, list[Any]] = {
                "sku": ["a", "b", "c"],
                "qty": [1, -(2**62), 2**63 - 1],
                "price": [1.5, -0.25, 1e300],
                "active": [True, False, True],
                "label": ["x", None, "ü-€"],
                "blob": [b"\x00\xff", None, b""],
                "made": [MADE, None, dt.datetime(1970, 1, 1, tzinfo=dt.UTC)],
                "day": [dt.date(2020, 2, 29), None, dt.date(1, 1, 1)],
                "cost": [Decimal("12.345"), None, Decimal("-0.000000000000000001")],
                "owner": [ann, None, ann],
            }
            c.call("bulk.upsert", type=ITEM, rows=encode_rows(cols))
        yield ep.address, cols
    finally:
        ep.stop()


def read_all(reader: Any) -> list[pa.RecordBatch]:
    assert isinstance(reader, NonstopReader)
    return [b for split in reader.partitions() for b in reader.read(split)]


def source(address: str, **options: str) -> NonstopFilteringDataSource:
    return NonstopFilteringDataSource({"cluster": address, "type": ITEM, **options})


@pytest.mark.parametrize(
    "field", ["sku", "qty", "price", "active", "label", "blob", "made", "day", "cost", "owner"]
)
def test_each_field_kind_reads_as_the_arrow_column_spark_expects(
    written: tuple[str, dict[str, list[Any]]], field: str
) -> None:
    address, cols = written
    ds = source(address, fields=f"sku,{field}" if field != "sku" else "sku")
    schema = ds.schema()
    batches = read_all(ds.reader(schema))
    expected = to_arrow_schema(schema, timezone="UTC")  # what Spark checks batches against
    assert batches and all(b.schema.equals(expected) for b in batches)
    table = pa.Table.from_batches(batches)
    got = dict(zip(table.column("sku").to_pylist(), table.column(field).to_pylist(), strict=True))
    assert got == dict(zip(cols["sku"], cols[field], strict=True))
    assert [type(v) for v in got.values() if v is not None] == [
        type(v) for v in cols[field] if v is not None
    ]


def test_the_reference_column_reads_as_text(written: tuple[str, dict[str, list[Any]]]) -> None:
    address, _ = written
    ds = source(address, fields="sku", refs="true")
    schema = ds.schema()
    table = pa.Table.from_batches(read_all(ds.reader(schema)))
    assert table.schema.field("_ref").type == pa.string()
    refs = table.column("_ref").to_pylist()
    assert len(set(refs)) == 3 and all(isinstance(r, str) and r.count("-") == 2 for r in refs)


def test_pushed_filters_are_applied_by_the_node(written: tuple[str, dict[str, list[Any]]]) -> None:
    """What ``pushFilters`` takes, the node evaluates: the batches hold only matching
    rows (Spark evaluates only what it is given back)."""
    address, _ = written

    def read(filters: list[Any]) -> tuple[list[str], list[Any]]:
        ds = source(address, fields="sku,qty,label")
        reader = ds.reader(ds.schema())
        left = list(reader.pushFilters(filters))
        rows = pa.Table.from_batches(read_all(reader)).column("sku").to_pylist()
        return sorted(rows), left

    assert read([EqualTo(("sku",), "b")]) == (["b"], [])
    assert read([GreaterThanOrEqual(("qty",), 1), LessThan(("qty",), 10)]) == (["a"], [])
    assert read([In(("sku",), ("a", "c", "zz"))]) == (["a", "c"], [])
    assert read([EqualTo(("label",), "x")]) == (["a"], [])  # NULL never matches
    starts = StringStartsWith(("sku",), "a")
    assert read([starts]) == (["a", "b", "c"], [starts])  # not pushed: left to Spark
