"""A node's configuration: command-line options or a TOML file (``--config node.toml``).

Every key is documented in ``docs/operations.md``.  Command-line options win
over the file, so a shared file can be reused with ``--name``/``--listen``
overrides per node.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nonstop.net.discovery import DiscoveryConfig
from nonstop.net.frames import DEFAULT_MAX_FRAME
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN
from nonstop.net.tls import TLSConfig

DEFAULT_CLUSTER = "nonstop"
DEFAULT_MACHINE = "nonstop.node.machine:build_cluster_node"


class ConfigError(ValueError):
    """The configuration is unusable; the message is one line for the operator."""


@dataclass
class NodeConfig:
    """Everything one node process needs; the defaults make a single local node."""

    name: str = ""
    data: str = ""
    cluster: str | None = None
    listen: str = "127.0.0.1:7101"
    join: list[str] = field(default_factory=list)
    """Peer addresses, ``host:port`` or ``name@host:port`` (a named entry is a static peer)."""
    members: list[str] = field(default_factory=list)
    """Bootstrap membership of a *new* cluster (every node the same list, itself included)."""
    protocol: list[int] = field(default_factory=lambda: [PROTOCOL_MIN, PROTOCOL_MAX])
    """Wire protocol range spoken; only changed to test upgrades (E4)."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME
    # Defaults detect a dead node in well under a second on a LAN (~0.5-0.6 s
    # measured: bench/results/cluster.md); raise them on slow or lossy networks.
    keepalive_interval: float = 0.1
    nonresponse_timeout: float = 0.4
    connect_timeout: float = 2.0
    log_level: str = "info"
    log_file: str | None = None
    machine: str = DEFAULT_MACHINE
    app: list[str] = field(default_factory=list)
    """Application modules imported at start, before the store opens (F2, ``--app``)."""
    sync: bool = True
    tls: TLSConfig = field(default_factory=TLSConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    extra: dict[str, Any] = field(default_factory=dict)
    """Keys this module does not know, passed to the machine factory (quorum policy...)."""

    def validate(self) -> None:
        if not self.name:
            raise ConfigError("a node needs a name (--name or name = ...)")
        if not self.data:
            raise ConfigError("a node needs a data directory (--data or data = ...)")
        for address in [self.listen, *(j.rpartition("@")[2] for j in self.join)]:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ConfigError(f"not a host:port address: {address!r}")
        if len(self.protocol) != 2 or not 1 <= self.protocol[0] <= self.protocol[1]:
            raise ConfigError(f"protocol must be [min, max], got {self.protocol!r}")
        if self.max_frame_bytes < 1024:
            raise ConfigError("max_frame_bytes must be at least 1024")
        if self.tls.enabled and not self.tls.cert:
            raise ConfigError("TLS needs tls.cert (and tls.key) on every node")

    def to_dict(self) -> dict[str, Any]:
        """A TOML/JSON-able view (what the node writes to ``DATA/node.json``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, TLSConfig | DiscoveryConfig):
                value = {g.name: getattr(value, g.name) for g in fields(value)}
            out[f.name] = value
        return out


def split_join(join: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split join entries into plain addresses and ``name → address`` static peers."""
    plain: list[str] = []
    named: dict[str, str] = {}
    for entry in join:
        name, at, address = entry.rpartition("@")
        if at and name:
            named[name] = address
        else:
            plain.append(address)
    return plain, named


def parse_join(value: str | list[str] | None) -> list[str]:
    """``"a:1,b:2"`` or a list → a list of addresses without blanks."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    return [item.strip() for item in items if item and item.strip()]


def from_mapping(data: dict[str, Any], base: NodeConfig | None = None) -> NodeConfig:
    """Build a config from a parsed TOML file (unknown keys go to ``extra``)."""
    cfg = base or NodeConfig()
    known = {f.name for f in fields(NodeConfig)}
    for key, value in data.items():
        if key == "tls":
            cfg.tls = TLSConfig(**_only(value, TLSConfig, "tls"))
        elif key == "discovery":
            cfg.discovery = DiscoveryConfig(**_only(value, DiscoveryConfig, "discovery"))
        elif key in ("join", "members"):
            setattr(cfg, key, parse_join(value))
        elif key == "app":
            cfg.app = parse_app_list(value)
        elif key in known and key != "extra":
            setattr(cfg, key, value)
        else:
            cfg.extra[key] = value
    return cfg


def parse_app_list(value: Any) -> list[str]:
    """``app`` from a file: one module name or a list of them."""
    from nonstop.node.apps import AppLoadError, parse_apps

    try:
        return parse_apps(value)
    except AppLoadError as exc:
        raise ConfigError(str(exc)) from None


def _only(value: Any, cls: type, section: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"[{section}] must be a table")
    allowed = {f.name for f in fields(cls)}
    unknown = set(value) - allowed
    if unknown:
        raise ConfigError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
    return value


def load(path: str | Path) -> NodeConfig:
    """Read a TOML config file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
    return from_mapping(data)
