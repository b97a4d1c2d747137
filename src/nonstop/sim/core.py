"""The deterministic simulator: many machines, one virtual clock, one seeded RNG.

Everything that happens is an entry of one event heap ordered by (virtual time,
sequence number); every random choice (message delay, loss, duplication, fsync
latency, the machines' own RNGs, the nemesis) is drawn from one
``random.Random(seed)``.  So a seed *is* a run: replaying it reproduces every
event bit for bit (checked by :attr:`Simulation.trace_digest`).

What is simulated (see ``docs/design/simulation.md``):

* **Network** -- every ``Send`` is msgpack-encoded (a payload that would not
  survive the wire fails here too), delayed by a random latency, and may be
  dropped, duplicated or reordered.  Links can be cut in one direction only
  (:meth:`Simulation.block`) or both (:meth:`Simulation.partition`); a message
  in flight on a link that is cut is lost.
* **Disk** -- ``Persist`` actions go through the same
  :class:`~nonstop.runtime.persist.PersistRouter` as in the real runtime; the
  node's simulated disk is its default persister (a scenario may route a key
  prefix to a persister of its own with :meth:`Simulation.route_persists`, as
  the real node routes ``dtx/`` to the object store).  On the disk, writes go
  to a volatile buffer; one simulated fsync later (group commit: every write
  buffered by then, in order) they are durable and each ``Persisted(token)`` is
  delivered.  A crash loses the buffer, except possibly a prefix of it (the OS
  may have written some of it already), which keeps each ``Persist`` atomic
  and in order as the contract promises.
* **Disk stalls** -- :meth:`Simulation.stall_disk` holds every fsync of a node
  for a while, as a saturated or failing disk does, while the node runs on.
* **Nodes** -- crash (state and timers lost, durable dict kept), restart (a
  new machine from the durable dict), pause/resume (SIGSTOP/SIGCONT: nothing is
  delivered and no timer fires while paused; on resume the backlog arrives in
  order, overdue timers fire at once).  The clock is global.

The simulator knows nothing about any protocol: checkers observe it through
:attr:`Simulation.observers`.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    ClientRequest,
    Event,
    Log,
    Machine,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    Reconnect,
    Reply,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.runtime.persist import Done, Persister, PersistRouter

MachineFactory = Callable[[random.Random, Mapping[bytes, bytes]], Machine]
"""``factory(rng, recovered) -> machine``: builds a node's machine for one incarnation."""

Observer = Callable[["Simulation", NodeId, Event, list[Action]], None]
"""Called after every event a machine handled, with the actions it returned."""


class SimulationError(Exception):
    """The simulation itself went wrong (runaway event loop, unknown node)."""


def encode(payload: Any) -> bytes:
    """Encode like the wire does (rule 4 of the machine contract)."""
    return msgpack.packb(payload, use_bin_type=True)


def decode(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


@dataclass(slots=True)
class NetConfig:
    """Network behaviour.  Delays are ``delay_min + expovariate(1 / delay_mean)``."""

    delay_min: float = 0.0005
    delay_mean: float = 0.002
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    """Probability that a message is held back by an extra ``reorder_delay``."""
    reorder_delay: float = 0.02


@dataclass(slots=True)
class DiskConfig:
    """Simulated fsync latency, uniform in [sync_min, sync_max]."""

    sync_min: float = 0.0005
    sync_max: float = 0.004
    torn_on_crash: bool = True
    """On a crash a random prefix of the unsynced Persists may survive."""


@dataclass(slots=True)
class Disk:
    """One node's storage: what was synced, and what is still in the volatile buffer."""

    durable: dict[bytes, bytes] = field(default_factory=dict)
    pending: list[Persist] = field(default_factory=list)
    acks: list[Done] = field(default_factory=list)
    """The Simulation's: who to tell once ``pending`` is synced (one per write set)."""
    sync_scheduled: bool = False
    syncs: int = 0
    stall_until: float = 0.0
    """No fsync completes before this time (a stalled disk: a full queue, a dying SSD)."""

    def apply(self, persist: Persist) -> None:
        for key, value in persist.writes:
            if value is None:
                self.durable.pop(key, None)
            else:
                self.durable[key] = value


@dataclass(slots=True)
class SimNode:
    """The simulator's bookkeeping for one node (machine plus everything around it)."""

    name: NodeId
    factory: MachineFactory
    machine: Machine | None = None
    incarnation: int = 0
    up: bool = False
    paused: bool = False
    backlog: list[tuple[float, int, str, Any]] = field(default_factory=list)
    timers: dict[str, int] = field(default_factory=dict)
    disk: Disk = field(default_factory=Disk)
    crashes: int = 0
    persists: PersistRouter | None = None
    """Routes the machine's ``Persist`` actions: to :attr:`disk` unless a prefix is routed."""


@dataclass(slots=True)
class ReplyRecord:
    """What became of one client request."""

    node: NodeId
    payload: Any
    sent_at: float
    replied_at: float | None = None
    reply: Any = None


class Simulation:
    """A cluster of sans-I/O machines on a simulated network and disks (see module doc)."""

    def __init__(
        self,
        seed: int,
        net: NetConfig | None = None,
        disk: DiskConfig | None = None,
        *,
        trace: bool = False,
        digest: bool = True,
        max_events: int = 5_000_000,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.net = net or NetConfig()
        self.disk_config = disk or DiskConfig()
        self.now = 0.0
        self.nodes: dict[NodeId, SimNode] = {}
        self.observers: list[Observer] = []
        self.fault_observers: list[Callable[[Simulation, str, dict[str, Any]], None]] = []
        self.requests: dict[int, ReplyRecord] = {}
        self.blocked: set[tuple[NodeId, NodeId]] = set()
        self.loss_bursts: list[tuple[float, float]] = []
        """(until, probability): extra message loss active until ``until``."""
        self.events = 0
        self.messages_sent = 0
        self.messages_dropped = 0
        self.max_events = max_events
        self.keep_trace = trace
        self.keep_digest = digest or trace
        self.trace: list[str] = []
        self._digest = hashlib.blake2b(digest_size=16)
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self._next_request = 0

    # ---------------------------------------------------------------- nodes
    def add_node(self, name: NodeId, factory: MachineFactory, *, start: bool = True) -> SimNode:
        """Register a node; ``start`` boots it now (fresh disk)."""
        if name in self.nodes:
            raise SimulationError(f"node {name} exists")
        node = self.nodes[name] = SimNode(name, factory)
        node.persists = PersistRouter(
            _DiskWriter(self, node),
            on_durable=lambda tokens: self._persisted(node, tokens),
            on_failed=self._persist_failed,
        )
        if start:
            self.start(name)
        return node

    def start(self, name: NodeId) -> None:
        """Boot a node (first start or restart) from its durable dict."""
        node = self._node(name)
        if node.up:
            return
        node.incarnation += 1
        node.up = True
        node.paused = False
        node.backlog.clear()
        node.timers.clear()
        node_rng = random.Random(self.rng.getrandbits(64))
        node.machine = node.factory(node_rng, dict(node.disk.durable))
        self._fault("start", node=name, incarnation=node.incarnation)
        self._push(self.now, "event", (name, node.incarnation, "started", None))

    restart = start

    def crash(self, name: NodeId) -> None:
        """Kill a node: machine, timers, backlog and unsynced writes are gone."""
        node = self._node(name)
        if not node.up:
            return
        disk = node.disk
        survived = 0
        if disk.pending and self.disk_config.torn_on_crash:
            survived = self.rng.randint(0, len(disk.pending))
            for persist in disk.pending[:survived]:
                disk.apply(persist)
        lost = len(disk.pending) - survived
        disk.pending.clear()
        disk.acks.clear()
        disk.sync_scheduled = False
        assert node.persists is not None
        node.persists.reset()  # what was in flight is never acknowledged
        node.up = False
        node.paused = False
        node.machine = None
        node.backlog.clear()
        node.timers.clear()
        node.crashes += 1
        node.incarnation += 1  # everything scheduled for the old incarnation is void
        self._fault("crash", node=name, lost_persists=lost, torn_survivors=survived)

    def pause(self, name: NodeId) -> None:
        """SIGSTOP: the node receives nothing and its timers do not fire until resumed."""
        node = self._node(name)
        if node.up and not node.paused:
            node.paused = True
            self._fault("pause", node=name)

    def resume(self, name: NodeId) -> None:
        """SIGCONT: deliver the backlog (in original order) at the current time."""
        node = self._node(name)
        if not node.paused:
            return
        node.paused = False
        self._fault("resume", node=name, backlog=len(node.backlog))
        backlog, node.backlog = node.backlog, []
        for _, _, kind, data in sorted(backlog, key=lambda e: (e[0], e[1])):
            self._push(self.now, kind, data)

    def stall_disk(self, name: NodeId, duration: float) -> None:
        """No fsync of ``name`` completes for ``duration`` seconds (the node keeps running)."""
        node = self._node(name)
        node.disk.stall_until = max(node.disk.stall_until, self.now + duration)
        self._fault("stall", node=name, duration=round(duration, 6))

    def route_persists(
        self,
        name: NodeId,
        prefix: bytes,
        persister: Persister,
        *,
        label: str,
        distinct_keys: bool = False,
    ) -> None:
        """Send ``name``'s ``Persist`` writes under ``prefix`` to ``persister``, not its disk.

        The persister is the scenario's: it completes write sets when it likes
        (schedule with :meth:`at`), and keeps what is durable across a crash
        itself (watch ``crash`` in :attr:`fault_observers`); the machine
        factory must merge it into ``recovered``.  Completions of a crashed
        incarnation are ignored.
        """
        node = self._node(name)
        assert node.persists is not None
        node.persists.route(prefix, persister, label=label, distinct_keys=distinct_keys)

    def is_up(self, name: NodeId) -> bool:
        node = self._node(name)
        return node.up and not node.paused

    def machine(self, name: NodeId) -> Machine | None:
        return self._node(name).machine

    def _node(self, name: NodeId) -> SimNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise SimulationError(f"unknown node {name}") from None

    # -------------------------------------------------------------- network
    def block(self, src: NodeId, dst: NodeId) -> None:
        """Cut the link src -> dst only (a one-way partition)."""
        self.blocked.add((src, dst))
        self._fault("block", src=src, dst=dst)

    def unblock(self, src: NodeId, dst: NodeId) -> None:
        self.blocked.discard((src, dst))
        self._fault("unblock", src=src, dst=dst)

    def partition(self, *groups: list[NodeId] | tuple[NodeId, ...] | set[NodeId]) -> None:
        """Cut every link between different groups, both ways.  Nodes not named form a group."""
        named = {n for g in groups for n in g}
        rest = [n for n in sorted(self.nodes) if n not in named]
        all_groups = [sorted(g) for g in groups] + ([rest] if rest else [])
        for i, a in enumerate(all_groups):
            for j, b in enumerate(all_groups):
                if i != j:
                    for x in a:
                        for y in b:
                            self.blocked.add((x, y))
        self._fault("partition", groups=all_groups)

    def heal(self) -> None:
        """Reconnect every link and end every loss burst."""
        self.blocked.clear()
        self.loss_bursts.clear()
        self._fault("heal")

    def loss_burst(self, duration: float, probability: float) -> None:
        """Drop each message with ``probability`` for the next ``duration`` seconds."""
        self.loss_bursts.append((self.now + duration, probability))
        self._fault("loss_burst", duration=round(duration, 6), probability=probability)

    def _link_up(self, src: NodeId, dst: NodeId) -> bool:
        return (src, dst) not in self.blocked

    def _loss(self) -> float:
        p = self.net.drop
        for until, prob in self.loss_bursts:
            if self.now < until:
                p = max(p, prob)
        return p

    def _delay(self) -> float:
        net = self.net
        d = net.delay_min + self.rng.expovariate(1.0 / net.delay_mean)
        if net.reorder and self.rng.random() < net.reorder:
            d += self.rng.uniform(0, net.reorder_delay)
        return d

    def _send(self, src: NodeId, action: Send) -> None:
        self.messages_sent += 1
        raw = encode(action.payload)
        if action.to not in self.nodes or not self._link_up(src, action.to):
            self.messages_dropped += 1
            return
        loss = self._loss()
        if loss and self.rng.random() < loss:
            self.messages_dropped += 1
            return
        copies = 1
        if self.net.duplicate and self.rng.random() < self.net.duplicate:
            copies = 2
        for _ in range(copies):
            self._push(self.now + self._delay(), "deliver", (src, action.to, raw))

    # --------------------------------------------------------------- client
    def request(self, name: NodeId, payload: Any, *, delay: float = 0.0) -> int:
        """Send a client/admin request to node ``name``; its reply lands in ``requests``."""
        self._next_request += 1
        rid = self._next_request
        self.requests[rid] = ReplyRecord(name, payload, self.now + delay)
        self._push(self.now + delay, "request", (name, rid, encode(payload)))
        return rid

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` at virtual time ``when`` (fault schedules, workloads)."""
        self._push(max(when, self.now), "call", callback)

    # ----------------------------------------------------------------- loop
    def _push(self, when: float, kind: str, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, data))

    def run_until(self, t_end: float, stop: Callable[[], bool] | None = None) -> bool:
        """Process events up to virtual time ``t_end``; True if ``stop()`` became true."""
        heap = self._heap
        while heap and heap[0][0] <= t_end:
            item = heapq.heappop(heap)
            self.now = item[0]
            self._dispatch(item)
            self.events += 1
            if self.events > self.max_events:
                raise SimulationError(f"more than {self.max_events} events: runaway loop?")
            if stop is not None and stop():
                return True
        self.now = max(self.now, t_end)
        return False

    def run_for(self, duration: float, stop: Callable[[], bool] | None = None) -> bool:
        return self.run_until(self.now + duration, stop)

    def _dispatch(self, item: tuple[float, int, str, Any]) -> None:
        _, _, kind, data = item
        if kind == "call":
            data()
            return
        if kind == "deliver":
            src, dst, raw = data
            node = self.nodes[dst]
            if not node.up:
                self.messages_dropped += 1
                return
            if not self._link_up(src, dst):
                self.messages_dropped += 1  # the link was cut while the message was in flight
                return
            if node.paused:
                node.backlog.append(item)
                return
            self._handle(node, Received(self.now, src, decode(raw)))
            return
        if kind == "request":
            name, rid, raw = data
            node = self.nodes[name]
            if not node.up:
                return  # the client's connection was refused: no reply ever
            if node.paused:
                node.backlog.append(item)
                return
            self._handle(node, ClientRequest(self.now, rid, decode(raw)))
            return
        # Node-internal events carry the incarnation they belong to.
        name, incarnation, what, arg = data
        node = self.nodes[name]
        if not node.up or node.incarnation != incarnation:
            return
        if what == "sync":
            self._sync(node)
            return
        if node.paused:
            node.backlog.append(item)
            return
        if what == "started":
            self._handle(node, Started(self.now))
        elif what == "timer":
            timer_name, generation = arg
            if node.timers.get(timer_name) != generation:
                return  # cancelled or re-armed since
            del node.timers[timer_name]
            self._handle(node, TimerFired(self.now, timer_name))
        elif what == "persisted":
            self._handle(node, Persisted(self.now, arg))

    def _sync(self, node: SimNode) -> None:
        """Group commit: every buffered Persist becomes durable, then each is acknowledged."""
        disk = node.disk
        disk.sync_scheduled = False
        batch, disk.pending = disk.pending, []
        acks, disk.acks = disk.acks, []
        disk.syncs += 1
        for persist in batch:
            disk.apply(persist)
        for done in acks:
            done(None)

    def _persisted(self, node: SimNode, tokens: list[int]) -> None:
        for token in tokens:
            self._push(self.now, "event", (node.name, node.incarnation, "persisted", token))

    def _persist_failed(self, exc: BaseException) -> None:
        raise SimulationError(f"a durable write failed: {exc}") from exc

    def _handle(self, node: SimNode, event: Event) -> None:
        assert node.machine is not None
        actions = node.machine.handle(event)
        self._record(node.name, event, actions)
        for observer in self.observers:
            observer(self, node.name, event, actions)
        for action in actions:
            if not node.up:
                break  # an observer may not crash nodes, but stay safe
            self._do(node, action)

    def _do(self, node: SimNode, action: Action) -> None:
        if isinstance(action, Send):
            self._send(node.name, action)
        elif isinstance(action, SetTimer):
            self._seq += 1
            generation = self._seq
            node.timers[action.name] = generation
            self._push(
                self.now + max(0.0, action.delay),
                "event",
                (node.name, node.incarnation, "timer", (action.name, generation)),
            )
        elif isinstance(action, CancelTimer):
            node.timers.pop(action.name, None)
        elif isinstance(action, Persist):
            assert node.persists is not None
            node.persists.add(action)
        elif isinstance(action, Reply):
            record = self.requests.get(action.request_id)
            if record is not None and record.replied_at is None:
                record.replied_at = self.now
                record.reply = decode(encode(action.payload))
        elif isinstance(action, Notify | Log | Reconnect):
            pass  # observers see them; nothing for the runtime to do
        else:
            raise SimulationError(f"unknown action {action!r}")

    def _disk_write(self, node: SimNode, batch: Sequence[Persist], done: Done) -> None:
        disk = node.disk
        disk.pending.extend(batch)
        disk.acks.append(done)
        if not disk.sync_scheduled:
            disk.sync_scheduled = True
            latency = self.rng.uniform(self.disk_config.sync_min, self.disk_config.sync_max)
            when = max(self.now + latency, disk.stall_until)
            self._push(when, "event", (node.name, node.incarnation, "sync", None))

    # ---------------------------------------------------------------- trace
    def _record(self, name: NodeId, event: Event, actions: list[Action]) -> None:
        if not self.keep_digest:
            return
        line = f"{self.now:.9f} {name} {event!r} -> {actions!r}"
        self._digest.update(line.encode())
        if self.keep_trace:
            self.trace.append(line)

    def _fault(self, what: str, **details: Any) -> None:
        line = f"{self.now:.9f} FAULT {what} {details!r}"
        self._digest.update(line.encode())
        if self.keep_trace:
            self.trace.append(line)
        for observer in self.fault_observers:
            observer(self, what, details)

    @property
    def trace_digest(self) -> str:
        """A digest of everything that happened: equal digests mean identical runs.

        Covers every event and action when the simulation keeps a digest (the
        default; campaigns switch it off for speed), else only the faults.
        """
        return self._digest.hexdigest()


class _DiskWriter:
    """A node's simulated disk as the default persister of its :class:`PersistRouter`."""

    __slots__ = ("node", "sim")

    def __init__(self, sim: Simulation, node: SimNode) -> None:
        self.sim = sim
        self.node = node

    def persist(self, batch: Sequence[Persist], done: Done) -> None:
        self.sim._disk_write(self.node, batch, done)
