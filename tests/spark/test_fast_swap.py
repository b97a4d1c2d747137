"""The overwrite's swap without an entry per object (bulk/fast_swap.py), in one store.

The overwrite tests of test_bulk_handlers.py run on both swaps; these check what
is particular to this one: which types it covers, the index entries it removes
and puts itself, a key value taken by an object it does not delete, and a
locking reader by key during the swap.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop.bulk import fast_swap, swap_apply
from nonstop.bulk.handlers import BulkContext, encode_rows, handle
from nonstop.errors import DuplicateKey
from nonstop.model.managed import TypeInfo
from tests.spark.model import Flaky, Item, Keyless, Plain

T = "pipe.Plain"


@pytest.fixture(autouse=True)
def _fast_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounded swap (bulk/swap_apply.py) covers Plain; turned off here, the fast
    swap does (as it does a type whose unique key another type shares)."""
    monkeypatch.setattr(swap_apply, "covered_key", lambda info: None)


@pytest.fixture
def ctx(tmp_path: Path) -> Any:
    db = nonstop.open(tmp_path / "s", durability="none", lock_timeout=10.0)
    yield BulkContext(db, "n1")
    db.close()


def op(ctx: BulkContext, name: str, **payload: Any) -> Any:
    return handle(ctx, {"op": name, **payload})


def info_of(ctx: BulkContext, cls: type) -> TypeInfo:
    return ctx.db.engine.ensure_type(cls)


def stage(ctx: BulkContext, cols: dict[str, list[Any]], tag: str = "p") -> str:
    job: str = op(ctx, "bulk.overwrite.begin", type=T)["job"]
    op(ctx, "bulk.overwrite.part", type=T, job=job, tag=tag, rows=encode_rows(cols))
    return job


def state(ctx: BulkContext) -> dict[str, tuple[int, str | None]]:
    """sku -> (qty, label) of every Plain, read through the extent."""
    with ctx.db.transaction() as tx:
        return {p.sku: (p.qty, p.label) for p in tx.extent(Plain)}


def index_entries(ctx: BulkContext, field: str) -> int:
    """Entries of one of Plain's key indexes, read from the store itself."""
    key = info_of(ctx, Plain).keys[field]
    store = ctx.db.engine.store
    db = store.index_db(key.db_name, unique=key.options.unique)
    with store.read() as rtxn:
        return sum(1 for _ in rtxn.cursor(db=db).iternext(keys=True, values=False))


def test_which_types_it_covers(ctx: BulkContext) -> None:
    assert fast_swap.covered_key(info_of(ctx, Plain)) is not None
    assert fast_swap.covered_key(info_of(ctx, Flaky)) is not None  # on_update: no matter
    assert fast_swap.covered_key(info_of(ctx, Item)) is None  # a reference field
    assert fast_swap.covered_key(info_of(ctx, Keyless)) is None  # no unique key


def test_the_swap_keeps_every_index_and_the_count_right(ctx: BulkContext) -> None:
    """Full by full with the same keys: the unique index, the non-unique one and the
    extent count end up exactly as creating the new set would have left them."""
    old = {f"k{i:03}": (1, "old" if i % 2 else None) for i in range(300)}
    op(
        ctx,
        "bulk.upsert",
        type=T,
        rows=encode_rows(
            {
                "sku": list(old),
                "qty": [v[0] for v in old.values()],
                "label": [v[1] for v in old.values()],
            }
        ),
    )
    new_keys = [f"k{i:03}" for i in range(100, 400)]  # 200 kept, 100 gone, 100 new
    job = stage(ctx, {"sku": new_keys, "qty": [2] * 300, "label": ["new"] * 300})
    done = op(ctx, "bulk.overwrite.commit", type=T, job=job)
    assert (done["deleted"], done["inserted"]) == (300, 300)
    assert state(ctx) == {k: (2, "new") for k in new_keys}
    with ctx.db.transaction() as tx:
        assert tx.count(Plain) == 300
        assert [p.label for p in tx.query(Plain).range("label").all()] == ["new"] * 300
    assert index_entries(ctx, "label") == index_entries(ctx, "sku") == 300  # none stale
    with ctx.db.transaction() as tx:
        assert tx.find(Plain, sku="k000") is None
        found = tx.find(Plain, sku="k150")
        assert found is not None and found.qty == 2
        tx.create(Plain, sku="k000")  # a key the swap gave up is free again
    with pytest.raises(DuplicateKey), ctx.db.transaction() as tx:
        tx.create(Plain, sku="k399")  # one it took is not


def test_a_key_taken_by_an_object_it_does_not_delete_swaps_nothing(
    ctx: BulkContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object created with a new key value after the swap read the extent past it
    (a phantom): the swap fails with DuplicateKey and changes nothing."""
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": ["a", "b"], "qty": [1, 1]}))
    job = stage(ctx, {"sku": ["b", "c"], "qty": [2, 2]})
    real = fast_swap.g_create_part

    def with_phantom(*args: Any) -> Any:
        def create() -> None:
            with ctx.db.transaction() as tx:
                tx.create(Plain, sku="c", qty=9)

        t = threading.Thread(target=create)  # (its own transaction: another thread)
        t.start()
        t.join(10)
        return (yield from real(*args))

    monkeypatch.setattr(fast_swap, "g_create_part", with_phantom)
    with pytest.raises(DuplicateKey, match="'c' is already taken"):
        op(ctx, "bulk.overwrite.commit", type=T, job=job)
    assert state(ctx) == {"a": (1, None), "b": (1, None), "c": (9, None)}


def test_a_locking_reader_by_key_sees_the_old_set_or_the_new(ctx: BulkContext) -> None:
    """A serializable reader of two keys, one at each end of the extent, with read
    locks, while the swap runs: both old (qty 1) or both new (qty 2), never a mix."""
    keys = [f"k{i:04}" for i in range(3000)]
    op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": keys, "qty": [1] * 3000}))
    job = stage(ctx, {"sku": keys, "qty": [2] * 3000})
    seen: list[tuple[int | None, int | None]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with ctx.db.transaction() as tx:
                first = tx.find(Plain, sku=keys[0], lock="read")
                last = tx.find(Plain, sku=keys[-1], lock="read")
                seen.append((first and first.qty, last and last.qty))

    t = threading.Thread(target=reader)
    t.start()
    try:
        while not seen:  # (it has read the old set once)
            time.sleep(0.001)
        op(ctx, "bulk.overwrite.commit", type=T, job=job)
        for _ in range(3):
            with ctx.db.transaction() as tx:
                last = tx.find(Plain, sku=keys[-1], lock="read")
                seen.append((2, last and last.qty))
    finally:
        stop.set()
        t.join(10)
    assert set(seen) <= {(1, 1), (2, 2)}, set(seen)
    assert seen[0] == (1, 1) and seen[-1] == (2, 2)


def _swap_peak(tmp_path: Path, n: int) -> int:
    """Peak Python memory (tracemalloc) of the swap of ``n`` Plain objects by ``n`` new ones."""
    db = nonstop.open(tmp_path / f"m{n}", durability="none", lock_timeout=10.0)
    try:
        ctx = BulkContext(db, "n1")
        op(ctx, "bulk.upsert", type=T, rows=encode_rows({"sku": [f"o{i}" for i in range(n)]}))
        job = op(ctx, "bulk.overwrite.begin", type=T)["job"]
        for lo in range(0, n, 5000):
            skus = [f"n{i}" for i in range(lo, min(n, lo + 5000))]
            op(
                ctx,
                "bulk.overwrite.part",
                type=T,
                job=job,
                tag=str(lo),
                rows=encode_rows({"sku": skus}),
            )
        tracemalloc.start()
        try:
            assert op(ctx, "bulk.overwrite.commit", type=T, job=job)["inserted"] == n
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        db.close()


def test_memory_per_object_swapped_stays_put(tmp_path: Path) -> None:
    """What is built is O(old + new) (data-path.md §6.3): this pins its constant, so a
    change that makes the swap hold more per object (an entry, a copy) fails here.
    Measured: about 1.4 KB per object swapped (the per-object path: 2 KB)."""
    small, large = 1500, 6000
    per_small = _swap_peak(tmp_path, small) / (2 * small)
    per_large = _swap_peak(tmp_path, large) / (2 * large)
    print(f"bytes per object swapped: {per_small:.0f} ({small}), {per_large:.0f} ({large})")
    assert per_large < 1800, per_large
    assert per_large < per_small * 1.2, (per_small, per_large)  # linear, not worse
