"""Queued calls and timers run on their partition's active node (A6, D20; ha.md §"Queued
calls and timers move with their partition").

On a node whose partitions replicate, a queued asynchronous call (or timer) of an
object of partition P is an entry of P's replicated write set (``q:`` keys,
:mod:`nonstop.node.replica_store`), so it is on P's sync replicas when the
transaction that queued it commits.  This module is the node's
:class:`~nonstop.tx.asyncmethods.CallGate`, which makes its *run* P's too:

* **Who runs it.**  A call of P runs only where P is acted for *and* the store took
  P's copy (``ReplicatedClusterNode.ready``): :meth:`ReplicatedCallGate.admit`
  answers a fence token ``(P, stream id)`` for such a target and None otherwise
  (the dispatcher parks it).  A target outside every partition (a node's own
  location) runs here, as without partitions.
* **How its run commits.**  :meth:`ReplicatedCallGate.commit` (a dispatcher thread)
  hands the run's records -- the method's effects, its queue entry's deletion, the
  calls it queued -- to the node's loop, which checks that the token still holds (P
  still acted for, under the same stream: a node that stopped acting for P, or
  lost and took P again, does not commit a run it began before) and replicates
  them like a one-node commit; only then is the store commit made.  A refusal
  (nothing made) parks the target; an unknown outcome (the record may be on the
  promoted copy) parks it under its token: it runs again only from a later copy,
  which says whether it ran.
* **One partition per run.**  A run reads and writes objects of its target's
  partition (and node-local ones) only, and queues calls on them only: the node
  acting for P may hold a stale copy of another partition, and its replication
  refuses another partition's records.  A run that touched another partition
  is rolled back and dead-lettered with an error naming it (deterministic,
  whatever the placement of the two partitions).
* **Who picks calls up.**  A loop task refreshes the admitted partitions every
  :data:`REFRESH` seconds; when they change (a promotion, a handover, a load
  finished) or a parked target may be admitted again, the dispatcher rescans the
  store's queue (``AsyncDispatcher.resume``): the partition's pending calls and
  timers -- the copy's, loaded with it -- start running here.

Exactly once: a call's entry is deleted in the replicated transaction that applies
its effects, and only the node acting for P at the current stream commits one; a
promoted replica's copy holds the entry if and only if the run's record did not
reach it, so it runs the call if and only if the dead node's run is not in the copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from nonstop.dataplane.replicated_records import replicated_records
from nonstop.errors import Error, NotActive, Unavailable
from nonstop.ha.partition_table import partition_location
from nonstop.model.ref import REF_SIZE, Ref
from nonstop.tx.asyncmethods import AsyncDispatcher, Parked
from nonstop.tx.entries import TxState
from nonstop.tx.transaction import Transaction

log = logging.getLogger("nonstop.node.calls")

REFRESH = 0.2
"""Seconds between two looks at which partitions this node runs calls for."""
RESCAN_PARKED = 1.0
"""Seconds between two rescans while a parked target would be admitted and the partitions
did not change (a refusal during a handover, a replica being dropped)."""
COMMIT_TIMEOUT = 60.0
"""Seconds a run waits for its replication before its outcome counts as unknown."""

Token = tuple[str, int]
"""A fence token: (partition, stream id) -- or ("", 0) for a node-local target."""
LOCAL: Token = ("", 0)

Replicate = Callable[[list[list[Any]]], Awaitable[dict[str, Any] | None]]
"""``StoreSide.commit``: None once on every in-sync copy; an unknown outcome's reply."""


class ReplicatedCallGate:
    """The node's call gate (module doc).  ``machine``: the node's current machine (a
    ``ReplicatedClusterNode``); ``replicate``: ``StoreSide.commit``."""

    def __init__(
        self,
        dispatcher: AsyncDispatcher,
        machine: Callable[[], Any],
        replicate: Replicate,
        now: Callable[[], float],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._dispatcher = dispatcher
        self._machine = machine
        self._replicate = replicate
        self._now = now
        self._loop = loop
        # Written by the loop, read by dispatcher threads (one reference swap each).
        self._admitted: dict[int, Token] = {}
        self._partitioned: frozenset[int] = frozenset()
        self._names: dict[int, str] = {}
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------- the gate
    def admit(self, target: bytes) -> Token | None:
        location = Ref(target).location
        token = self._admitted.get(location)
        if token is not None:
            return token
        return None if location in self._partitioned or not self._partitioned else LOCAL

    def commit(self, tx: Transaction, token: object) -> None:
        """Replicate ``tx``'s write set on the loop, then commit it here (module doc)."""
        ws = tx._prepare_commit()  # triggers and prepare notifiers: the write set is final
        if ws is None:
            tx._finish(TxState.COMMITTED)
            return
        stray = self._other_partition(tx, token)
        if stray is not None:
            tx._finish(TxState.ROLLED_BACK)
            raise Error(
                f"an asynchronous call's run touched an object of partition {stray}, not its "
                "target's: with partitions a run reads and writes its target's partition only "
                "(queue a call on the other object from a client transaction instead)"
            )
        records = replicated_records(tx)
        future = asyncio.run_coroutine_threadsafe(self._replicated(records, token), self._loop)
        deadline = time.monotonic() + COMMIT_TIMEOUT
        try:
            while True:
                try:
                    unknown = future.result(0.5)
                    break
                except FutureTimeout:
                    # (a node stopping does not wait COMMIT_TIMEOUT for its loop)
                    if self._dispatcher.stopping or time.monotonic() > deadline:
                        future.cancel()
                        raise Parked("the run's replication did not answer", token) from None
        except Parked:
            tx._finish(TxState.ROLLED_BACK)
            raise
        except (NotActive, Unavailable) as exc:
            tx._finish(TxState.ROLLED_BACK)
            raise Parked(f"the run was refused: {exc}") from None
        except BaseException:
            tx._finish(TxState.ROLLED_BACK)
            raise
        if unknown is not None:
            tx._finish(TxState.ROLLED_BACK)
            raise Parked(f"the run's outcome is unknown here: {unknown}", token)
        try:
            tx.engine.committer.commit(ws)
        except BaseException:
            tx._finish(TxState.ROLLED_BACK)
            raise
        tx._finish(TxState.COMMITTED)

    def _other_partition(self, tx: Transaction, token: object) -> str | None:
        """The partition of an object ``tx`` touched, other than its target's (module doc:
        one partition per run), or None."""
        names = self._names
        own = token[0] if isinstance(token, tuple) else ""
        for entry in tx.entries():
            name = names.get(Ref(entry.ref).location)
            if name is not None and name != own:
                return name
        for key, _ in tx.queued_calls():
            name = names.get(Ref(key[:REF_SIZE]).location)
            if name is not None and name != own:
                return name
        return None

    async def _replicated(self, records: list[list[Any]], token: object) -> dict[str, Any] | None:
        if token != LOCAL:
            name = token[0] if isinstance(token, tuple) else ""
            if self._token_of(name) != token:  # the fence, checked on the loop (module doc)
                raise NotActive(f"this node no longer runs {name}'s calls under {token}")
        return await self._replicate(records)

    # ------------------------------------------------------------- the loop's side
    def _token_of(self, name: str) -> Token | None:
        machine = self._machine()
        if machine is None:
            return None
        cluster = getattr(machine, "cluster", machine)
        ready = getattr(machine, "ready", None)
        streams = getattr(getattr(machine, "replication", None), "streams", {})
        stream = streams.get(name)
        if ready is None or stream is None or not ready(name):
            return None
        if not cluster.acting(self._now(), name):
            return None
        return (name, int(stream.stream_id))

    def refresh(self) -> bool:
        """Look again at which partitions this node runs calls for; True if it changed."""
        machine = self._machine()
        if machine is None:
            return False
        cluster = getattr(machine, "cluster", machine)
        table = getattr(cluster, "partition_table", None)
        names = list(table.partitions) if table is not None else []
        self._names = {partition_location(n): n for n in names}
        self._partitioned = frozenset(self._names)
        admitted: dict[int, Token] = {}
        for name in names:
            token = self._token_of(name)
            if token is not None:
                admitted[partition_location(name)] = token
        if admitted == self._admitted:
            return False
        self._admitted = admitted
        return True

    def _admits_parked(self) -> bool:
        """Would some parked target be admitted now (under a token it may run under)?"""
        for target, fenced in self._dispatcher.parked().items():
            token = self.admit(target)
            if token is not None and (fenced is None or fenced != token):
                return True
        return False

    def start(self) -> None:
        """Attach to the dispatcher and start the refresh task (on the node's loop)."""
        self.refresh()
        self._dispatcher.attach_gate(self)
        self._task = self._loop.create_task(self._refreshing())

    async def _refreshing(self) -> None:
        last_rescan = time.monotonic()
        changed = True  # a first rescan: what the store holds of the partitions admitted now
        while True:
            try:
                changed = self.refresh() or changed
                if changed or (
                    time.monotonic() - last_rescan >= RESCAN_PARKED and self._admits_parked()
                ):
                    last_rescan = time.monotonic()
                    count = await asyncio.to_thread(self._dispatcher.resume)
                    if count:
                        log.info("%d queued calls and timers to run here", count)
                changed = False
            except Exception:
                log.exception("queued calls: refresh failed (tried again)")
            await asyncio.sleep(REFRESH)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


__all__ = ["LOCAL", "REFRESH", "ReplicatedCallGate", "Token"]
