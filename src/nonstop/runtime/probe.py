"""A small diagnostic machine: keep-alives, node states, a status reply, durable writes.

It exists to exercise the real runtime on its own — transport events, timers,
reconnects, group commit, replies — in tests and benchmarks, and as the
fallback a node runs when the real cluster machine
(:class:`nonstop.cluster.node.ClusterNode`) cannot be imported.  It is **not**
a consensus protocol: its "view" is a local counter, and its quorum is a
plain majority of the nodes it has ever seen.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack

from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Log,
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

MEMBERS_KEY = b"probe/members"
VIEW_KEY = b"probe/view"


class ProbeMachine:
    """Failure detection in the style of C6, enough to watch a cluster live."""

    def __init__(
        self,
        name: str,
        recovered: dict[bytes, bytes],
        rng: random.Random,
        *,
        interval: float = 0.25,
        timeout: float = 1.0,
        members: list[str] | tuple[str, ...] = (),
        protocol: tuple[int, int] = (1, 1),
    ) -> None:
        self.protocol = protocol
        self.name = name
        self.rng = rng
        self.interval = interval
        self.timeout = timeout
        self.members: set[str] = set(msgpack.unpackb(recovered.get(MEMBERS_KEY, b"\x90")))
        self.members.add(name)
        self.members.update(members)
        self.view = int(recovered.get(VIEW_KEY, b"0"))
        self.state: dict[str, str] = dict.fromkeys(self.members - {name}, "Discovered")
        self.address: dict[str, str] = {}
        self.last_heard: dict[str, float] = {}
        self.reconnected: set[str] = set()
        self.quorum = "Disabled"
        self.now = 0.0
        self._token = 0
        self._waiting: dict[int, tuple[int, int]] = {}
        """persist token → (request id, remaining tokens of that request)."""
        self._request_tokens: dict[int, int] = {}

    # -------------------------------------------------------------- util
    def _next_token(self) -> int:
        self._token += 1
        return self._token

    def _persist_membership(self) -> Persist:
        return Persist(
            self._next_token(),
            (
                (MEMBERS_KEY, msgpack.packb(sorted(self.members))),
                (VIEW_KEY, str(self.view).encode()),
            ),
        )

    def _quorum(self) -> list[Action]:
        up = 1 + sum(1 for s in self.state.values() if s == "Up")
        total = len(self.members)
        new = "Active" if up == total else "Partial" if up * 2 > total else "Disabled"
        if new == self.quorum:
            return []
        self.quorum = new
        return [Notify("quorum", {"state": new})]

    def _set_state(self, peer: str, new: str) -> list[Action]:
        old = self.state.get(peer)
        if old == new:
            return []
        self.state[peer] = new
        out: list[Action] = [Notify("node_state", {"peer": peer, "old": old, "new": new})]
        if new in ("Up", "Down"):
            self.view += 1
            out.append(self._persist_membership())
        return out + self._quorum()

    # ------------------------------------------------------------ handle
    def handle(self, event: Event) -> list[Action]:
        self.now = event.now
        if isinstance(event, Started):
            for peer in self.state:
                self.last_heard[peer] = event.now
            return [SetTimer("tick", self.interval), *self._quorum()]
        if isinstance(event, TimerFired) and event.name == "tick":
            return self._tick()
        if isinstance(event, Received):
            return self._received(event)
        if isinstance(event, ClientRequest):
            return self._request(event)
        if isinstance(event, Persisted):
            return self._persisted(event.token)
        return []

    def _tick(self) -> list[Action]:
        out: list[Action] = [SetTimer("tick", self.interval)]
        for peer in self.state:
            out.append(Send(peer, {"k": "ping"}))
        for peer, state in list(self.state.items()):
            if state == "Down":
                continue
            if self.now - self.last_heard.get(peer, self.now) > self.timeout:
                if state == "Up" and peer not in self.reconnected:
                    # C6: one reconnect before declaring the node Down.
                    self.reconnected.add(peer)
                    self.last_heard[peer] = self.now
                    out.append(Reconnect(peer))
                else:
                    out.extend(self._set_state(peer, "Down"))
        return out

    def _received(self, event: Received) -> list[Action]:
        p = event.payload
        peer = event.sender
        out: list[Action] = []
        if isinstance(p, dict) and p.get("k") == "disc":
            self.address[peer] = str(p.get("address"))
            if peer not in self.members:
                self.members.add(peer)
                self.state[peer] = "Discovered"
                self.last_heard[peer] = self.now
                out.append(self._persist_membership())
                out.extend(self._quorum())
            return out
        if isinstance(p, dict) and p.get("k") == "fd":
            # The runtime's report of a refused handshake (see nonstop.runtime.real).
            body = p.get("b") or {}
            proto = (body.get("id") or {}).get("proto") or [1, 1]
            if proto[1] < self.protocol[0] or proto[0] > self.protocol[1]:
                return self._set_state(peer, "UnsupportedProtocol")
            return out
        if peer not in self.members:
            return [Log("debug", f"message from unknown node {peer}")]
        if not isinstance(p, dict) or p.get("k") not in ("ping", "pong"):
            return [Log("warning", f"unexpected message from {peer}")]
        self.last_heard[peer] = self.now
        self.reconnected.discard(peer)
        if p["k"] == "ping" and self.quorum != "Disabled":
            out.append(Send(peer, {"k": "pong"}))
        if self.state.get(peer) != "Up":
            out.extend(self._set_state(peer, "Up"))
        return out

    def _request(self, event: ClientRequest) -> list[Action]:
        p = event.payload if isinstance(event.payload, dict) else {}
        op = p.get("op")
        if op == "status":
            return [Reply(event.request_id, self.status())]
        if op == "persist":
            n = max(1, int(p.get("n", 1)))
            size = int(p.get("size", 64))
            out: list[Action] = []
            for i in range(n):
                token = self._next_token()
                self._waiting[token] = (event.request_id, n)
                key = f"probe/data/{event.request_id}/{i}".encode()
                out.append(Persist(token, ((key, b"x" * size),)))
            self._request_tokens[event.request_id] = n
            return out
        return [Reply(event.request_id, {"error": "BadRequest", "message": f"unknown op {op!r}"})]

    def _persisted(self, token: int) -> list[Action]:
        entry = self._waiting.pop(token, None)
        if entry is None:
            return []
        rid = entry[0]
        left = self._request_tokens[rid] - 1
        if left:
            self._request_tokens[rid] = left
            return []
        del self._request_tokens[rid]
        return [Reply(rid, {"ok": True})]

    def status(self) -> dict[str, Any]:
        nodes = [{"name": self.name, "address": "", "state": "Up"}]
        for peer in sorted(self.state):
            nodes.append(
                {"name": peer, "address": self.address.get(peer, ""), "state": self.state[peer]}
            )
        return {
            "name": self.name,
            "view": self.view,
            "quorum": self.quorum,
            "leader": None,
            "term": 0,
            "nodes": nodes,
            "warnings": ["probe machine: no consensus, view is a local counter"],
        }
