"""What a command handler may use: how to reach the cluster (:class:`CommandContext`).

The CLI makes one from its ``--node``/``--dir``/``--credentials``/TLS options;
the node's admin HTTP API makes one for its own node address, with the node's
bootstrap admin credential (the HTTP user was checked against the command's
permission before: docs/security.md "Admin HTTP API").  Handlers are blocking
code (the sync client); the HTTP API runs them in worker threads, never on the
node's event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nonstop.commands.failure import CommandError, ErrorKind
from nonstop.errors import Error


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


def ask(context: CommandContext, payload: dict[str, Any]) -> Any:
    """One request through :meth:`CommandContext.client`; the node's refusal as a
    :class:`CommandError` (BadArgument: usage, NotAuthorized: forbidden, else failed)."""
    from nonstop.errors import BadArgument, NotAuthorized

    with context.client() as client:
        try:
            return client.call(payload)
        except (Error, ValueError) as exc:
            kind: ErrorKind = "usage" if isinstance(exc, BadArgument) else "failed"
            if isinstance(exc, NotAuthorized):
                kind = "forbidden"
            raise CommandError(str(exc), kind) from None


__all__ = ["CommandContext", "ask"]
