"""A small driver for tests: a few machines by name, carried out by hand or on a clock.

:class:`~nonstop.sim.core.Simulation` runs whole seeded scenarios under the
nemesis.  Unit tests need less and want more control: hand one machine one
event and look at its actions, decide when a disk syncs, step a Raft cluster
message by message, or run machines next to real stores on an asyncio loop.
:class:`Harness` is that driver -- the one event loop tests use instead of
their own.  It carries out the actions of the machines it runs:

* ``Send`` -- through a small network: the message round-trips through msgpack
  like the wire (:func:`nonstop.sim.core.encode`), may be lost (``drop``) or
  duplicated (``duplicate``), arrives after a delay drawn from ``latency``,
  never over a cut link (:meth:`Harness.block`, :meth:`Harness.partition`,
  checked when sent and when delivered), and only to the incarnation of the
  destination it was sent to; a ``cut(sender, to, payload)`` hook, asked at
  delivery, may drop it too (or act: stop a node, say).  Sends to a name the
  harness does not run are recorded and dropped.
* ``Persist`` -- one of three disks: **by hand** (the default: writes wait in
  the node's :class:`~nonstop.sim.core.Disk` until :meth:`Harness.sync`), **with
  latency** (``disk=(lo, hi)``: each write is durable, then acknowledged, a
  uniform delay after the previous one of that node ended), or **a writer of
  the test's** (``persist=``: real stores; it calls ``done`` back on the
  clock's thread).  A crash loses what was not durable.
* ``SetTimer`` / ``CancelTimer`` -- timers on the clock; re-arming or
  cancelling makes the earlier one a no-op.
* ``Reply``, ``Notify``, ``Log`` -- recorded (:attr:`Harness.replies`,
  :attr:`Harness.notes`, :attr:`Harness.logs`) and handed to ``on_output`` as
  they come, in action order.

Time comes from a clock: :class:`VirtualClock` (a heap of callbacks: nothing
happens until the test calls :meth:`Harness.step`, :meth:`Harness.run` or
:meth:`Harness.run_until`; deterministic) or :class:`LoopClock` (an asyncio
loop: things happen as the loop turns, in real time).  Every random draw comes
from the ``rng`` the harness is given, in the order actions are carried out.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    Event,
    Log,
    Machine,
    NodeId,
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
from nonstop.sim.core import Disk, decode, encode

Observer = Callable[[NodeId, Event | None, list[Action]], None]
"""Called after a machine's actions were carried out (``event`` None: a direct call)."""

Writer = Callable[[NodeId, Persist, Callable[[BaseException | None], None]], None]
"""``persist(node, action, done)``: write ``action.writes`` durably, then call ``done``."""


class Clock(Protocol):
    """Where the harness's time comes from and where its callbacks wait."""

    @property
    def now(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> None: ...


class VirtualClock:
    """Virtual time: callbacks wait in a heap ordered by (time, order of scheduling)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.call_at(self.now + delay, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), callback))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Run the earliest callback (the clock moves to its time); False if none is left."""
        if not self._heap:
            return False
        when, _, callback = heapq.heappop(self._heap)
        self.now = max(self.now, when)
        callback()
        return True

    def advance(self, to: float) -> None:
        """Move the clock forward to ``to`` without running anything (tests stepping by hand)."""
        self.now = max(self.now, to)

    def clear(self) -> None:
        """Forget everything scheduled (messages in flight, timers, disk writes)."""
        self._heap.clear()


class LoopClock:
    """Real time: the asyncio loop's clock and scheduler."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    @property
    def now(self) -> float:
        return self.loop.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        if delay <= 0:
            self.loop.call_soon(callback)
        else:
            self.loop.call_later(delay, callback)

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        self.loop.call_at(when, callback)


class Harness:
    """Machines by name, their actions carried out on a clock (module doc)."""

    def __init__(
        self,
        clock: Clock | None = None,
        *,
        rng: random.Random | None = None,
        latency: tuple[float, float] = (0.0, 0.0),
        drop: float = 0.0,
        duplicate: float = 0.0,
        disk: tuple[float, float] | None = None,
        persist: Writer | None = None,
    ) -> None:
        self.clock: Clock = clock if clock is not None else VirtualClock()
        self.rng = rng if rng is not None else random.Random(0)
        self.latency = latency
        self.drop = drop
        """Probability that a message is lost (drawn for every message sent)."""
        self.duplicate = duplicate
        """Probability that a message also arrives a second time, later."""
        self.disk = disk
        self.persist = persist
        self.machines: dict[NodeId, Machine] = {}
        """The running machines (a crashed node is not here until it boots again)."""
        self.disks: dict[NodeId, Disk] = {}
        self.incarnation: dict[NodeId, int] = {}
        self.blocked: set[tuple[NodeId, NodeId]] = set()
        self.cut: Callable[[NodeId, NodeId, Any], bool] | None = None
        self.sends: list[tuple[NodeId, Send]] = []
        self.replies: dict[int, Any] = {}
        self.notes: list[tuple[NodeId, Notify]] = []
        self.logs: list[tuple[NodeId, Log]] = []
        self.failures: list[BaseException] = []
        """Exceptions machines raised (re-raised too; on a loop they would only be logged)."""
        self.observers: list[Observer] = []
        self.on_output: Callable[[NodeId, Action], None] | None = None
        self._timers: dict[tuple[NodeId, str], int] = {}
        self._timer_generation = itertools.count(1)
        self._disk_free: dict[NodeId, float] = {}

    # ---------------------------------------------------------------- nodes
    @property
    def now(self) -> float:
        return self.clock.now

    @property
    def up(self) -> set[NodeId]:
        return set(self.machines)

    def durable(self, name: NodeId) -> dict[bytes, bytes]:
        """What ``name`` has on disk (by-hand and latency disks)."""
        return self.disks.setdefault(name, Disk()).durable

    def boot(self, name: NodeId, machine: Machine) -> list[Action]:
        """Start ``machine`` as a new incarnation of ``name``: it gets ``Started`` now."""
        if name in self.machines:
            raise ValueError(f"{name} is running: crash it first")
        self.incarnation[name] = self.incarnation.get(name, 0) + 1
        self.disks.setdefault(name, Disk())
        self._disk_free[name] = self.now
        self.machines[name] = machine
        return self.deliver(name, Started(self.now))

    def crash(self, name: NodeId) -> None:
        """Stop ``name``: its timers, messages to it and writes not yet durable are lost."""
        self.machines.pop(name, None)
        self.incarnation[name] = self.incarnation.get(name, 0) + 1
        if name in self.disks:
            self.disks[name].pending.clear()

    def _current(self, name: NodeId, incarnation: int) -> bool:
        return name in self.machines and self.incarnation.get(name) == incarnation

    # --------------------------------------------------------------- events
    def deliver(self, name: NodeId, event: Event) -> list[Action]:
        """Hand ``event`` to the running machine ``name`` now; carry out its actions."""
        machine = self.machines[name]
        try:
            actions = machine.handle(event)
        except BaseException as exc:  # a machine bug: the test must see it
            self.failures.append(exc)
            raise
        self._carry_out(name, event, actions)
        return actions

    def execute(self, name: NodeId, actions: list[Action]) -> None:
        """Carry out actions ``name`` returned from a direct call (not from an event)."""
        self._carry_out(name, None, actions)

    def sync(self, name: NodeId) -> list[Action]:
        """By-hand disk: make every buffered write of ``name`` durable, acknowledge each."""
        disk = self.disks[name]
        batch, disk.pending = disk.pending, []
        for persist in batch:
            disk.apply(persist)
        out: list[Action] = []
        for persist in batch:
            out += self.deliver(name, Persisted(self.now, persist.token))
        return out

    def _carry_out(self, name: NodeId, event: Event | None, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Send):
                self._send(name, action)
            elif isinstance(action, SetTimer):
                self._set_timer(name, action)
            elif isinstance(action, CancelTimer):
                self._timers[(name, action.name)] = -1
            elif isinstance(action, Persist):
                self._persist(name, action)
            else:
                if isinstance(action, Reply):
                    self.replies[action.request_id] = action.payload
                elif isinstance(action, Notify):
                    self.notes.append((name, action))
                elif isinstance(action, Log):
                    self.logs.append((name, action))
                if self.on_output is not None:
                    self.on_output(name, action)
        for observer in self.observers:
            observer(name, event, actions)

    # -------------------------------------------------------------- network
    def block(self, src: NodeId, dst: NodeId) -> None:
        """Cut the link ``src -> dst`` only."""
        self.blocked.add((src, dst))

    def partition(self, *groups: Iterable[NodeId]) -> None:
        """Cut every link between the groups, both ways (replaces earlier cuts)."""
        sets = [set(g) for g in groups]
        self.blocked = {(a, b) for g in sets for h in sets if g is not h for a in g for b in h}

    def heal(self) -> None:
        self.blocked = set()

    def _send(self, src: NodeId, send: Send) -> None:
        self.sends.append((src, send))
        raw = encode(send.payload)  # what the wire does, at once: a bad payload fails here
        if (src, send.to) in self.blocked or self.rng.random() < self.drop:
            return
        to = send.to
        incarnation = self.incarnation.get(to, 0)

        def arrive() -> None:
            if not self._current(to, incarnation) or (src, to) in self.blocked:
                return
            payload = decode(raw)
            if self.cut is not None and self.cut(src, to, payload):
                return
            if to in self.machines:  # the cut hook may have stopped it
                self.deliver(to, Received(self.now, src, payload))

        self.clock.call_later(self.rng.uniform(*self.latency), arrive)
        if self.rng.random() < self.duplicate:
            self.clock.call_later(3 * self.rng.uniform(*self.latency), arrive)

    # -------------------------------------------------------------- timers
    def _set_timer(self, name: NodeId, timer: SetTimer) -> None:
        generation = next(self._timer_generation)
        self._timers[(name, timer.name)] = generation
        incarnation = self.incarnation[name]

        def fire() -> None:
            if self._current(name, incarnation) and self._timers.get((name, timer.name)) == (
                generation
            ):
                self.deliver(name, TimerFired(self.now, timer.name))

        self.clock.call_later(timer.delay, fire)

    # ---------------------------------------------------------------- disks
    def _persist(self, name: NodeId, persist: Persist) -> None:
        incarnation = self.incarnation[name]
        if self.persist is not None:

            def done(exc: BaseException | None) -> None:
                if not self._current(name, incarnation):
                    return
                if exc is not None:
                    self.failures.append(exc)
                    return
                self.deliver(name, Persisted(self.now, persist.token))

            self.persist(name, persist, done)
            return
        disk = self.disks[name]
        if self.disk is None:
            disk.pending.append(persist)  # until sync(name)
            return
        start = max(self.now, self._disk_free[name])
        finished = start + self.rng.uniform(*self.disk)
        self._disk_free[name] = finished

        def durable() -> None:
            if self._current(name, incarnation):
                disk.apply(persist)
                self.deliver(name, Persisted(self.now, persist.token))

        self.clock.call_at(finished, durable)

    # ----------------------------------------------------------- running
    def _virtual(self) -> VirtualClock:
        if not isinstance(self.clock, VirtualClock):
            raise TypeError("stepping needs a VirtualClock; a LoopClock runs with its loop")
        return self.clock

    def step(self) -> bool:
        """Run the next scheduled thing; False if nothing is left."""
        return self._virtual().step()

    def run(self, duration: float) -> None:
        """Run everything due within ``duration``; the clock ends ``duration`` later."""
        clock = self._virtual()
        end = clock.now + duration
        while (t := clock.next_time()) is not None and t <= end:
            clock.step()
        clock.advance(end)

    def run_until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        """Step until ``done()``; AssertionError if it is not within ``timeout`` seconds."""
        clock = self._virtual()
        end = clock.now + timeout
        while not done():
            t = clock.next_time()
            if t is None or t > end:
                raise AssertionError(f"condition not reached within {timeout}s")
            clock.step()


__all__ = ["Clock", "Harness", "LoopClock", "Observer", "VirtualClock", "Writer"]
