"""The node-side bulk operations (bulk/handlers.py) in-process: no network, no Spark."""

from __future__ import annotations

import datetime as dt
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import nonstop
from nonstop.bulk import swap_apply
from nonstop.bulk.handlers import HANDLERS, BulkContext, decode_rows, encode_rows, handle
from nonstop.errors import (
    BadArgument,
    DuplicateKey,
    FieldError,
    KeyTooLong,
    SchemaError,
    TypeVersionMismatch,
    UnknownType,
)
from tests.spark.model import Item, Keyless, Owner, Tagged

T = "pipe.Item"
SWAP_PATHS = pytest.mark.parametrize(
    "T",
    ["pipe.Item", "pipe.Plain", "pipe.Plain"],
    ids=["per-object-swap", "bounded-swap", "fast-swap"],
)
"""Overwrite tests run on the three swaps: Item has a reference (per object), Plain
does not (the bounded swap of bulk/swap_apply.py; with it turned off, the fast swap)."""


@pytest.fixture(autouse=True)
def _swap_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The "fast-swap" runs turn the bounded swap off (a type it does not cover)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.id.endswith("fast-swap"):
        monkeypatch.setattr(swap_apply, "covered_key", lambda info: None)


@pytest.fixture
def ctx(tmp_path: Path) -> Any:
    db = nonstop.open(tmp_path / "s", durability="none", lock_timeout=10.0)
    yield BulkContext(db, "n1")
    db.close()


def op(ctx: BulkContext, name: str, **payload: Any) -> Any:
    return handle(ctx, {"op": name, **payload})


def arrow_rows(cols: dict[str, list[Any]], types: dict[str, pa.DataType] | None = None) -> bytes:
    arrays = {n: pa.array(v, type=(types or {}).get(n)) for n, v in cols.items()}
    batch = pa.RecordBatch.from_pydict(arrays)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as out:
        out.write_batch(batch)
    return sink.getvalue().to_pybytes()


def read_all(ctx: BulkContext, type_name: str = T, **kw: Any) -> dict[str, list[Any]]:
    reply = op(ctx, "bulk.scan", type=type_name, **kw)
    return decode_rows(reply["rows"], kw.get("format", "columns"))


def count(ctx: BulkContext, cls: type) -> int:
    with ctx.db.transaction() as tx:
        return tx.count(cls)


def test_upsert_then_scan_every_field_kind_both_formats(ctx: BulkContext) -> None:
    with ctx.db.transaction() as tx:
        ann = tx.ref(tx.create(Owner, name="ann"))
    made = dt.datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)
    cols = {
        "sku": ["a", "b"],
        "qty": [1, -(2**62)],
        "price": [1.5, -0.25],
        "active": [True, False],
        "label": ["x", None],
        "blob": [b"\x00\xff", None],
        "made": [made, None],
        "day": [dt.date(2020, 2, 29), None],
        "cost": [Decimal("12.345"), None],
        "owner": [str(ann), None],
    }
    for fmt in ("columns", "arrow"):
        rows = encode_rows(cols) if fmt == "columns" else arrow_rows(cols)
        first = op(ctx, "bulk.upsert", type=T, rows=rows, format=fmt)
        assert first["inserted"] + first["updated"] == (2 if fmt == "columns" else 0)
    for fmt in ("columns", "arrow"):
        got = read_all(ctx, format=fmt, fields=[*cols, "_ref"])
        assert got["sku"] == ["a", "b"] and got["qty"] == cols["qty"]
        assert got["price"] == cols["price"] and got["active"] == cols["active"]
        assert got["label"] == ["x", None] and got["blob"] == [b"\x00\xff", None]
        assert got["made"][0] == made and got["made"][1] is None
        assert got["day"] == cols["day"] and got["cost"][0] == Decimal("12.345")
        assert [str(r) if r is not None else None for r in got["owner"]] == [str(ann), None]
        assert len({str(r) for r in got["_ref"]}) == 2
    with ctx.db.transaction() as tx:
        a = tx.get(Item, sku="a")
        assert a.owner is not None and a.owner.name == "ann" and a.made == made
        assert tx.query(Item).where(label="x").all() == [a]  # the index was maintained


def test_upsert_updates_by_key_and_keeps_other_fields(ctx: BulkContext) -> None:
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["a", "b"], "qty": [1, 2]}))
    r = op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["b", "c"], "price": [9.0, 3.0]}))
    assert (r["inserted"], r["updated"]) == (1, 1)
    got = read_all(ctx, fields=["sku", "qty", "price"])
    assert got == {"sku": ["a", "b", "c"], "qty": [1, 2, 0], "price": [0.0, 9.0, 3.0]}
    same = op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["b"], "price": [9.0]}))
    assert (same["inserted"], same["updated"]) == (0, 0)  # no change, no new version


def test_a_repeated_tag_changes_nothing(ctx: BulkContext) -> None:
    rows = encode_rows({"sku": ["a"], "qty": [1]})
    assert not op(ctx, "bulk.upsert", type=T, rows=rows, tag="job/0/0")["replayed"]
    with ctx.db.transaction() as tx:
        tx.get(Item, sku="a").qty = 50  # someone changes it in between
    again = op(ctx, "bulk.upsert", type=T, rows=rows, tag="job/0/0")
    assert again["replayed"] and again["inserted"] == 1
    assert read_all(ctx, fields=["qty"])["qty"] == [50]
    assert op(ctx, "bulk.forget", prefix="job/")["forgotten"] == 1
    assert not op(ctx, "bulk.upsert", type=T, rows=rows, tag="job/0/0")["replayed"]
    assert read_all(ctx, fields=["qty"])["qty"] == [1]


def test_concurrent_same_tag_applies_once(ctx: BulkContext) -> None:
    rows = encode_rows({"sku": [f"k{i}" for i in range(300)], "qty": list(range(300))})
    results: list[Any] = []

    def go() -> None:
        results.append(op(ctx, "bulk.upsert", type=T, rows=rows, tag="same"))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r["replayed"] for r in results) == [False, True, True, True]
    assert count(ctx, Item) == 300


@pytest.mark.parametrize(
    ("cols", "error", "words"),
    [
        ({"sku": ["a"], "nope": [1]}, FieldError, "'nope' are not fields of pipe.Item"),
        ({"qty": [1]}, FieldError, "no column 'sku'"),
        ({"sku": ["a"], "qty": ["ten"]}, FieldError, "pipe.Item.qty takes int"),
        ({"sku": ["a", None]}, FieldError, "null in key column pipe.Item.sku"),
        ({"sku": ["a", "b", "a"]}, DuplicateKey, "appears twice in one batch"),
        ({"sku": ["a"], "owner": ["0-0-0"]}, FieldError, "no object with reference"),
        ({"sku": ["a"], "owner": ["garbage"]}, FieldError, "not a nonstop reference"),
        ({"sku": ["a", "b"], "qty": [1]}, BadArgument, "different lengths"),
        ({"sku": ["k" * 600]}, KeyTooLong, "limit is 480 bytes"),
        ({"sku": ["a", "b"], "label": ["ok", "L" * 600]}, KeyTooLong, "limit is 480 bytes"),
    ],
)
def test_bad_rows_write_nothing(
    ctx: BulkContext, cols: dict[str, Any], error: type, words: str
) -> None:
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["z"], "qty": [7]}))
    with pytest.raises(error, match=words):
        op(ctx, "bulk.upsert", type=T, rows=encode_rows(cols), tag="bad")
    assert read_all(ctx, fields=["sku", "qty"]) == {"sku": ["z"], "qty": [7]}
    # The failed batch's tag was not recorded: a fixed batch with it still applies.
    ok = op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["y"]}), tag="bad")
    assert not ok["replayed"] and count(ctx, Item) == 2


def test_a_bad_row_late_in_a_batch_rolls_back_the_earlier_ones(ctx: BulkContext) -> None:
    with ctx.db.transaction() as tx:
        tx.create(Item, sku="taken", label="L")
    # 100 good creates and an update of an existing object, then a value of the wrong type.
    cols = {"sku": [f"n{i}" for i in range(100)] + ["taken"], "qty": [1] * 100 + [2.5]}
    with pytest.raises(FieldError):
        op(ctx, "bulk.upsert", type=T, rows=encode_rows(cols))
    assert count(ctx, Item) == 1


def test_bad_requests(ctx: BulkContext) -> None:
    rows = encode_rows({"sku": ["a"]})
    with pytest.raises(UnknownType, match=r"no\.such\.Type"):
        op(ctx, "bulk.scan", type="no.such.Type")
    with pytest.raises(UnknownType):
        op(ctx, "bulk.upsert", type="no.such.Type", rows=rows)
    # Said from the client's side: the NODES do not know it; the closest known name.
    with pytest.raises(UnknownType) as unknown:
        op(ctx, "bulk.schema", type="pipe.Iten")
    message = str(unknown.value)
    assert message.startswith("node ") and "does not know the managed type 'pipe.Iten'" in message
    assert "closest: 'pipe.Item'" in message and "known types: " in message
    assert "pipe.Owner" in message and "import its module" not in message
    with pytest.raises(TypeVersionMismatch):
        op(ctx, "bulk.scan", type=T, tv=7)
    with pytest.raises(FieldError, match="no field"):
        op(ctx, "bulk.scan", type=T, fields=["sku", "ghost"])
    with pytest.raises(SchemaError, match="no unique key"):
        op(ctx, "bulk.upsert", type="pipe.Keyless", rows=encode_rows({"value": [1]}))
    with pytest.raises(BadArgument, match="not a unique key"):
        op(ctx, "bulk.upsert", type=T, rows=rows, key="qty")
    with pytest.raises(BadArgument, match="unknown bulk op"):
        op(ctx, "bulk.explode", type=T)
    with pytest.raises(BadArgument, match="format"):
        op(ctx, "bulk.scan", type=T, format="csv")
    with pytest.raises(BadArgument, match="not an Arrow IPC stream"):
        op(ctx, "bulk.upsert", type=T, rows=b"garbage", format="arrow")
    with pytest.raises(BadArgument, match="'rows' must be bytes"):
        op(ctx, "bulk.upsert", type=T, rows=[1, 2])
    with pytest.raises(SchemaError, match=r"pipe\.Tagged\.extra is a dict field"):
        op(ctx, "bulk.scan", type="pipe.Tagged", format="arrow")
    with pytest.raises(BadArgument, match="filter"):
        op(ctx, "bulk.scan", type=T, filters=[["sku", "like", "a%"]])
    assert count(ctx, Item) == 0
    assert Keyless and Tagged  # imported for their registration


def test_plan_splits_and_scan_resumes(ctx: BulkContext) -> None:
    n = 1000
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": [f"s{i:04}" for i in range(n)]}))
    plan = op(ctx, "bulk.plan", type=T, splits=4)
    assert plan["count"] == n and len(plan["ranges"]) == 4 and plan["snapshot"] > 0
    assert plan["ranges"][0][0] is None and plan["ranges"][-1][1] is None
    seen: list[str] = []
    for lo, hi in plan["ranges"]:
        part = read_all(ctx, fields=["sku"], lo=lo, hi=hi)["sku"]
        assert 200 <= len(part) <= 300
        seen += part
    assert sorted(seen) == [f"s{i:04}" for i in range(n)]
    capped = op(ctx, "bulk.plan", type=T, splits=1, max_rows=300)
    assert len(capped["ranges"]) == 4
    # Resume with `after`, a page at a time.
    pages, after = [], None
    while True:
        reply = op(ctx, "bulk.scan", type=T, fields=["sku"], limit=333, after=after)
        pages.append(reply["n"])
        after = reply["next"]
        if after is None:
            break
    assert sum(pages) == n and pages[0] == 333
    empty = op(ctx, "bulk.plan", type="pipe.Owner", splits=3)
    assert empty["count"] == 0 and empty["ranges"] == [[None, None]]


def test_scan_filters(ctx: BulkContext) -> None:
    cols = {"sku": [f"s{i}" for i in range(20)], "qty": list(range(20))}
    cols["label"] = ["even" if i % 2 == 0 else None for i in range(20)]
    op(ctx, "bulk.upsert", type=T, rows=encode_rows(cols))

    def skus(filters: list[Any]) -> list[str]:
        return sorted(read_all(ctx, fields=["sku"], filters=filters)["sku"])

    assert skus([["sku", "eq", "s7"]]) == ["s7"]
    assert skus([["sku", "eq", "nope"]]) == []
    assert skus([["qty", "ge", 15], ["qty", "lt", 18]]) == ["s15", "s16", "s17"]
    assert skus([["qty", "in", [1, 3, 99]]]) == ["s1", "s3"]
    assert len(skus([["label", "eq", "even"]])) == 10
    assert skus([["label", "gt", "a"], ["qty", "le", 2]]) == ["s0", "s2"]


@SWAP_PATHS
def test_overwrite_swaps_atomically_and_abort_leaves_nothing(ctx: BulkContext, T: str) -> None:
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["old1", "old2"], "qty": [1, 1]}))
    job = op(ctx, "bulk.overwrite.begin", type=T)["job"]
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag="p0", rows=encode_rows({"sku": ["n1"]}))
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag="p1", rows=encode_rows({"sku": ["x"]}))
    # A retried part replaces itself instead of adding rows.
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag="p1", rows=encode_rows({"sku": ["n2"]}))
    assert sorted(read_all(ctx, T, fields=["sku"])["sku"]) == ["old1", "old2"]  # staged: invisible
    done = op(ctx, "bulk.overwrite.commit", type=T, job=job)
    assert (done["deleted"], done["inserted"], done["replayed"]) == (2, 2, False)
    assert sorted(read_all(ctx, T, fields=["sku"])["sku"]) == ["n1", "n2"]
    assert op(ctx, "bulk.overwrite.commit", type=T, job=job)["replayed"]
    assert sorted(read_all(ctx, T, fields=["sku"])["sku"]) == ["n1", "n2"]

    job2 = op(ctx, "bulk.overwrite.begin", type=T)["job"]
    op(ctx, "bulk.overwrite.part", type=T, job=job2, tag="p0", rows=encode_rows({"sku": ["z"]}))
    assert op(ctx, "bulk.overwrite.abort", job=job2)["dropped"] == 2
    with pytest.raises(BadArgument, match="aborted"):
        op(ctx, "bulk.overwrite.commit", type=T, job=job2)
    with pytest.raises(BadArgument, match="aborted or committed"):
        op(ctx, "bulk.overwrite.part", type=T, job=job2, tag="p9", rows=encode_rows({"sku": ["q"]}))
    assert sorted(read_all(ctx, T, fields=["sku"])["sku"]) == ["n1", "n2"]


@SWAP_PATHS
def test_overwrite_with_duplicate_keys_across_parts_changes_nothing(
    ctx: BulkContext, T: str
) -> None:
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["keep"]}))
    job = op(ctx, "bulk.overwrite.begin", type=T)["job"]
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag="a", rows=encode_rows({"sku": ["d"]}))
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag="b", rows=encode_rows({"sku": ["d"]}))
    with pytest.raises(DuplicateKey, match="in two parts"):
        op(ctx, "bulk.overwrite.commit", type=T, job=job)
    assert read_all(ctx, T, fields=["sku"])["sku"] == ["keep"]
    with pytest.raises(FieldError, match="null in key"):
        op(ctx, "bulk.overwrite.part", type=T, job=job, tag="c", rows=encode_rows({"sku": [None]}))


@SWAP_PATHS
def test_overwrite_seen_by_concurrent_snapshot_readers_old_or_new(ctx: BulkContext, T: str) -> None:
    old = [f"o{i}" for i in range(500)]
    new = [f"n{i}" for i in range(700)]
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": old}))
    job = op(ctx, "bulk.overwrite.begin", type=T)["job"]
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag="p", rows=encode_rows({"sku": new}))
    seen: list[frozenset[str]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.append(frozenset(read_all(ctx, T, fields=["sku"])["sku"]))

    t = threading.Thread(target=reader)
    t.start()
    op(ctx, "bulk.overwrite.commit", type=T, job=job)
    for _ in range(3):
        seen.append(frozenset(read_all(ctx, T, fields=["sku"])["sku"]))
    stop.set()
    t.join(10)
    assert set(seen) <= {frozenset(old), frozenset(new)}
    assert frozenset(new) in seen


def test_stream_batches(ctx: BulkContext) -> None:
    assert op(ctx, "bulk.stream.last", stream="s1") == {"batch": None}
    assert op(ctx, "bulk.stream.commit", stream="s1", batch=3) == {"batch": 3}
    assert op(ctx, "bulk.stream.commit", stream="s1", batch=2) == {"batch": 3}  # never back
    assert op(ctx, "bulk.stream.last", stream="s1") == {"batch": 3}
    assert op(ctx, "bulk.stream.last", stream="other") == {"batch": None}
    with pytest.raises(BadArgument):
        op(ctx, "bulk.stream.commit", stream="s1", batch=-1)


def test_bookkeeping_survives_a_restart(tmp_path: Path) -> None:
    db = nonstop.open(tmp_path / "r")
    ctx = BulkContext(db, "n")
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["a"]}), tag="t1")
    op(ctx, "bulk.stream.commit", stream="s", batch=9)
    db.close()
    db = nonstop.open(tmp_path / "r")
    ctx = BulkContext(db, "n")
    assert op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["a"]}), tag="t1")["replayed"]
    assert op(ctx, "bulk.stream.last", stream="s") == {"batch": 9}
    db.close()


def test_schema_and_handler_table(ctx: BulkContext) -> None:
    s = op(ctx, "bulk.schema", type=T)
    assert s["unique"] == ["sku"] and s["fields"]["cost"] == ["decimal", True]
    assert s["count"] == 0
    assert {"bulk.plan", "bulk.scan", "bulk.upsert", "bulk.overwrite.commit"} <= set(HANDLERS)


@SWAP_PATHS
def test_overwrite_commit_takes_only_the_named_attempts(ctx: BulkContext, T: str) -> None:
    job = op(ctx, "bulk.overwrite.begin", type=T)["job"]
    # Partition 0 failed on attempt 0 after staging a part, then attempt 1 succeeded.
    for tag, sku in (("0/0/0", "stale"), ("0/1/0", "a"), ("0/1/1", "b"), ("1/0/0", "c")):
        op(ctx, "bulk.overwrite.part", type=T, job=job, tag=tag, rows=encode_rows({"sku": [sku]}))
    done = op(ctx, "bulk.overwrite.commit", type=T, job=job, parts=["0/1/", "1/0/"])
    assert done["inserted"] == 3
    assert sorted(read_all(ctx, T, fields=["sku"])["sku"]) == ["a", "b", "c"]
    assert op(ctx, "bulk.overwrite.abort", job=job)["dropped"] == 0  # nothing left staged


def test_upsert_of_a_key_created_concurrently_updates_it(ctx: BulkContext) -> None:
    """The batch reads its absent keys first; a key created (and locked) by another
    transaction before the upsert locks it is found again and updated, not duplicated."""
    holding = threading.Event()

    def creator() -> None:
        with ctx.db.transaction() as tx:
            tx.create(Item, sku="race", qty=1)
            holding.set()
            time.sleep(0.3)  # the upsert's read saw no "race"; it now waits for the lock

    t = threading.Thread(target=creator)
    t.start()
    assert holding.wait(5)
    rows = encode_rows({"sku": ["new", "race"], "qty": [5, 7]})
    r = op(ctx, "bulk.upsert", type=T, rows=rows)
    t.join(5)
    assert (r["inserted"], r["updated"]) == (1, 1)
    assert read_all(ctx, fields=["sku", "qty"]) == {"sku": ["race", "new"], "qty": [7, 5]}
