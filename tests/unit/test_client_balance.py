"""Load balancing (H5): each client handle has its own primary among the addresses.

The core's choice and fail-over order driven by hand (no sockets), then both
handle flavours against the fake nodes of tests/unit/remote_fake.py: a spread
handle's transactions commit on its primary, and move to the next backup only
when the primary fails, staying there once it is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.bankmodel import Account, transfer, transfer_async
from tests.unit.remote_fake import FakeCluster

import nonstop
from nonstop.client.balance import Spreader, primary_index
from nonstop.client.core import Action, Call, ClientCore, Connect, run
from nonstop.net.handshake import Hello

ADDRESSES = ["a:1", "b:2", "c:3"]
FLAVOURS = ("blocking", "asyncio")


class StubLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self.closed = False
        self.node: Hello | None = None


def core(balance: str = "spread", start: int = 0) -> ClientCore:
    return ClientCore(
        list(ADDRESSES),
        rounds=2,
        timeout=1.0,
        op_timeout=3.0,
        balance=balance,
        spreader=Spreader(start),
    )


class Nodes:
    """Performs a core's actions: ``down`` addresses refuse connections; every
    address a session opened on is recorded in ``opened``."""

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.opened: list[str] = []

    def perform(self, action: Action) -> Any:
        if isinstance(action, Connect):
            if action.address in self.down:
                raise ConnectionRefusedError(f"{action.address} is down")
            return StubLink(action.address)
        if isinstance(action, Call):
            self.opened.append(action.link.address)
            return {"s": 1}
        return None

    def open_session(self, c: ClientCore) -> str:
        link, _ = run(c.open_session({"op": "tx.get", "begin": "serializable"}), self.perform)
        return str(link.address)


# ------------------------------------------------------------------- core
@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_n_spread_handles_on_n_nodes_use_every_node(count: int) -> None:
    addresses = [f"n{i}:1" for i in range(count)]
    for spreader in (Spreader(), Spreader(7)):  # whatever the start
        cores = [
            ClientCore(addresses, rounds=1, timeout=1, op_timeout=1, spreader=spreader)
            for _ in range(count)
        ]
        assert sorted(c.primary for c in cores) == addresses
        assert all(c.address == c.primary for c in cores), "new requests go to the primary"


def test_the_backups_follow_the_primary_in_the_order_given() -> None:
    assert core(start=1).order == ["b:2", "c:3", "a:1"]
    assert core(start=5).order == ["c:3", "a:1", "b:2"]


def test_first_pins_the_order_given() -> None:
    for start in range(3):
        c = core("first", start)
        assert c.primary == c.address == "a:1" and c.order == ADDRESSES
    assert primary_index("first", ["a:1", "b:2", "c:3", "d:4"], Spreader(3)) == 0


def test_turns_are_counted_per_address_list() -> None:
    """Handles on one node, or on another cluster, made in between do not skew the
    spread of a cluster's handles (two addresses: alternate turns would otherwise
    give every handle the same primary)."""
    spreader = Spreader(0)
    pair, other = ["a:1", "b:2"], ["x:1", "y:2"]
    picked = []
    for _ in range(4):
        picked.append(primary_index("spread", pair, spreader))
        assert primary_index("spread", ["a:1"], spreader) == 0
        primary_index("spread", other, spreader)
    assert picked == [0, 1, 0, 1]


def test_a_handle_s_sessions_stay_on_its_primary() -> None:
    nodes = Nodes()
    c = core(start=1)
    assert [nodes.open_session(c) for _ in range(5)] == ["b:2"] * 5


def test_a_backup_takes_over_only_when_the_primary_fails_and_keeps_the_handle() -> None:
    nodes = Nodes()
    c = core(start=1)  # primary b:2, backups c:3 then a:1
    assert nodes.open_session(c) == "b:2"
    nodes.down.add("b:2")
    assert nodes.open_session(c) == "c:3", "the next backup after the primary"
    assert c.primary == "b:2" and c.address == "c:3"
    nodes.down.clear()  # the primary is back: the handle stays on the backup
    assert [nodes.open_session(c) for _ in range(3)] == ["c:3"] * 3
    nodes.down.add("c:3")
    assert nodes.open_session(c) == "a:1", "then the next one in the handle's order"


def test_the_first_order_fails_over_from_the_first_address() -> None:
    nodes = Nodes()
    c = core("first", start=2)
    nodes.down.add("a:1")
    assert nodes.open_session(c) == "b:2"


@pytest.mark.parametrize("bad", ["round-robin", "", None, 1])
def test_a_bad_balance_is_a_clear_error(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"balance must be one of 'spread', 'first', not"):
        ClientCore(list(ADDRESSES), rounds=1, timeout=1, op_timeout=1, balance=bad)
    with pytest.raises(ValueError, match="balance must be one of"):
        nonstop.Client(ADDRESSES, balance=bad)
    with pytest.raises(ValueError, match="balance must be one of"):
        nonstop.connect(ADDRESSES, balance=bad)  # before any connection is tried
    with pytest.raises(ValueError, match="balance must be one of"):
        nonstop.connect_async(ADDRESSES, balance=bad)


def test_handles_made_in_turn_are_spread_by_default() -> None:
    """The process's own turns: three handles on three addresses, one on each."""
    handles = [nonstop.Client(ADDRESSES) for _ in range(3)]
    try:
        assert sorted(h.primary for h in handles) == ADDRESSES
        assert all(h.balance == "spread" and h.address == h.primary for h in handles)
    finally:
        for h in handles:
            h.close()


# ---------------------------------------------------- handles, fake nodes
@pytest.fixture
def three(tmp_path: Path) -> Iterator[FakeCluster]:
    db = nonstop.open(tmp_path / "store")
    try:
        with db.transaction() as tx:
            for n in ("A-1", "A-2"):
                tx.create(Account, number=n, owner=n.lower(), balance=100)
        yield FakeCluster(db, ["n1", "n2", "n3"])
    finally:
        db.close()


def commits(cluster: FakeCluster) -> dict[str, int]:
    return {address: node.commits for address, node in cluster.by_address.items()}


def next_after(cluster: FakeCluster, address: str) -> str:
    addresses = cluster.addresses
    return addresses[(addresses.index(address) + 1) % len(addresses)]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_spread_handles_commit_on_their_own_primaries(three: FakeCluster, flavour: str) -> None:
    if flavour == "blocking":
        handles = [three.client(balance="spread") for _ in range(3)]
        for k, h in enumerate(handles):
            for i in range(2):
                transfer(h, f"t{k}.{i}", "A-1", "A-2", 1)
            h.close()
        primaries = [h.primary for h in handles]
    else:

        async def main() -> list[str]:
            handles = [three.async_client(balance="spread") for _ in range(3)]
            for k, h in enumerate(handles):
                for i in range(2):
                    await transfer_async(h, f"t{k}.{i}", "A-1", "A-2", 1)
                await h.aclose()
            return [h.primary for h in handles]

        primaries = asyncio.run(main())
    assert sorted(primaries) == three.addresses
    assert commits(three) == {a: 2 for a in three.addresses}, "each on its own primary"


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_handle_fails_over_to_its_backup_and_stays_there(
    three: FakeCluster, flavour: str
) -> None:
    async def scenario(step: Callable[[str], Awaitable[str]]) -> None:
        """``step(tid)`` runs one transfer on the handle and returns its primary."""
        primary = await step("p1")
        backup = next_after(three, primary)
        assert commits(three)[primary] == 1
        three.by_address[primary].up = False
        await step("b1")  # the primary has failed: the next backup takes the handle over
        assert commits(three)[backup] == 1
        three.by_address[primary].up = True
        await step("b2")  # the primary is back: the handle stays where it is
        assert commits(three) == {primary: 1, backup: 2, next_after(three, backup): 0}

    if flavour == "blocking":
        with three.client(balance="spread") as c:

            async def step(tid: str) -> str:
                transfer(c, tid, "A-1", "A-2", 1)
                return c.primary

            asyncio.run(scenario(step))
        return

    async def main() -> None:
        async with three.async_client(balance="spread") as ac:

            async def step(tid: str) -> str:
                await transfer_async(ac, tid, "A-1", "A-2", 1)
                return ac.primary

            await scenario(step)

    asyncio.run(main())
