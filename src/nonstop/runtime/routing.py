"""The seam through which a node's composition serves what its machine does not.

The runtime knows one machine and the network; it does not know which client
ops or peer messages belong to services built above it (the data plane, bulk
operations).  The node's composition (``nonstop.node.router``) gives the
runtime a :class:`Router`, and the runtime offers it every client op and
every peer message **before** the machine sees them:

* a client request the runtime does not answer itself (``ping``,
  ``runtime_stats``) goes to :meth:`Router.on_client`; if it returns False the
  request becomes the machine's ``ClientRequest``;
* a peer's message (``{"t": "m"}`` frames, and the node's messages to itself)
  goes to :meth:`Router.on_peer`; if it returns False it becomes the
  machine's ``Received``.

Without a router everything goes to the machine (which answers an op it does
not know with an error reply and drops a message it does not know with a log
line: rule 5 of :mod:`nonstop.runtime.interface`).  A router answers the
requests it takes itself (``conn.send({"t": "rep", "id": client_id, "p": ...})``,
see ``docs/design/wire.md``).  Its methods run on the event loop and must not
block.
"""

from __future__ import annotations

from typing import Any, Protocol

from nonstop.net.connection import Connection


class Router(Protocol):
    """Client ops and peer messages the node's composition serves (module doc)."""

    def start(self) -> None:
        """The runtime is listening and the machine has been built."""
        ...

    async def stop(self) -> None:
        """The runtime is stopping (the stores are still open)."""
        ...

    def on_client(self, conn: Connection, client_id: Any, payload: Any) -> bool:
        """Take the client request ``payload`` (answer on ``conn``); False: the machine's."""
        ...

    def connection_closed(self, conn: Connection) -> None:
        """A client connection that :meth:`on_client` took requests from is gone."""
        ...

    def on_peer(self, sender: str, payload: Any) -> bool:
        """Take a message of node ``sender``; False: it goes to the machine."""
        ...

    def stats(self) -> dict[str, Any]:
        """Extra fields of the ``runtime_stats`` reply (counters of the services)."""
        ...


__all__ = ["Router"]
