"""Sizes fail cleanly (issue 14): over a limit is ``TooLarge`` naming the limit and the
size, refused by the client before sending where it can, never ``Unavailable`` or
a missing vote; a query whose reply, or a peer's answer to it, exceeds the frame
limit comes in pages.

The nodes run with the default frame limit, ``max_frame_bytes`` = 16 MiB.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import nonstop
from nonstop.errors import TooLarge
from nonstop.net.frames import DEFAULT_MAX_FRAME
from tests.cluster.conftest import Procs
from tests.distmodel import Inbox

ROOT = Path(__file__).resolve().parents[2]
MB = 1024 * 1024
LIMIT_TEXT = f"{DEFAULT_MAX_FRAME:,}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))
    # Frames of 9 MB keep a node's loop busy for a while on a loaded machine: a
    # tolerant failure detector, so that a slow peer is not taken for a dead one.
    options = {"app": ["tests.distmodel"], "nonresponse_timeout": 3.0}
    procs = Procs(tmp_path_factory.mktemp("data"), 2, options)
    try:
        procs.start_all()
        procs.wait_quorum(["A", "B"], "Active", 30)
        procs.wait_served()
        yield procs
    finally:
        procs.cleanup()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def connect(cluster: Procs) -> nonstop.client.Client:
    return nonstop.connect([cluster.address("A")])


def names_on(cluster: Procs, node: str, prefix: str) -> list[str]:
    """Two inbox names whose partition has ``node`` for its active node: objects are
    placed by partition (the default routing), so a test puts them on a node by key."""
    candidates = [f"{prefix}{i}" for i in range(64)]
    return list(cluster.keys_active_on(node, "dist.Inbox", "name", candidates, 2))


def test_a_100_mb_field_is_refused_by_the_client(cluster: Procs) -> None:
    name = f"huge-{os.getpid()}"
    with connect(cluster) as client:
        t0 = time.monotonic()
        with pytest.raises(TooLarge) as caught, client.transaction() as tx:
            tx.create(Inbox, name=name, items=["x" * (100 * MB)])
        assert time.monotonic() - t0 < 10
        message = str(caught.value)
        assert LIMIT_TEXT in message and "max_frame_bytes" in message
        assert caught.value.size is not None and caught.value.size > 100 * MB
        # Nothing was sent; the handle still works and nothing was created.
        with client.transaction() as tx:
            assert tx.find(Inbox, name=name) is None


def test_two_9_mb_writes_in_one_transaction_are_too_large_not_unavailable(
    cluster: Procs,
) -> None:
    names = names_on(cluster, "B", f"w9-{os.getpid()}-")
    with connect(cluster) as client:
        with client.transaction() as tx:
            for name in names:
                tx.create(Inbox, name=name)
        with pytest.raises(TooLarge) as caught, client.transaction() as tx:
            for name in names:
                tx.get(Inbox, name=name, lock="write").items = ["y" * (9 * MB)]
        assert LIMIT_TEXT in str(caught.value)
        with client.transaction() as tx:  # nothing committed
            assert all(tx.get(Inbox, name=n).items == [] for n in names)


def _write_two_9_mb(client: nonstop.client.Client, names: list[str]) -> None:
    for name in names:  # one per transaction: each commit fits in a frame
        with client.transaction() as tx:
            tx.create(Inbox, name=name, items=["z" * (9 * MB)])
    with client.transaction() as tx:
        # A lookup waits for phase two of each create (a scan would not, yet).
        assert all(len(tx.get(Inbox, name=name).items[0]) == 9 * MB for name in names)


def test_a_query_reads_back_two_9_mb_objects_in_pages(cluster: Procs) -> None:
    prefix = f"page-{os.getpid()}-"
    names = names_on(cluster, "A", prefix)  # on the node the client is attached to
    with connect(cluster) as client:
        _write_two_9_mb(client, names)
        with client.transaction() as tx:
            found = {
                o.name: len(o.items[0])
                for o in tx.query(Inbox).scope("local").all()
                if o.name.startswith(prefix)
            }
        assert found == {name: 9 * MB for name in names}


def test_a_query_reads_back_two_9_mb_objects_of_a_peer(cluster: Procs) -> None:
    # B's whole answer (18 MB) exceeds the frame limit: B sends it in frame-sized
    # pieces, asked one after the other by A (dataplane/session_ops.g_query_whole).
    prefix = f"peer-{os.getpid()}-"
    names = names_on(cluster, "B", prefix)
    with connect(cluster) as client:
        _write_two_9_mb(client, names)
        for scope in (["B"], "cluster"):
            with client.transaction() as tx:
                found = {
                    o.name: len(o.items[0])
                    for o in tx.query(Inbox).scope(scope).all()
                    if o.name.startswith(prefix)
                }
            assert found == {name: 9 * MB for name in names}, scope
        with client.transaction() as tx:  # a limit stops asking for pieces
            assert tx.query(Inbox).scope(["B"]).first() is not None


def test_the_async_client_pages_and_refuses_the_same_way(cluster: Procs) -> None:
    prefix = f"apage-{os.getpid()}-"
    names = names_on(cluster, "A", prefix)
    with connect(cluster) as client:
        _write_two_9_mb(client, names)

    async def main() -> dict[str, int]:
        async with await nonstop.connect_async([cluster.address("A")]) as client:
            with pytest.raises(TooLarge):
                async with client.transaction() as tx:
                    await tx.create(Inbox, name=prefix + "big", items=["x" * (20 * MB)])
            async with client.transaction() as tx:
                return {
                    o.name: len(o.items[0])
                    for o in await tx.query(Inbox).scope("local").all()
                    if o.name.startswith(prefix)
                }

    assert asyncio.run(main()) == {name: 9 * MB for name in names}
