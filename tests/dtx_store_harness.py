"""A tiny in-process runtime: DtxNodes over real Databases, no network.

Each node is a :class:`~nonstop.dtx.protocol.DtxNode` with a
:class:`~nonstop.dataplane.participant.StoreResourceManager` and a
:class:`~nonstop.dataplane.participant.DtxPersister` on its own ``nonstop.Database``;
the decision log is a :class:`~nonstop.sim.scenarios.dtx_resource.SimDecisionLog` whose
keys go to an fsynced LMDB (so it survives a SIGKILL of the process too).
The tests' driver (:class:`nonstop.sim.harness.Harness`) runs them on the
test's asyncio loop (:class:`~nonstop.sim.harness.LoopClock`): a ``Send`` goes
through msgpack and is delivered on the next loop turn (dropped while its
destination is down, restarted, or a ``drop`` hook says so), ``Persist`` goes
through the persister (the log's through its store), timers are
``loop.call_later``.  Branches are
``AsyncTransaction`` objects the test opens and registers by id, as the data
service does.  Used by tests/unit/test_dataplane_participant.py and the e2e crash
worker.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nonstop
from nonstop.dataplane.participant import DtxPersister, StoreResourceManager, recovered_dtx_state
from nonstop.dtx.decisions import LOG
from nonstop.dtx.protocol import DtxConfig, DtxNode, Progress
from nonstop.model.wire import write_out
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Log,
    Notify,
    Persist,
    Received,
    Reply,
)
from nonstop.runtime.storage import ClusterStore
from nonstop.sim.harness import Harness, LoopClock
from nonstop.sim.scenarios.dtx_resource import SimDecisionLog
from nonstop.tx.async_transaction import AsyncTransaction

CFG = DtxConfig(tick=0.02, retry=0.05, vote_timeout=1.5, branch_timeout=1.0, decision_timeout=0.4)


class NoStore:
    """A resource manager that holds nothing (a test drives the machine around it)."""

    def check_ops(self, ops: Any) -> str | None:
        return None

    def open(self, gtid: str, ops: list[Any]) -> list[Any]:
        return []

    def finish(self, gtid: str, commit: bool) -> tuple[list[Any], list[Any]]:
        return [], []

    def recover(self, gtid: str, record: bytes) -> None:
        return None


class Cluster:
    """Nodes ``names`` under ``root`` (one store directory each) plus the decision log."""

    def __init__(
        self,
        root: Path,
        names: list[str],
        *,
        config: DtxConfig = CFG,
        lock_timeout: float = 2.0,
    ) -> None:
        self.root = root
        self.names = names
        self.config = config
        self.lock_timeout = lock_timeout
        self.loop = asyncio.get_running_loop()
        self.dbs: dict[str, nonstop.Database] = {}
        self.rms: dict[str, StoreResourceManager] = {}
        self.persisters: dict[str, DtxPersister] = {}
        self.branches: dict[str, AsyncTransaction] = {}
        self.replies: dict[int, asyncio.Future[Any]] = {}
        self.drop: Callable[[str, str, Any], bool] = lambda sender, to, payload: False
        self.on_notify: Callable[[str, Notify], None] = lambda node, note: None
        self._next_request = 0
        self._next_branch = 0
        self.log_store = ClusterStore(str(root / "decision-log"))
        # The tests' driver on this loop: messages next turn, timers in real time.
        self.harness = Harness(LoopClock(self.loop), persist=self._write)
        self.harness.cut = lambda sender, to, payload: self.drop(sender, to, payload)
        self.harness.on_output = self._output
        for name in names:
            self.start(name)
        self._start_log()

    @property
    def machines(self) -> dict[str, Any]:
        return self.harness.machines

    @property
    def notes(self) -> list[tuple[str, Notify]]:
        return self.harness.notes

    @property
    def logs(self) -> list[tuple[str, Log]]:
        return self.harness.logs

    @property
    def errors(self) -> list[BaseException]:
        return self.harness.failures

    # ------------------------------------------------------------ lifecycle
    def _start_log(self) -> None:
        self.harness.boot(LOG, SimDecisionLog(random.Random(0), self.log_store.recovered()))

    def start(self, name: str) -> None:
        """Open (or reopen) the node's store and build its machine from the store's dtx state."""
        db = nonstop.open(self.root / name, lock_timeout=self.lock_timeout)
        self.dbs[name] = db
        harness = self.harness
        incarnation = harness.incarnation.get(name, 0) + 1  # the one boot() starts below

        def feed(progress: list[Progress]) -> None:
            """The store's progress, handed over by the runtime itself: next loop turn, not
            through the network (not encoded, never lost), to this incarnation only."""

            def arrive() -> None:
                if harness.incarnation.get(name) == incarnation and name in harness.machines:
                    payload = {"t": "dtx.rm", "p": progress}
                    harness.deliver(name, Received(self.loop.time(), name, payload))

            self.loop.call_soon(arrive)

        rm = StoreResourceManager(db, self.branches.get, feed)
        self.rms[name] = rm
        self.persisters[name] = DtxPersister(db)
        node = DtxNode(name, rm, random.Random(name), recovered_dtx_state(db), self.config)
        harness.boot(name, node)

    def stop(self, name: str) -> None:
        """Stop a node: nothing more reaches it, its timers die, its store is closed."""
        self.harness.crash(name)
        self.dbs[name].close()

    def close(self) -> None:
        for name in list(self.harness.machines):
            self.harness.crash(name)
        for db in self.dbs.values():
            db.close()
        self.log_store.close()

    # ------------------------------------------------------------ branches
    async def branch(self, node: str) -> tuple[str, AsyncTransaction]:
        """Open a branch transaction on ``node`` (what the data service does on a first op)."""
        self._next_branch += 1
        branch_id = f"c.{self._next_branch}"
        tx = await self.dbs[node].transaction().__aenter__()
        self.branches[branch_id] = tx
        return branch_id, tx

    @staticmethod
    def write(obj: nonstop.Managed, **changes: Any) -> list[Any]:
        e = obj._e
        return ["w", *write_out(e.ref, e.info.name, e.version, changes)]

    async def run(self, coordinator: str, branches: dict[str, list[Any]]) -> Any:
        """Submit ``{"op": "run"}`` to ``coordinator``; the machine's reply."""
        rid = self.submit(coordinator, branches)
        return await self.replies[rid]

    def submit(self, coordinator: str, branches: dict[str, list[Any]]) -> int:
        self._next_request += 1
        rid = self._next_request
        self.replies[rid] = self.loop.create_future()
        self.dispatch(
            coordinator,
            ClientRequest(self.loop.time(), rid, {"op": "run", "branches": branches}),
        )
        return rid

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait until no node coordinates or holds a branch, and the store has nothing in doubt."""
        deadline = self.loop.time() + timeout
        while self.loop.time() < deadline:
            busy = [
                n
                for n in self.names
                if n in self.machines
                and (
                    self.machines[n].coord
                    or self.machines[n].branches
                    or self.dbs[n].in_doubt()
                    or self.dbs[n].engine.prepared.staged()
                )
            ]
            if not busy:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"not settled after {timeout}s: {self.status()}")

    def status(self) -> dict[str, Any]:
        return {
            n: {**self.machines[n].status(), "in_doubt": self.dbs[n].in_doubt()}
            for n in self.names
            if n in self.machines
        }

    # ------------------------------------------------------------ the runtime
    def dispatch(self, name: str, event: Event) -> None:
        if name in self.harness.machines:
            self.harness.deliver(name, event)

    def _write(
        self, name: str, persist: Persist, done: Callable[[BaseException | None], None]
    ) -> None:
        """The disks: the log's store, or the node's object store through its persister."""
        if name == LOG:
            self.log_store.commit(persist.writes)
            self.loop.call_soon(done, None)
            return

        def written(exc: BaseException | None) -> None:  # in the store's writer thread
            self.loop.call_soon_threadsafe(done, exc)

        self.persisters[name].persist(persist.writes, written)

    def _output(self, name: str, action: Action) -> None:
        if isinstance(action, Reply):
            future = self.replies.get(action.request_id)
            if future is not None and not future.done():
                future.set_result(action.payload)
        elif isinstance(action, Notify):
            self.on_notify(name, action)
