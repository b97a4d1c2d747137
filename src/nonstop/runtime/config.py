"""What the real runtime needs to know beyond the node's identity."""

from __future__ import annotations

from dataclasses import dataclass, field

from nonstop.net.challenge import Guard
from nonstop.net.discovery import DiscoveryConfig
from nonstop.net.frames import DEFAULT_MAX_FRAME
from nonstop.net.tls import TLSConfig
from nonstop.runtime.limits import ConnectionLimits


@dataclass
class RuntimeConfig:
    """Listener, peers to join, frame limit, TLS, discovery, limits and the transport's timings."""

    listen: str = "127.0.0.1:7101"
    join: list[str] = field(default_factory=list)
    static_peers: dict[str, str] = field(default_factory=dict)
    """name → address from the configuration (C2 static discovery; the machine knows them too)."""
    max_frame: int = DEFAULT_MAX_FRAME
    tls: TLSConfig = field(default_factory=TLSConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    connect_timeout: float = 2.0
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    """Connections, deadlines and buffered bytes of the listener (``runtime/limits.py``)."""
    redial_min: float = 0.05
    redial_max: float = 1.0
    startup_grace: float = 10.0
    """A DuplicateName/WrongCluster refusal this soon after start stops the node."""
    loop_lag_warn: float = 0.2
    """Log a warning when the event loop wakes this many seconds late (``runtime/loop_lag.py``;
    a node sets half its failure detector's ``nonresponse_timeout``)."""
    guard: Guard | None = None
    """Authentication (``net.challenge``): peers prove the cluster secret, clients a user's
    password, before anything they say counts.  None: nobody proves anything (tests of
    the transport alone, and ``[auth] enabled = false``)."""

    @property
    def handshake_timeout(self) -> float:
        """Seconds a new connection has to finish its handshake (``limits.handshake_timeout``)."""
        return self.limits.handshake_timeout
