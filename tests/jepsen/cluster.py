"""Node processes inside the namespaces of a :class:`~tests.jepsen.netns.Network`.

Each node listens on its namespace's address (``10.77.X.<i>:7100``; the port
can be the same everywhere, every node has its own network) and knows the
others by those addresses, so every byte between two nodes crosses the bridge
and the faults.  The configuration is written the way ``nonstop local`` writes
it (:class:`~nonstop.admin.local.LocalCluster`), only with these addresses.

Nodes run ``ip netns exec <ns> python -m nonstop.admin.cli node start``
(``ip netns exec`` execs, so the pid is the node's) in their own session: the
node processes of :class:`~nonstop.admin.owned.NodeProcesses` (start, kill,
status, stop), with this layout and this prefix; :meth:`NetnsCluster.close`
SIGKILLs every group it started, whatever happened.
The children get ``PYTHONPATH`` with the repository root, so they can import
the harness's application module (:mod:`tests.jepsen.app`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from nonstop.admin.local import LocalCluster
from nonstop.admin.owned import NodeProcesses
from nonstop.errors import Error
from nonstop.node.config import check_options
from tests.jepsen.netns import Network

PORT = 7100
APP = "tests.jepsen.app"
ROOT = Path(__file__).resolve().parents[2]

OPTIONS: dict[str, Any] = {
    # A node silent this long is Down (as the end-to-end tests run them).
    "keepalive_interval": 0.1,
    "nonresponse_timeout": 0.5,
    "sync": True,
    "app": [APP],
}


class NetnsCluster(NodeProcesses):
    """The nodes of ``net``, one per namespace (names = the network's node names)."""

    status_timeout = 1.0
    """Asked from the host: clients are never cut unless a fault says so."""

    def __init__(self, folder: Path, net: Network, options: dict[str, Any] | None = None) -> None:
        self.net = net
        lc = LocalCluster(folder)
        lc.dir.mkdir(parents=True, exist_ok=True)
        layout: dict[str, Any] = {
            "cluster": "jepsen-" + secrets.token_hex(4),
            "members": list(net.names),
            "nodes": [{"name": n, "listen": f"{net.address(n)}:{PORT}"} for n in net.names],
            "options": check_options({**OPTIONS, **(options or {})}),
        }
        lc.save(layout)
        # Nodes require the cluster secret, clients a user (auth): the folder's files,
        # and this process's clients prove its admin credential.
        lc.ensure_auth_files()
        lc.remember(layout)
        path = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
        super().__init__(lc, layout, env={"PYTHONPATH": path})

    def command_prefix(self, name: str) -> list[str]:
        return self.net.exec_prefix(name)

    def close(self) -> None:
        """SIGTERM every node, SIGKILL what is left after a few seconds."""
        self.stop(timeout=10)

    def __enter__(self) -> NetnsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ asking
    def leader(self) -> str | None:
        """The cluster-log leader the most nodes agree on right now."""
        votes: dict[str, int] = {}
        for name in self.pids:
            with contextlib.suppress(Error, OSError):
                lead = self.status(name).get("leader")
                if lead:
                    votes[lead] = votes.get(lead, 0) + 1
        return max(votes, key=lambda k: votes[k]) if votes else None

    def log_tail(self, name: str, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path(name).read_text().splitlines()[-lines:])
        return ""
