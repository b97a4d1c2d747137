"""The contract between protocol state machines and the runtimes that drive them.

Every nonstop protocol (cluster log, failure detection, later replication, 2PC,
messaging) is a *sans-I/O state machine*: it never reads a clock, opens a socket,
touches a disk or draws randomness by itself.  A runtime feeds it events and
carries out the actions it returns:

    actions = machine.handle(event)

Two runtimes drive the same machines:

* the real runtime (``nonstop.runtime.real``): asyncio (uvloop when installed),
  TCP with length-prefixed msgpack frames, LMDB for durable state;
* the simulated runtime (``nonstop.sim``): many machines in one process, a
  virtual clock, a seeded RNG, a network that delays, drops, duplicates,
  reorders and partitions, and disks that lose what was not synced on a crash.

Rules every machine follows (they are what make simulation faithful):

1. Time only comes from ``event.now`` (seconds, float, monotonic).
2. Randomness only comes from the ``random.Random`` passed at construction.
3. Durable state only comes from the ``recovered`` mapping passed at
   construction, and only goes out through :class:`Persist` actions.  A
   machine must not emit an action that depends on a write being durable
   (a vote, an append acknowledgement, a reply to a client) until it has
   received the matching :class:`Persisted` event.  The runtime is free to
   group many ``Persist`` actions into one fsync (group commit).
4. Message payloads are plain msgpack-able values (dict/list/str/int/float/
   bytes/bool/None).  The simulator round-trips them through msgpack so that a
   payload that would not survive the wire fails in simulation too.
5. ``handle`` never blocks and never raises for bad *input* (a malformed or
   unexpected message is dropped and reported with a :class:`Log` action);
   it raises only for bugs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

NodeId = str
"""A node's cluster-unique name (C1)."""

Payload = Any
"""A msgpack-able value: dict, list, str, int, float, bytes, bool or None."""


# ----------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class Started:
    """First event after construction (a fresh start or a restart after a crash)."""

    now: float


@dataclass(frozen=True, slots=True)
class Received:
    """A message arrived from another node."""

    now: float
    sender: NodeId
    payload: Payload


ALIVE = "alive"
"""``Received(sender, {"k": ALIVE})``: not a message of ``sender`` but a runtime's note that
it heard one that another machine took or that carried no envelope -- liveness only.  A
runtime gives it only to a machine whose ``hears_bare_messages`` is true, at most every
:data:`ALIVE_EVERY` per sender (``runtime/real.py``)."""

ALIVE_EVERY = 0.05
"""Seconds between two such notes for one sender: well under a keep-alive interval
(0.1 s by default), so silence is judged as finely, at a bounded cost per peer."""


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A timer set with :class:`SetTimer` expired (and was not cancelled or reset)."""

    now: float
    name: str


@dataclass(frozen=True, slots=True)
class Persisted:
    """Every write of the :class:`Persist` action carrying ``token`` is durable."""

    now: float
    token: int


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """A request from a client or an administrator, to be answered with :class:`Reply`."""

    now: float
    request_id: int
    payload: Payload


Event = Started | Received | TimerFired | Persisted | ClientRequest


# ---------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Send:
    """Send ``payload`` to node ``to``.  Delivery is best effort: it may be lost."""

    to: NodeId
    payload: Payload


@dataclass(frozen=True, slots=True)
class SetTimer:
    """(Re)arm timer ``name`` to fire ``delay`` seconds from now; replaces an armed one."""

    name: str
    delay: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    name: str


@dataclass(frozen=True, slots=True)
class Persist:
    """Make ``writes`` durable (``value`` None deletes the key), then send ``Persisted(token)``.

    Writes of one ``Persist`` are atomic: after a crash either all or none are
    visible.  Writes are applied in the order the actions were emitted.
    """

    token: int
    writes: tuple[tuple[bytes, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the :class:`ClientRequest` with the same ``request_id``."""

    request_id: int
    payload: Payload


@dataclass(frozen=True, slots=True)
class Notify:
    """Something the outside world may want to know (state changes, C3/D16 notifiers).

    ``kind`` examples: ``"node_state"`` (peer, old, new), ``"quorum"`` (state),
    ``"view"`` (view id, members, live), ``"leader"`` (term, leader).
    """

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Log:
    """A log line: ``level`` is one of debug, info, warning, error."""

    level: str
    message: str


@dataclass(frozen=True, slots=True)
class Reconnect:
    """Ask the runtime to drop and re-dial the connection to ``peer`` (C6's one reconnect)."""

    peer: NodeId


Action = Send | SetTimer | CancelTimer | Persist | Reply | Notify | Log | Reconnect


class Machine(Protocol):
    """A sans-I/O protocol state machine."""

    def handle(self, event: Event) -> list[Action]:
        """Consume one event and return the actions to carry out, in order."""
        ...


class DurableBatches(Protocol):
    """A machine that takes the tokens of one group commit at once (optional).

    A runtime that finds ``handle_persisted`` on its machine calls it once with
    every token a durable write set (or several, acknowledged together) carried,
    instead of ``handle(Persisted(now, token))`` per token.  The machine must
    treat it as those ``Persisted`` events, in order, with no other event
    between them: each token is durable, and each component still learns of
    each of its own tokens.  What it gains is the bookkeeping it runs *after*
    an event (the real node's replication settle): once per group commit
    rather than once per token.  Rule 3 holds as before: every token given is
    durable, so any action the machine emits may depend on any of them.
    """

    def handle_persisted(self, now: float, tokens: Sequence[int]) -> list[Action]:
        """Consume ``Persisted(now, t)`` for each of ``tokens`` in order; the actions."""
        ...
