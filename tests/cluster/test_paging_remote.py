"""Cluster queries stream in pages (issue 13, A5) on a real 3-node cluster.

Iterating an unlocked remote query asks the data plane for one page at a time
(keyset paging: each node resumes past the last object the client got, no
cursor kept between requests).  The pages add up to ``all()``, in order when
ordered; the client and the nodes forget the passed pages, and a client
streaming far more data than its memory budget grows by less than that.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import nonstop
from tests.cluster.conftest import Procs, wait_until
from tests.conftest import child_env
from tests.distmodel import Account, Note

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["A", "B", "C"]
SMALL = 900  # accounts spread over the three nodes
BIG = 15_000  # accounts of 4 kB each for the memory test (60 MB)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))
    # Relaxed failure detection: this module kills nothing, and a node wrongly seen
    # down on a loaded machine would be skipped by the queries (audit skip_down).
    # A 1 MiB frame limit: a page of 500 notes of 4 kB (2 MB) must be cut to fit.
    options = {
        "app": ["tests.distmodel"],
        "keepalive_interval": 0.5,
        "nonresponse_timeout": 5.0,
        "max_frame_bytes": 1 << 20,
    }
    procs = Procs(tmp_path_factory.mktemp("paging"), 3, options)
    try:
        procs.start_all()
        procs.wait_quorum(NAMES, "Active", 30)
        procs.wait_served(NAMES)
        addresses = ",".join(procs.address(n) for n in NAMES)
        with nonstop.connect(addresses) as c:
            for k, node in enumerate(NAMES):
                with c.transaction() as tx:
                    for i in range(k, SMALL, 3):
                        tx.create(Account, node=node, number=f"p{i:05d}", owner=f"o{i % 11:02d}")

            def all_visible() -> bool:
                with c.transaction(isolation="snapshot") as tx:
                    return tx.query(Account).count() == SMALL

            # A participant applies a committed transaction after the client's
            # commit returned: the last node written may need a moment.
            wait_until(all_visible, 10, "the accounts visible on every node")
        yield procs
    finally:
        procs.cleanup()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def anon_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError(f"no RssAnon for pid {pid}")


def addresses(cluster: Procs) -> str:
    return ",".join(cluster.address(n) for n in NAMES)


def ours(accounts: list[Account]) -> list[str]:
    return [a.number for a in accounts if a.number.startswith("p")]


def test_pages_add_up_to_all_in_order(cluster: Procs) -> None:
    with nonstop.connect(addresses(cluster)) as c, c.transaction(isolation="snapshot") as tx:
        everything = ours(tx.query(Account).all())
        streamed = ours(list(tx.query(Account).page_size(64)))
        assert sorted(streamed) == sorted(everything) and len(streamed) == SMALL
        ordered = [a.owner for a in tx.query(Account).order_by("owner").page_size(50)]
        assert ordered == sorted(ordered)
        whole = [(a.owner, a.number) for a in tx.query(Account).range("owner", "o03", "o06").all()]
        paged = [(a.owner, a.number) for a in tx.query(Account).range("owner", "o03", "o06")]
        assert paged == whole and len(paged) > 100
        assert len(list(tx.query(Account).where(owner="o04").page_size(7))) == len(
            [i for i in range(SMALL) if i % 11 == 4]
        )
        assert len(list(tx.query(Account).page_size(40).limit(130))) == 130


def test_passed_pages_are_forgotten_and_a_kept_object_still_writes(cluster: Procs) -> None:
    with nonstop.connect(addresses(cluster)) as c:
        with c.transaction(isolation="snapshot") as tx:
            kept = None
            for a in tx.query(Account).range("owner", "o07", "o08").page_size(20):
                kept = kept or a
            assert kept is not None
            assert len(tx._entries) == 0  # every page passed, nothing held
            kept.balance = 77
            number = kept.number
        with c.transaction() as tx:
            assert tx.get(Account, number=number).balance == 77


def test_async_iteration_pages(cluster: Procs) -> None:
    async def main() -> list[str]:
        async with (
            nonstop.connect_async(addresses(cluster)) as c,
            c.transaction(isolation="snapshot") as tx,
        ):
            return [a.number async for a in tx.query(Account).page_size(100)]

    assert sorted(n for n in asyncio.run(main()) if n.startswith("p")) == [
        f"p{i:05d}" for i in range(SMALL)
    ]


STREAM_CLIENT = textwrap.dedent(
    """
    import sys
    import nonstop
    from tests.distmodel import Note

    def anon_kib():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
        raise SystemExit("no RssAnon")

    with nonstop.connect(sys.argv[1]) as c, c.transaction(isolation="snapshot") as tx:
        seen, peak, base = 0, 0, anon_kib()
        for note in tx.query(Note).page_size(500):
            seen += 1
            if seen % 500 == 0:
                peak = max(peak, anon_kib() - base)
    print(seen, peak)
    """
)


def test_a_client_streams_more_than_its_memory_budget(cluster: Procs, tmp_path: Path) -> None:
    """15,000 notes of 4 kB (60 MB) streamed by a client growing by under 16 MiB.

    Pages of 500 notes (2 MB) do not fit in the nodes' 1 MiB frames: each node
    cuts its page to fit, and the pages still add up to every note once.

    Peak growth of the client's anonymous resident memory, sampled every page
    (LMDB's file-backed map pages are the page cache, not ours); on the nodes,
    their growth once the stream is done.
    """
    budget_kib = 16 * 1024
    payload = "n" * 4_000
    with nonstop.connect(addresses(cluster)) as c:
        for start in range(0, BIG, 150):  # 600 kB of writes: under the frame limit
            with c.transaction() as tx:
                for i in range(start, start + 150):
                    tx.create(Note, node=NAMES[i % 3], text=payload)
    script = tmp_path / "stream_client.py"
    script.write_text(STREAM_CLIENT)
    nodes_before = {name: anon_kib(pid) for name, pid in cluster.pids.items()}
    done = subprocess.run(
        [sys.executable, str(script), addresses(cluster)],
        check=True,
        env=child_env(),
        timeout=240,
        capture_output=True,
        text=True,
    )
    seen, peak_kib = map(int, done.stdout.split())
    print(f"client streamed {seen:,} objects: peak anonymous RSS growth {peak_kib:,} KiB")
    assert seen == BIG
    assert 3 * budget_kib < BIG * 4_000 // 1024
    assert peak_kib < budget_kib
    # Each node sent a third of it (20 MB) in pages and forgot every page it sent.
    grown = {name: anon_kib(pid) - nodes_before[name] for name, pid in cluster.pids.items()}
    print(f"nodes' anonymous RSS growth after the stream (KiB): {grown}")
    assert max(grown.values()) < budget_kib


def test_to_arrow_and_to_pandas_from_the_cluster(cluster: Procs) -> None:
    pytest.importorskip("pyarrow")
    pytest.importorskip("pandas")
    with nonstop.connect(addresses(cluster)) as c, c.transaction(isolation="snapshot") as tx:
        table = tx.query(Account).where(owner="o05").page_size(25).to_arrow()
        frame = tx.query(Account).range("owner", "o01", "o03").to_pandas()
    expected = [f"p{i:05d}" for i in range(SMALL) if i % 11 == 5]
    assert sorted(table.column("number").to_pylist()) == expected
    assert {"number", "owner", "balance"} <= set(table.column_names)
    assert set(frame["owner"]) == {"o01", "o02"}
