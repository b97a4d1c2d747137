"""Simulated stand-ins for the store and the Raft log, faithful where 2PC cares.

* :class:`SimResourceManager` -- a participant's store: integer balances in
  memory (the volatile, committed state) backed by ``Persist`` writes (the
  durable state, which is all that survives a crash), strict two-phase locking
  through the real :class:`nonstop.tx.locks.LockManager` (so lock waits,
  deadlock victims and lock-wait timeouts happen as they do in the store), and
  prepared branches whose after-images are computed under their locks.
* :class:`SimDecisionLog` -- the decision log as one simulated node
  (:data:`nonstop.dtx.decisions.LOG`): first writer wins, a decision is synced
  to its disk before anybody hears of it, and while the node is crashed,
  paused or cut off nothing is decided -- which is what losing the Raft quorum
  looks like from the machines' side.  Its state machine is the same
  :class:`~nonstop.dtx.decisions.DecisionTable` the Raft integration applies.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from nonstop.dtx.decisions import (
    DECIDED,
    FORGET,
    FORGOT,
    LOG,
    LOOKUP,
    OUTCOMES,
    PROPOSE,
    UNKNOWN,
    DecisionTable,
    parse_gtid,
)
from nonstop.dtx.protocol import DtxConfig, DtxNode, Progress, Ready, Refused
from nonstop.net import plain
from nonstop.runtime.interface import (
    Action,
    Event,
    Log,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    Send,
)
from nonstop.tx.locks import READ, WRITE, DeadlockFound, Granted, LockManager, LockMode

K_KV = b"kv/"

ADD = "add"
READ_OP = "read"


_pack = plain.pack
_unpack = plain.unpack


@dataclass(slots=True)
class _RmBranch:
    ops: list[Any]
    locks: list[tuple[str, LockMode]]
    next_lock: int = 0
    prepared: bool = False
    after: dict[str, int] = field(default_factory=dict)


class SimResourceManager:
    """A participant's account store (see the module doc).

    Ops of a branch: ``["add", key, delta]`` (refused if the balance would go
    negative: the bank's business rule, so some transfers vote no) and
    ``["read", key, 0]`` (returns the balance, under a read lock held until the
    outcome, so a read-only transaction over all nodes is a consistent snapshot).
    """

    def __init__(self, accounts: Mapping[str, int], recovered: Mapping[bytes, bytes]) -> None:
        self.kv: dict[str, int] = dict(accounts)
        for key, raw in recovered.items():
            if key.startswith(K_KV):
                self.kv[key[len(K_KV) :].decode()] = int(_unpack(raw))
        self.locks = LockManager()
        self.branches: dict[str, _RmBranch] = {}

    # ------------------------------------------------------------ protocol
    def check_ops(self, ops: Any) -> str | None:
        if not isinstance(ops, list) or not ops or len(ops) > 64:
            return "ops must be a non-empty list"
        for op in ops:
            if (
                not isinstance(op, list)
                or len(op) != 3
                or op[0] not in (ADD, READ_OP)
                or not isinstance(op[1], str)
                or not isinstance(op[2], int)
                or isinstance(op[2], bool)
            ):
                return f"bad op {op!r:.60}"
        return None

    def check_owned(self, ops: list[Any]) -> str | None:
        for op in ops:
            if op[1] not in self.kv:
                return f"no account {op[1]!r:.40} here"
        return None

    def open(self, gtid: str, ops: list[Any]) -> list[Progress]:
        why = self.check_owned(ops)
        if why is not None:
            return [Refused(gtid, why)]
        modes: dict[str, LockMode] = {}
        for kind, key, _ in ops:
            mode = WRITE if kind == ADD else READ
            modes[key] = max(modes.get(key, READ), mode)
        # Sorted: two branches on one node cannot deadlock each other.
        self.branches[gtid] = _RmBranch(ops, sorted(modes.items()))
        return self._advance(gtid)

    def finish(
        self, gtid: str, commit: bool
    ) -> tuple[list[tuple[bytes, bytes | None]], list[Progress]]:
        b = self.branches.pop(gtid, None)
        writes: list[tuple[bytes, bytes | None]] = []
        if b is not None and commit:
            if not b.prepared:
                raise AssertionError(f"{gtid}: commit of a branch that never prepared")
            for key, value in sorted(b.after.items()):
                self.kv[key] = value
                writes.append((K_KV + key.encode(), _pack(value)))
        grants = self.locks.release_all(gtid)
        return writes, self._granted(grants)

    def recover(self, gtid: str, record: bytes) -> None:
        rec = _unpack(record)
        b = _RmBranch([], [(k, LockMode(m)) for k, m in rec["l"]], prepared=True)
        b.after = {k: int(v) for k, v in rec["w"].items()}
        b.next_lock = len(b.locks)
        for key, mode in b.locks:
            # Prepared branches held these together before the crash: compatible.
            assert isinstance(self.locks.acquire(gtid, key, mode), Granted)
        self.branches[gtid] = b

    # ------------------------------------------------------------ internals
    def _advance(self, gtid: str) -> list[Progress]:
        """Take the branch's next locks; when it has all, compute its effects."""
        b = self.branches[gtid]
        while b.next_lock < len(b.locks):
            key, mode = b.locks[b.next_lock]
            result = self.locks.acquire(gtid, key, mode)
            if isinstance(result, DeadlockFound):
                del self.branches[gtid]
                grants = self.locks.release_all(gtid)
                return [Refused(gtid, "deadlock victim"), *self._granted(grants)]
            if not isinstance(result, Granted):
                return []  # waiting: a Grant continues it
            b.next_lock += 1
        after: dict[str, int] = {}
        reads: dict[str, Any] = {}
        for kind, key, amount in b.ops:
            if kind == ADD:
                after[key] = after.get(key, self.kv[key]) + amount
            else:
                reads[key] = self.kv[key]
        if any(v < 0 for v in after.values()):
            del self.branches[gtid]
            grants = self.locks.release_all(gtid)
            return [Refused(gtid, "insufficient funds"), *self._granted(grants)]
        b.after = after
        b.prepared = True
        record = _pack({"w": after, "l": [[k, int(m)] for k, m in b.locks]})
        return [Ready(gtid, record, reads)]

    def _granted(self, grants: list[Any]) -> list[Progress]:
        out: list[Progress] = []
        for grant in grants:
            b = self.branches.get(grant.txn)
            if b is None or b.prepared:
                continue
            if b.next_lock < len(b.locks) and b.locks[b.next_lock][0] == grant.resource:
                b.next_lock += 1
                out.extend(self._advance(grant.txn))
        return out

    def total(self) -> int:
        return sum(self.kv.values())


class SimDecisionLog:
    """The decision log as one simulated node (module doc); a ``Machine``."""

    def __init__(self, rng: random.Random, recovered: Mapping[bytes, bytes]) -> None:
        self.rng = rng
        self.table = DecisionTable()
        for key, raw in recovered.items():
            if key.startswith(b"d/"):
                self.table.decisions[key[2:].decode()] = raw.decode()
            elif key.startswith(b"fl/"):
                self.table.floors[key[3:].decode()] = int(_unpack(raw))
        self._token = 0
        self._unsynced: dict[str, int] = {}
        self._waiting: dict[int, list[Send]] = {}
        self._decided_at: dict[int, tuple[str, str]] = {}

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, Persisted):
            out: list[Action] = list(self._waiting.pop(event.token, []))
            done = self._decided_at.pop(event.token, None)
            if done is not None:
                gtid, outcome = done
                if self._unsynced.get(gtid) == event.token:
                    del self._unsynced[gtid]
                out.insert(0, Notify("dl.decided", {"g": gtid, "o": outcome}))
            return out
        if not isinstance(event, Received):
            return []
        payload = event.payload
        sender = event.sender
        if not isinstance(payload, dict):
            return [Log("warning", f"log: malformed request from {sender}")]
        kind = payload.get("t")
        if kind == FORGET:
            coord, floor = payload.get("c"), payload.get("f")
            if not isinstance(coord, str) or not isinstance(floor, int) or coord != sender:
                return [Log("warning", f"log: bad forget from {sender}")]
            forgot = Send(sender, {"t": FORGOT, "c": coord, "f": floor})
            if floor <= self.table.floors.get(coord, 0):
                return [forgot]
            gone = self.table.forget(coord, floor)
            self._token += 1
            writes: list[tuple[bytes, bytes | None]] = [(b"fl/" + coord.encode(), _pack(floor))]
            writes += [(b"d/" + g.encode(), None) for g in gone]
            self._waiting[self._token] = [forgot]  # acknowledged once durable
            return [Persist(self._token, tuple(writes))]
        gtid = cast(str, payload.get("g"))  # checked by parse_gtid just below
        if parse_gtid(gtid) is None:
            return [Log("warning", f"log: bad gtid from {sender}")]
        if kind == LOOKUP:
            if self.table.forgotten(gtid):
                return [Send(sender, {"t": UNKNOWN, "g": gtid, "forgotten": True})]
            found = self.table.lookup(gtid)
            if found is None:
                return [Send(sender, {"t": UNKNOWN, "g": gtid, "forgotten": False})]
            return self._answer(gtid, found, [sender])
        if kind == PROPOSE:
            proposed = payload.get("o")
            tell = payload.get("n", [])
            if proposed not in OUTCOMES or not isinstance(tell, list):
                return [Log("warning", f"log: bad proposal from {sender}")]
            known = self.table.lookup(gtid)
            decided = self.table.decide(gtid, proposed)
            if decided is None:
                return [Send(sender, {"t": UNKNOWN, "g": gtid, "forgotten": True})]
            if known is not None:
                return self._answer(gtid, decided, [sender])
            # A new decision: durable before anybody hears of it.
            self._token += 1
            self._unsynced[gtid] = self._token
            self._decided_at[self._token] = (gtid, decided)
            who = sorted({sender, *(n for n in tell if isinstance(n, str))})
            self._waiting[self._token] = [
                Send(n, {"t": DECIDED, "g": gtid, "o": decided}) for n in who
            ]
            return [Persist(self._token, ((b"d/" + gtid.encode(), decided.encode()),))]
        return [Log("warning", f"log: unknown request {kind!r} from {sender}")]

    def _answer(self, gtid: str, outcome: str, to: list[NodeId]) -> list[Action]:
        sends = [Send(n, {"t": DECIDED, "g": gtid, "o": outcome}) for n in to]
        token = self._unsynced.get(gtid)
        if token is not None:  # decided, but not durable yet: answer once it is
            self._waiting[token].extend(sends)
            return []
        return list(sends)


def make_node(
    name: NodeId,
    accounts: Mapping[str, int],
    config: DtxConfig | None = None,
    node_class: type[DtxNode] = DtxNode,
) -> Any:
    """A simulator factory ``(rng, recovered) -> machine`` for one participant node."""

    def factory(rng: random.Random, recovered: Mapping[bytes, bytes]) -> DtxNode:
        return node_class(name, SimResourceManager(accounts, recovered), rng, recovered, config)

    return factory


def make_log() -> Any:
    """A simulator factory for the decision log node (register it as :data:`LOG`)."""
    return SimDecisionLog


__all__ = ["LOG", "SimDecisionLog", "SimResourceManager", "make_log", "make_node"]
