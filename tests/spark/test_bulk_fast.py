"""The bulk upsert's fast path (bulk/fast.py): same result as the per-row path,
serializable against transactions, and bad input writes nothing."""

from __future__ import annotations

import datetime as dt
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop import Managed, field, key
from nonstop.bulk import fast as bulk_fast
from nonstop.bulk.handlers import BulkContext, decode_rows, encode_rows, handle
from nonstop.errors import DuplicateKey, FieldError, ImmutableKey, KeyTooLong
from nonstop.model.managed import type_info


class Acct(Managed, name="fast.Acct"):
    number: int = key(unique=True)
    owner: str = key(ordered=True, mutable=True, default="")
    region: str = key(default="eu")  # immutable, not unique
    balance: int = 0
    note: str | None = None


T = "fast.Acct"


@pytest.fixture
def ctx(tmp_path: Path) -> Any:
    db = nonstop.open(tmp_path / "s", durability="none", lock_timeout=10.0)
    yield BulkContext(db, "n1")
    db.close()


def upsert(ctx: BulkContext, cols: dict[str, list[Any]], **kw: Any) -> Any:
    return handle(ctx, {"op": "bulk.upsert", "type": T, "rows": encode_rows(cols), **kw})


def state(ctx: BulkContext) -> dict[str, Any]:
    """Everything the store holds about the type, with references replaced by key values:
    objects, every index (as (key bytes, number) pairs) and the count."""
    store = ctx.db.engine.store
    info = type_info(Acct)
    out: dict[str, Any] = {}
    number_of: dict[bytes, int] = {}
    objects: dict[int, Any] = {}

    with store.read() as rtxn:
        for ref, raw in rtxn.cursor(db=store.objects):
            tname, _tv, version, st = store.record(raw, ref)
            if tname == T:
                number_of[bytes(ref)] = st["number"]
                objects[st["number"]] = (version, st)
        for name, k in info.keys.items():
            db = store.index_db(k.db_name, unique=k.options.unique)
            out[name] = sorted(
                (bytes(kb), number_of[bytes(r)]) for kb, r in rtxn.cursor(db=db).iternext()
            )
    out["objects"] = objects
    out["count"] = store.count(T)
    with ctx.db.transaction() as tx:
        out["tx.count"] = tx.count(Acct)
        out["by_owner"] = sorted(a.number for a in tx.query(Acct).where(owner="o1").all())
    return out


def test_the_fast_path_covers_plain_types_only() -> None:
    from tests.spark.model import Item, Tagged

    info = type_info(Acct)
    assert bulk_fast.covers(info, info.keys["number"])
    item = type_info(Item)  # a reference field: per row
    assert not bulk_fast.covers(item, item.keys["sku"])
    assert bulk_fast.covers(type_info(Tagged), type_info(Tagged).keys["code"])


def test_indexes_and_records_equal_those_of_the_per_row_path(tmp_path: Path) -> None:
    batches = [
        {"number": list(range(100)), "owner": [f"o{i % 3}" for i in range(100)]},
        # updates (owner moves: the mutable key's index), unchanged rows, new rows
        {
            "number": list(range(50, 150)),
            "owner": [f"o{(i + 1) % 3}" for i in range(50, 150)],
            "balance": list(range(100)),
        },
        {"number": [1, 2, 3, 200], "note": [None, "x", "y", "z"]},
        {"number": [1, 2, 3, 200], "note": [None, "x", "y", "z"]},  # no change at all
    ]
    results = []
    states = []
    for per_row in (False, True):
        db = nonstop.open(tmp_path / f"s{per_row}", durability="none")
        c = BulkContext(db, "n")
        results.append([upsert(c, b, per_row=per_row) for b in batches])
        states.append(state(c))
        db.close()
    assert results[0] == results[1]
    assert [(r["inserted"], r["updated"]) for r in results[0]] == [
        (100, 0),
        (50, 50),
        (1, 2),  # 1 already had no note
        (0, 0),
    ]
    assert states[0] == states[1]
    assert states[0]["count"] == states[0]["tx.count"] == 151
    assert states[0]["objects"][60][0] == 2  # updated once: version 2
    owners = states[0]["by_owner"]  # 52 moved from o1 to o2, 51 from o0 to o1
    assert 1 in owners and 51 in owners and 52 not in owners


@pytest.mark.parametrize(
    ("cols", "error"),
    [
        ({"number": [1, 2], "balance": [1, "two"]}, FieldError),
        ({"number": [1, None]}, FieldError),
        ({"number": [1, 1]}, DuplicateKey),
        ({"number": [1, 9], "nope": [0, 0]}, FieldError),
        ({"number": [1, 9], "owner": ["a", "x" * 600]}, KeyTooLong),
        ({"number": [9, 2], "region": ["eu", "us"]}, ImmutableKey),  # 2 exists: region fixed
        ({"number": [1, 9], "note": [None, 7]}, FieldError),
    ],
)
def test_bad_input_writes_nothing(ctx: BulkContext, cols: dict[str, Any], error: type) -> None:
    upsert(ctx, {"number": [1, 2], "owner": ["a", "b"]})
    before = state(ctx)
    with pytest.raises(error):
        upsert(ctx, cols, tag="bad")
    assert state(ctx) == before
    with ctx.db.engine.store.read() as rtxn:  # the tag was not recorded either
        assert rtxn.get(b"t/bad", db=ctx.db.engine.store.index_db(b"bulk", unique=True)) is None


def test_a_repeated_tag_is_skipped(ctx: BulkContext) -> None:
    assert upsert(ctx, {"number": [1, 2]}, tag="j/1")["inserted"] == 2
    with ctx.db.transaction() as tx:
        tx.get(Acct, number=1).balance = 7
    again = upsert(ctx, {"number": [1, 2], "balance": [0, 0]}, tag="j/1")
    assert again["replayed"] and again["inserted"] == 2
    assert state(ctx)["objects"][1][1]["balance"] == 7


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # handed to the test
            box.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_a_batch_waits_for_a_transaction_holding_its_objects(ctx: BulkContext) -> None:
    """An open transaction updates object 5 and creates object 7 (absent to the batch's
    first read): the batch waits for both, then updates them — no duplicate, and the
    transaction's write is not lost under the batch's (the batch comes second)."""
    upsert(ctx, {"number": [5, 6], "balance": [1, 1]})
    cm = ctx.db.transaction()
    tx = cm.__enter__()
    tx.get(Acct, number=5, lock="write").balance = 100
    tx.get(Acct, number=5).note = "tx"
    tx.create(Acct, number=7, balance=70, note="tx")
    t, box = _in_thread(lambda: upsert(ctx, {"number": [5, 6, 7, 8], "balance": [2, 2, 2, 2]}))
    time.sleep(0.3)
    assert t.is_alive() and not box  # blocked on the transaction's locks
    tx.commit()
    t.join(10)
    assert box and (box[0]["inserted"], box[0]["updated"]) == (1, 3), box
    objs = state(ctx)["objects"]
    assert {n: objs[n][1]["balance"] for n in objs} == {5: 2, 6: 2, 7: 2, 8: 2}
    assert objs[5][1]["note"] == "tx" and objs[7][1]["note"] == "tx"
    assert state(ctx)["count"] == 4


def test_a_transaction_waits_for_a_batch_and_sees_all_of_it(ctx: BulkContext) -> None:
    """A reader of two objects of one batch sees both before or both after it: the
    batch holds every lock until its commit is durable."""
    upsert(ctx, {"number": [1, 2], "balance": [0, 0]})
    stop = threading.Event()
    seen: list[tuple[int, int]] = []
    deadlocks: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            try:  # the batch locks 2 before 1: a reader of 1 then 2 may be the victim
                with ctx.db.transaction() as tx:
                    pair = (tx.get(Acct, number=1).balance, tx.get(Acct, number=2).balance)
                seen.append(pair)
            except nonstop.errors.Retryable:
                deadlocks.append(1)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 40):
            upsert(ctx, {"number": [2, *range(3, 500), 1], "balance": [i] * 499})
    finally:
        stop.set()
        t.join(10)
    assert seen and all(a == b for a, b in seen), [s for s in seen if s[0] != s[1]][:5]


def test_deadlock_with_a_transaction_is_retried(ctx: BulkContext) -> None:
    """The transaction holds 2 and then wants 1, which the batch holds while it waits
    for 2: one of them is the deadlock victim and retries; both end up applied."""
    upsert(ctx, {"number": [1, 2], "balance": [0, 0]})
    tx_done: list[Any] = []

    def transaction() -> None:
        for _ in range(20):
            try:
                with ctx.db.transaction() as tx:
                    tx.get(Acct, number=2, lock="write").note = "tx"
                    time.sleep(0.2)
                    tx.get(Acct, number=1, lock="write").note = "tx"
                tx_done.append(True)
                return
            except nonstop.errors.Retryable:
                continue

    t = threading.Thread(target=transaction)
    t.start()
    time.sleep(0.05)
    r = upsert(ctx, {"number": [1, 2], "balance": [5, 5]})
    t.join(20)
    assert tx_done == [True] and r["updated"] == 2
    objs = state(ctx)["objects"]
    assert [objs[n][1]["balance"] for n in (1, 2)] == [5, 5]
    assert [objs[n][1]["note"] for n in (1, 2)] == ["tx", "tx"]


def test_scan_reads_what_the_fast_path_wrote(ctx: BulkContext) -> None:
    upsert(ctx, {"number": list(range(1000)), "owner": [str(i) for i in range(1000)]})
    reply = handle(ctx, {"op": "bulk.scan", "type": T, "fields": ["number", "owner", "region"]})
    cols = decode_rows(reply["rows"], "columns")
    assert sorted(cols["number"]) == list(range(1000))
    assert all(o == str(n) for n, o in zip(cols["number"], cols["owner"], strict=True))
    assert set(cols["region"]) == {"eu"}


def _pages(ctx: BulkContext, limit: int, delete_each_next: bool, **kw: Any) -> list[int]:
    plan = handle(ctx, {"op": "bulk.plan", "type": T, "splits": 3, "max_rows": 400})
    got: list[int] = []
    for lo, hi in plan["ranges"]:
        after = None
        while True:
            reply = handle(
                ctx,
                {"op": "bulk.scan", "type": T, "fields": ["number"], "lo": lo, "hi": hi}
                | {"limit": limit, "after": after, **kw},
            )
            page = decode_rows(reply["rows"], "columns")["number"]
            assert len(page) == reply["n"] <= limit
            got += page
            after = reply["next"]
            if after is None:
                break
            assert len(page) == limit
            if delete_each_next:  # the resume point itself is gone: resume after it anyway
                with ctx.db.transaction() as tx:
                    tx.delete(tx.get(Acct, number=page[-1]))
    return got


@pytest.mark.parametrize("limit", [1, 7, 100, 5000])
def test_scan_pages_equal_the_filtered_path(ctx: BulkContext, limit: int) -> None:
    """The unfiltered scan (one unpack per page) and the object-by-object one (a filter
    that keeps everything) page through ranges alike, also when the resume point is
    deleted between pages."""
    upsert(ctx, {"number": list(range(1000))})
    plain = _pages(ctx, limit, False)
    assert sorted(plain) == list(range(1000))
    assert plain == _pages(ctx, limit, False, filters=[["number", "ge", 0]])
    if limit in (7, 100):
        got = _pages(ctx, limit, True)
        gone = set(range(1000)) - {o[1]["number"] for o in state(ctx)["objects"].values()}
        assert gone and set(got) == set(range(1000))  # every page came before its delete
        assert len(got) == len(set(got))


def test_new_refs_are_fresh_across_counter_blocks(ctx: BulkContext) -> None:
    from nonstop.store.lmdb_store import COUNTER_BLOCK

    store = ctx.db.engine.store
    before = store.new_ref()
    many = store.new_refs(COUNTER_BLOCK + 5)  # crosses a reservation
    after = store.new_ref()
    assert len(set(many)) == len(many) == COUNTER_BLOCK + 5
    assert before < min(many) and max(many) < after
    assert many == sorted(many) and store.new_refs(0) == []


class Wide(Managed, name="fast.Wide"):
    """More than 15 fields (a map16 record header), a factory default, odd values."""

    code: int = key(unique=True)
    f1: str = ""
    f2: float = 0.5
    f3: bool = False
    f4: bytes | None = None
    f5: list[int] = field(default_factory=list)
    f6: dict[str, Any] | None = None
    f7: dt.datetime | None = None
    f8: dt.date | None = None
    f9: Decimal | None = None
    f10: int = -1
    f11: str | None = key(ordered=True, mutable=True, default=None)
    f12: int = 0
    f13: int = 0
    f14: int = 0
    f15: int = 0
    f16: int = 0


def test_new_records_are_byte_for_byte_those_of_the_per_row_path(tmp_path: Path) -> None:
    when = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    batch = {
        "code": [1, 2, 3],
        "f1": ["é", "", "x" * 300],
        "f4": [b"\x00", None, b""],
        "f5": [[1, 2], [], [3]],
        "f6": [{"a": [1]}, None, {}],
        "f7": [when, None, when],
        "f8": [dt.date(2020, 2, 29), None, None],
        "f9": [Decimal("1.25"), None, Decimal(-3)],
        "f11": ["k", None, "k"],
        "f16": [2**62, -(2**63), 0],
    }
    records = []
    for per_row in (False, True):
        db = nonstop.open(tmp_path / f"w{per_row}", durability="none")
        ctx = BulkContext(db, "n")
        handle(
            ctx,
            {"op": "bulk.upsert", "type": "fast.Wide", "rows": encode_rows(batch)}
            | {"per_row": per_row},
        )
        store = db.engine.store
        with store.read() as rtxn:
            records.append(sorted(bytes(v) for _, v in rtxn.cursor(db=store.objects)))
        with db.transaction() as tx:
            assert [w.code for w in tx.query(Wide).where(f11="k").all()] == [1, 3]
            assert tx.get(Wide, code=2).f5 == [] and tx.get(Wide, code=2).f2 == 0.5
        db.close()
    assert len(records[0]) == 3 and records[0] == records[1]
    assert bulk_fast.covers(type_info(Wide), type_info(Wide).keys["code"])  # (fast: compared)
