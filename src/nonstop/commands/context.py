"""What a command handler may use: how to reach the cluster (:class:`CommandContext`).

The CLI makes one from its ``--node``/``--dir``/``--credentials``/TLS options;
the node's admin HTTP API makes one for its own node address, with the node's
bootstrap admin credential (the HTTP user was checked against the command's
permission before: docs/security.md "Admin HTTP API").  Handlers are blocking
code (the sync client); the HTTP API runs them in worker threads, never on the
node's event loop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from nonstop.commands.failure import CommandError, ErrorKind
from nonstop.errors import Error, NoLeader, NotLeader

NO_LEADER_WAIT = 10.0
"""Seconds a command keeps asking again while the node answers ``NoLeader`` (an election of
the cluster log usually ends within one or two)."""
NO_LEADER_PAUSES = (0.2, 0.5, 1.0)
"""The pauses before each new ask after ``NoLeader`` (the last one repeats)."""


@dataclass
class CommandContext:
    addresses: list[str]
    """Node addresses to ask (the first that answers)."""
    cluster: str = ""
    """Expected cluster id ('' = any)."""
    timeout: float = 3.0
    options: dict[str, Any] = field(default_factory=dict)
    """More client options: ``tls``, ``credentials``, ``folder`` (``nonstop.client.Client``)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Front-end facts a handler may add to its result (e.g. metrics addresses of a local
    cluster folder)."""

    def client(self, ping: bool = True) -> Any:
        """A connected client with failover across :attr:`addresses`; ``ping=False``: not
        asked anything yet (a user whose roles do not grant ``status`` cannot ping)."""
        from nonstop.client import Client, connect

        try:
            if not ping:
                return Client(
                    self.addresses, cluster=self.cluster, timeout=self.timeout, **self.options
                )
            return connect(
                self.addresses, cluster=self.cluster, timeout=self.timeout, **self.options
            )
        except (Error, ValueError) as exc:
            raise CommandError(str(exc), "unavailable") from None

    def ask_node(self, address: str, payload: dict[str, Any], timeout: float | None = None) -> Any:
        """One request to the node at ``address`` (no failover to another node)."""
        from nonstop.client import Client

        with Client(
            [address],
            timeout=self.timeout if timeout is None else timeout,
            rounds=1,
            **self.options,
        ) as client:
            return client.request(payload)


def ask(
    context: CommandContext, payload: dict[str, Any], sleep: Any = time.sleep, clock: Any = None
) -> Any:
    """One request through :meth:`CommandContext.client`; the node's refusal as a
    :class:`CommandError` (BadArgument: usage, NotAuthorized: forbidden, NoLeader:
    unavailable, else failed).

    ``NoLeader`` (a change of the cluster log asked during an election: nothing was
    changed; also ``NotLeader`` naming no leader) is asked again, as a user would,
    after :data:`NO_LEADER_PAUSES`, for at most :data:`NO_LEADER_WAIT` seconds: the
    CLI, the admin API and the console all run their commands through here."""
    from nonstop.errors import BadArgument, NotAuthorized

    now = clock or time.monotonic
    deadline = now() + NO_LEADER_WAIT
    pauses = iter(NO_LEADER_PAUSES)
    pause = 0.0
    with context.client() as client:
        while True:
            try:
                return client.call(payload)
            except (NoLeader, NotLeader) as exc:
                if isinstance(exc, NotLeader) and exc.leader is not None:
                    raise CommandError(str(exc), "failed") from None
                # NotLeader naming no leader: the node asked is in an election too (a
                # membership change right after a leave): nothing was changed either.
                pause = next(pauses, pause)
                if now() + pause > deadline:
                    message = f"{exc} (asked again for {NO_LEADER_WAIT:g}s)"
                    raise CommandError(message, "unavailable") from None
                sleep(pause)
            except (Error, ValueError) as exc:
                kind: ErrorKind = "usage" if isinstance(exc, BadArgument) else "failed"
                if isinstance(exc, NotAuthorized):
                    kind = "forbidden"
                raise CommandError(str(exc), kind) from None


__all__ = ["NO_LEADER_PAUSES", "NO_LEADER_WAIT", "CommandContext", "ask"]
