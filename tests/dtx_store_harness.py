"""A tiny in-process runtime: DtxNodes over real Databases, no network.

Each node is a :class:`~nonstop.dtx.protocol.DtxNode` with a
:class:`~nonstop.dataplane.participant.StoreResourceManager` and a
:class:`~nonstop.dataplane.participant.DtxPersister` on its own ``nonstop.Database``;
the decision log is a :class:`~nonstop.sim.scenarios.dtx_resource.SimDecisionLog` whose
keys go to an fsynced LMDB (so it survives a SIGKILL of the process too).
``Send`` is delivered on the next loop turn (dropped while a node is down or a
``drop`` hook says so), ``Persist`` goes through the persister (the log's
through its store), timers are ``loop.call_later``.  Branches are
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
    Persisted,
    Received,
    Reply,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.runtime.storage import ClusterStore
from nonstop.sim.scenarios.dtx_resource import SimDecisionLog
from nonstop.tx.async_transaction import AsyncTransaction

CFG = DtxConfig(tick=0.02, retry=0.05, vote_timeout=1.5, branch_timeout=1.0, decision_timeout=0.4)


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
        self.machines: dict[str, Any] = {}
        self.rms: dict[str, StoreResourceManager] = {}
        self.persisters: dict[str, DtxPersister] = {}
        self.incarnation: dict[str, int] = {}
        self.timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self.branches: dict[str, AsyncTransaction] = {}
        self.replies: dict[int, asyncio.Future[Any]] = {}
        self.notes: list[tuple[str, Notify]] = []
        self.logs: list[tuple[str, Log]] = []
        self.errors: list[BaseException] = []
        self.drop: Callable[[str, str, Any], bool] = lambda sender, to, payload: False
        self.on_notify: Callable[[str, Notify], None] = lambda node, note: None
        self._next_request = 0
        self._next_branch = 0
        self.log_store = ClusterStore(str(root / "decision-log"))
        for name in names:
            self.start(name)
        self._start_log()

    # ------------------------------------------------------------ lifecycle
    def _start_log(self) -> None:
        self.incarnation[LOG] = self.incarnation.get(LOG, 0) + 1
        self.machines[LOG] = SimDecisionLog(random.Random(0), self.log_store.recovered())
        self.dispatch(LOG, Started(self.loop.time()))

    def start(self, name: str) -> None:
        """Open (or reopen) the node's store and build its machine from the store's dtx state."""
        db = nonstop.open(self.root / name, lock_timeout=self.lock_timeout)
        self.dbs[name] = db
        self.incarnation[name] = self.incarnation.get(name, 0) + 1
        inc = self.incarnation[name]

        def feed(progress: list[Progress]) -> None:
            self.loop.call_soon(self._deliver, name, inc, name, {"t": "dtx.rm", "p": progress})

        rm = StoreResourceManager(db, self.branches.get, feed)
        self.rms[name] = rm
        self.persisters[name] = DtxPersister(db)
        node = DtxNode(name, rm, random.Random(name), recovered_dtx_state(db), self.config)
        self.machines[name] = node
        self.dispatch(name, Started(self.loop.time()))

    def stop(self, name: str) -> None:
        """Stop a node: nothing more reaches it, its timers die, its store is closed."""
        self.incarnation[name] += 1
        for key in [k for k in self.timers if k[0] == name]:
            self.timers.pop(key).cancel()
        self.machines.pop(name, None)
        self.dbs[name].close()

    def close(self) -> None:
        for key in list(self.timers):
            self.timers.pop(key).cancel()
        self.machines.clear()
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
                    or self.dbs[n]._preparing
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
        machine = self.machines.get(name)
        if machine is None:
            return
        try:
            actions = machine.handle(event)
        except BaseException as exc:  # a machine bug: fail the test, not the loop
            self.errors.append(exc)
            raise
        for action in actions:
            self._act(name, action)

    def _act(self, name: str, action: Action) -> None:
        inc = self.incarnation[name]
        if isinstance(action, Send):
            self.loop.call_soon(self._deliver, action.to, None, name, action.payload)
        elif isinstance(action, Persist):
            if name == LOG:
                self.log_store.commit(action.writes)
                self.loop.call_soon(self._persisted, name, inc, action.token, None)
            else:
                token = action.token

                def done(exc: BaseException | None, token: int = token) -> None:
                    self.loop.call_soon_threadsafe(self._persisted, name, inc, token, exc)

                self.persisters[name].persist(action.writes, done)
        elif isinstance(action, SetTimer):
            old = self.timers.pop((name, action.name), None)
            if old is not None:
                old.cancel()
            self.timers[(name, action.name)] = self.loop.call_later(
                action.delay, self._fire, name, inc, action.name
            )
        elif isinstance(action, Reply):
            future = self.replies.get(action.request_id)
            if future is not None and not future.done():
                future.set_result(action.payload)
        elif isinstance(action, Notify):
            self.notes.append((name, action))
            self.on_notify(name, action)
        elif isinstance(action, Log):
            self.logs.append((name, action))

    def _deliver(self, to: str, inc: int | None, sender: str, payload: Any) -> None:
        if inc is not None and self.incarnation.get(to) != inc:
            return  # from a previous life of the node
        if self.drop(sender, to, payload):
            return
        self.dispatch(to, Received(self.loop.time(), sender, payload))

    def _persisted(self, name: str, inc: int, token: int, exc: BaseException | None) -> None:
        if self.incarnation.get(name) != inc:
            return
        if exc is not None:
            self.errors.append(exc)
            return
        self.dispatch(name, Persisted(self.loop.time(), token))

    def _fire(self, name: str, inc: int, timer: str) -> None:
        if self.incarnation.get(name) != inc:
            return
        self.timers.pop((name, timer), None)
        self.dispatch(name, TimerFired(self.loop.time(), timer))
