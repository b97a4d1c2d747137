"""Queries stream in pages (issue 13, A5): same results as ``all()``, bounded memory.

Iterating an unlocked query (snapshot isolation or ``lock("none")``) reads page
by page from one store snapshot and forgets the unchanged objects of the pages
it passed; a handle kept from an earlier page stays usable (it is taken back by
the transaction when changed).  ``to_arrow()`` / ``to_pandas()`` need no Spark.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.conftest import child_env

import nonstop


class Item(nonstop.Managed, name="tests.paging.Item"):
    number: int = nonstop.key(unique=True, ordered=True)
    group: str = nonstop.key(ordered=True, mutable=True, default="")
    payload: str = ""


@pytest.fixture
def items(tmp_path: Path) -> nonstop.Database:
    db = nonstop.open(tmp_path / "store")
    with db.transaction() as tx:
        for n in range(2_500):
            tx.create(Item, number=n, group=f"g{n % 7}", payload="x" * (n % 5))
    return db


def test_iteration_in_pages_equals_all(items: nonstop.Database) -> None:
    with items.transaction(isolation="snapshot") as tx:
        everything = sorted(i.number for i in tx.query(Item).all())
        streamed = [i.number for i in tx.query(Item).page_size(100)]
        assert sorted(streamed) == everything and len(streamed) == 2_500
        ordered = [i.group for i in tx.query(Item).order_by("group").page_size(64)]
        assert ordered == sorted(ordered) and len(ordered) == 2_500
        ranged = [(i.group, i.number) for i in tx.query(Item).range("group", "g2", "g4")]
        expected = [(i.group, i.number) for i in tx.query(Item).range("group", "g2", "g4").all()]
        assert ranged == expected
        assert len(list(tx.query(Item).where(group="g3").page_size(7))) == len(
            [n for n in range(2_500) if n % 7 == 3]
        )
        assert len(list(tx.query(Item).page_size(10).limit(25))) == 25
        pages = list(tx.query(Item).page_size(1_000).pages())
        assert [len(p) for p in pages] == [1_000, 1_000, 500]


def test_passed_pages_are_forgotten_and_kept_handles_still_write(
    items: nonstop.Database,
) -> None:
    with items.transaction(isolation="snapshot") as tx:
        kept = None
        for i, item in enumerate(tx.query(Item).page_size(50)):
            if i == 0:
                kept = item
        assert kept is not None
        # Only the last page is still held by the transaction.
        assert len(tx.entry_map()) <= 50
        kept.payload = "changed after its page was passed"
        number = kept.number
    with items.transaction() as tx:
        assert tx.get(Item, number=number).payload == "changed after its page was passed"
    items.close()


def test_locking_reads_and_own_changes_still_see_everything(items: nonstop.Database) -> None:
    with items.transaction() as tx:  # serializable: read locks, all objects read first
        tx.create(Item, number=10_000, group="g0")
        assert len(list(tx.query(Item).page_size(10))) == 2_501
    with items.transaction(isolation="snapshot") as tx:
        tx.create(Item, number=10_001, group="g0")  # own change of the type: merged
        assert len(list(tx.query(Item).page_size(10))) == 2_502
    items.close()


def test_page_size_must_be_positive(items: nonstop.Database) -> None:
    with items.transaction() as tx, pytest.raises(nonstop.BadArgument, match="page_size"):
        tx.query(Item).page_size(0)
    items.close()


def test_to_arrow_and_to_pandas(items: nonstop.Database) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("pandas")
    with items.transaction(isolation="snapshot") as tx:
        table = tx.query(Item).where(group="g1").page_size(100).to_arrow()
        frame = tx.query(Item).range("group", "g5").to_pandas()
    assert table.column_names == ["number", "group", "payload"]
    assert table.num_rows == len([n for n in range(2_500) if n % 7 == 1])
    assert set(frame["group"]) == {"g5", "g6"}
    assert len(frame) == len([n for n in range(2_500) if n % 7 in (5, 6)])
    items.close()


STREAM_SCRIPT = textwrap.dedent(
    """
    import sys
    import nonstop
    from tests.unit.test_paging import Item

    def anon_kib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
        raise SystemExit("no RssAnon")

    path, count = sys.argv[1], int(sys.argv[2])
    db = nonstop.open(path)
    if sys.argv[3] == "load":
        for start in range(0, count, 5_000):
            with db.transaction() as tx:
                for n in range(start, min(count, start + 5_000)):
                    tx.create(Item, number=n, group="g", payload="p" * 2_000)
        raise SystemExit(0)
    with db.transaction(isolation="snapshot") as tx:
        first = tx.query(Item).page_size(500)
        seen, peak, base = 0, 0, anon_kib()
        for item in first:
            seen += len(item.payload) > 0
            if seen % 500 == 0:
                peak = max(peak, anon_kib() - base)
    print(seen, peak)
    """
)


def test_streaming_more_objects_than_the_memory_budget(tmp_path: Path) -> None:
    """60,000 objects of 2 kB (120 MB of payload) iterated with under 16 MiB of growth.

    Measured as the peak growth of anonymous resident memory (RssAnon, sampled
    every page): LMDB's file-backed map pages are the OS page cache, not ours.
    """
    count, budget_kib = 60_000, 16 * 1024
    script = tmp_path / "stream.py"
    script.write_text(STREAM_SCRIPT)
    store = str(tmp_path / "store")
    run = [sys.executable, str(script), store, str(count)]
    subprocess.run([*run, "load"], check=True, env=child_env(), timeout=240)
    done = subprocess.run(
        [*run, "stream"], check=True, env=child_env(), timeout=240, capture_output=True, text=True
    )
    seen, peak_kib = map(int, done.stdout.split())
    assert seen == count
    assert count * 2_000 // 1024 > 3 * budget_kib  # the data does not fit in the budget
    print(f"streamed {count:,} objects: peak anonymous RSS growth {peak_kib:,} KiB")
    assert peak_kib < budget_kib, f"anonymous RSS grew by {peak_kib} KiB streaming {count}"


def test_keyset_positions_resume_where_the_last_page_ended(items: nonstop.Database) -> None:
    """``after(position)``: what the data plane pages cluster queries with."""
    with items.transaction(isolation="snapshot") as tx:
        for make in (
            lambda: tx.query(Item),
            lambda: tx.query(Item).order_by("group"),
            lambda: tx.query(Item).where(group="g2"),
            lambda: tx.query(Item).where(group="g2").order_by("number"),
            lambda: tx.query(Item).range("group", "g1", "g3"),
        ):
            whole = [i.number for i in make().all()]
            paged: list[int] = []
            position = None
            while True:
                q = make().after(position).limit(97)
                page = q.all()
                paged += [i.number for i in page]
                if len(page) < 97:
                    break
                position = q.position_of(page[-1])
            assert sorted(paged) == sorted(whole) and len(paged) == len(whole)
            if make()._order is not None:
                assert paged == whole


async def test_async_iteration_streams(tmp_path: Path) -> None:
    db = nonstop.open(tmp_path / "store")
    async with db.transaction() as tx:
        for n in range(300):
            await tx.create(Item, number=n, group="g")
    async with db.transaction(isolation="snapshot") as tx:
        numbers = [i.number async for i in tx.query(Item).page_size(50)]
    assert sorted(numbers) == list(range(300))
    db.close()


def test_merge_page_stops_where_a_node_may_have_more() -> None:
    """The data plane's merge of the nodes' pages (keyset paging of cluster queries)."""
    from nonstop.dataplane.session_ops import merge_page

    def node(*refs: bytes, cut: bool = False) -> dict[str, object]:
        reply: dict[str, object] = {"k": list(refs), "os": [[r, "T", 1, b""] for r in refs]}
        if cut:
            reply["cut"] = True
        return reply

    # A full page of A (3 of 3) ends at c: B's e must wait for the next page.
    merged = merge_page([node(b"a", b"b", b"c"), node(b"b", b"e")], 3)
    assert [o[0] for o in merged["os"]] == [b"a", b"b", b"c"]
    assert merged["after"] == [b"c", b"c"] and merged["rest"]
    # Nobody full: everything, and nothing more to ask.
    merged = merge_page([node(b"a"), node(b"d", b"e")], 3)
    assert [o[0] for o in merged["os"]] == [b"a", b"d", b"e"] and not merged["rest"]
    # A page cut to fit a frame counts as full although short.
    merged = merge_page([node(b"a", cut=True), node(b"b", b"c")], 3)
    assert [o[0] for o in merged["os"]] == [b"a"] and merged["rest"]
    # Nothing at all.
    assert merge_page([node(), node()], 3) == {"os": [], "after": None, "rest": False}


async def test_a_whole_query_answer_is_read_in_pieces_past_the_last_object(
    tmp_path: Path,
) -> None:
    """``branch.query`` with ``piece`` (``session_ops.QUERY_PIECE``): a node reads at most
    that many objects per step and says ``cut``; asked again past the last one, the pieces
    make the whole answer, each object once, the locks of every piece kept."""
    from nonstop.dataplane.store_ops import _run_query
    from nonstop.model.managed import type_info

    db = nonstop.open(tmp_path / "store")
    async with db.transaction() as tx:
        for n in range(50):
            await tx.create(Item, number=n, group="g")
    ask = {"type": "tests.paging.Item", "tv": type_info(Item).version, "page": True}
    async with db.transaction() as tx:
        got: list[bytes] = []
        cuts: list[bool] = []
        after = None
        while True:
            reply = await _run_query(
                tx, {**ask, "after": after, "piece": 20, "keep": True, "lock": "read"}
            )
            got += [o[0] for o in reply["os"]]
            cuts.append(bool(reply.get("cut")))
            if not reply.get("cut"):
                break
            after = [reply["k"][-1], reply["os"][-1][0]]
        assert cuts == [True, True, False] and len(got) == len(set(got)) == 50
        # A limit under the piece ends it as before: no cut.
        reply = await _run_query(tx, {**ask, "after": None, "piece": 20, "limit": 5})
        assert len(reply["os"]) == 5 and "cut" not in reply
        # Descending: one piece (keyset paging runs ascending), every object in it.
        down = {**ask, "after": None, "piece": 20, "keep": True, "order": ["number", True]}
        reply = await _run_query(tx, down)
        assert len(reply["os"]) == 50 and "cut" not in reply
    db.close()
