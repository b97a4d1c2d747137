"""The real runtime hands the Persists of a routed prefix of one loop turn to its persister.

The node routes the distributed-commit machine's ``dtx/`` keys to the object store
(``runtime.persists.route``): one store write set per turn (split where a key
repeats), each Persist acknowledged only once its write set is durable, in emission
order; a failed write stops the node.  The store side is a fake persister
completing from its own thread, like the store's writer thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_transport import free_port, hello_for

from nonstop.net.tls import TLSConfig
from nonstop.node.machine import StoreWrites
from nonstop.runtime.interface import Action, ClientRequest, Event, Persist, Persisted, Reply
from nonstop.runtime.real import RealRuntime, RuntimeConfig
from nonstop.runtime.storage import ClusterStore

pytestmark = pytest.mark.timeout(30)

Writes = list[tuple[bytes, bytes | None]]


class PersistingMachine:
    """On a request ``{"p": [[key, ...], ...]}``: one Persist per inner list, then a reply."""

    def __init__(self) -> None:
        self.persisted: list[int] = []
        self.token = 0

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Persisted):
            self.persisted.append(event.token)
            return []
        if not isinstance(event, ClientRequest):
            return []
        out: list[Action] = []
        for keys in event.payload["p"]:
            self.token += 1
            out.append(Persist(self.token, tuple((k, b"v") for k in keys)))
        out.append(Reply(event.request_id, [p.token for p in out if isinstance(p, Persist)]))
        return out


class BatchingMachine(PersistingMachine):
    """Takes the tokens of one acknowledgement at once (``interface.DurableBatches``)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    def handle_persisted(self, now: float, tokens: Sequence[int]) -> list[Action]:
        self.batches.append(list(tokens))
        return []


class FakePersister:
    """Records each write set; completes it from another thread when released."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[Writes] = []
        self.pending: list[Callable[[BaseException | None], None]] = []
        self.fail = fail

    def persist(
        self, writes: Sequence[tuple[bytes, bytes | None]], done: Callable[[Any], None]
    ) -> None:
        self.calls.append(list(writes))
        self.pending.append(done)

    def release(self) -> None:
        pending, self.pending = self.pending, []
        exc = OSError("disk gone") if self.fail else None

        def run() -> None:
            for done in pending:
                done(exc)

        t = threading.Thread(target=run)
        t.start()
        t.join()


async def _with_runtime(
    tmp: Path, persister: FakePersister, body: Any, machine: PersistingMachine | None = None
) -> None:
    port = free_port()
    store = ClusterStore(str(tmp / "n"), sync=False)
    machine = machine or PersistingMachine()
    rt = RealRuntime(
        hello=hello_for("n", port),
        store=store,
        machine_factory=lambda rec: machine,  # type: ignore[arg-type,return-value]
        config=RuntimeConfig(listen=f"127.0.0.1:{port}", tls=TLSConfig()),
    )
    # As the node's composition does (node/machine.py): the store's persister takes plain writes.
    rt.persists.route(b"dtx/", StoreWrites(persister), label="dtx", distinct_keys=True)
    await rt.start()
    try:
        await body(rt, machine)
    finally:
        await rt.stop()
        store.close()


async def _settle(predicate: Callable[[], bool]) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def test_one_turns_persists_go_in_one_write_set_and_are_acknowledged_after_it(
    tmp_path: Path,
) -> None:
    persister = FakePersister()

    async def body(rt: RealRuntime, machine: PersistingMachine) -> None:
        # Three Persists in one turn (two in one event, one in another), then a
        # fourth that writes a key again: two write sets, in order.
        first = rt.submit({"p": [[b"dtx/c/a.1"], [b"dtx/p/a.1", b"dtx/seq"]]})
        second = rt.submit({"p": [[b"dtx/t/b.7"], [b"dtx/c/a.1"]]})
        assert await first == [1, 2] and await second == [3, 4]
        await _settle(lambda: len(persister.calls) == 2)
        assert persister.calls == [
            [(b"dtx/c/a.1", b"v"), (b"dtx/p/a.1", b"v"), (b"dtx/seq", b"v"), (b"dtx/t/b.7", b"v")],
            [(b"dtx/c/a.1", b"v")],
        ]
        await asyncio.sleep(0.05)
        assert machine.persisted == []  # nothing is acknowledged before it is durable
        persister.release()
        await _settle(lambda: machine.persisted == [1, 2, 3, 4])
        assert rt.stats["dtx_persists"] == 4 and rt.stats["dtx_store_commits"] == 2
        # A later turn is a write set of its own.
        assert await rt.submit({"p": [[b"dtx/c/a.2"]]}) == [5]
        await _settle(lambda: len(persister.calls) == 3)
        persister.release()
        await _settle(lambda: machine.persisted == [1, 2, 3, 4, 5])

    asyncio.run(_with_runtime(tmp_path, persister, body))


def test_a_machine_that_takes_batches_hears_a_write_set_in_one_event(tmp_path: Path) -> None:
    persister = FakePersister()
    machine = BatchingMachine()

    async def body(rt: RealRuntime, _: PersistingMachine) -> None:
        assert await rt.submit({"p": [[b"dtx/c/a.1"], [b"dtx/p/a.1"], [b"dtx/t/b.2"]]}) == [1, 2, 3]
        await _settle(lambda: len(persister.calls) == 1)
        persister.release()
        await _settle(lambda: machine.batches == [[1, 2, 3]])
        assert machine.persisted == []  # not also one Persisted per token
        # A write set of one token is a plain Persisted.
        assert await rt.submit({"p": [[b"dtx/c/a.4"]]}) == [4]
        await _settle(lambda: len(persister.calls) == 2)
        persister.release()
        await _settle(lambda: machine.persisted == [4])
        assert machine.batches == [[1, 2, 3]] and rt.stats["persisted_batches"] == 1

    asyncio.run(_with_runtime(tmp_path, persister, body, machine))


def test_a_failed_write_set_acknowledges_nothing_and_stops_the_node(tmp_path: Path) -> None:
    persister = FakePersister(fail=True)

    async def body(rt: RealRuntime, machine: PersistingMachine) -> None:
        await rt.submit({"p": [[b"dtx/c/a.1"], [b"dtx/p/a.1"]]})
        await _settle(lambda: len(persister.calls) == 1)
        persister.release()
        await _settle(lambda: rt.fatal is not None)
        assert isinstance(rt.fatal, OSError) and machine.persisted == []

    asyncio.run(_with_runtime(tmp_path, persister, body))


def test_persists_queued_when_the_node_stops_are_still_written(tmp_path: Path) -> None:
    persister = FakePersister()

    async def body(rt: RealRuntime, machine: PersistingMachine) -> None:
        rt.submit({"p": [[b"dtx/t/c.3"]]})
        await rt.stop()  # in the same turn: the queue has not gone to the store yet
        assert persister.calls == [[(b"dtx/t/c.3", b"v")]]

    asyncio.run(_with_runtime(tmp_path, persister, body))


class BrokenClusterStore(ClusterStore):
    def commit(self, writes: Any) -> int:
        raise OSError("cluster disk gone")


def test_a_failed_cluster_store_commit_acknowledges_nothing_and_stops_the_node(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        port = free_port()
        store = BrokenClusterStore(str(tmp_path / "n"), sync=False)
        machine = PersistingMachine()
        rt = RealRuntime(
            hello=hello_for("n", port),
            store=store,
            machine_factory=lambda rec: machine,  # type: ignore[arg-type,return-value]
            config=RuntimeConfig(listen=f"127.0.0.1:{port}", tls=TLSConfig()),
        )
        await rt.start()
        try:
            await rt.submit({"p": [[b"raft/a"], [b"raft/b"]]})
            await asyncio.wait_for(rt.stopped.wait(), 10)  # the node stopped itself
            assert isinstance(rt.fatal, OSError) and machine.persisted == []
        finally:
            await rt.stop()
            store.close()

    asyncio.run(main())
