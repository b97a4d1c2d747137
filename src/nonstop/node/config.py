"""A node's configuration: one schema for the TOML file, ``--option`` values and policies.

:class:`NodeConfig` is a pydantic model: every key a node understands is a
field here, with its type, default and a description (the key table in
``docs/operations.md`` is generated from it by :mod:`nonstop.node.config_doc`).
A config file (``--config node.toml``), the ``--option key=value`` values of
``nonstop local up`` and the quorum policy table (``quorum = {...}``) are all
checked against it, so an unknown key is refused with the closest valid key,
and a wrong type names the key, the expected type and the value -- one line
for the operator (:class:`ConfigError`).  Command-line options win over the
file, so a shared file can be reused with ``--name``/``--listen`` per node.

Files are read with :mod:`tomllib` and written with ``tomli_w``
(:func:`to_toml`), so nested tables (``raft``, ``tls``) round-trip.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic import model_validator as _model_validator

from nonstop.net.discovery import DiscoveryConfig
from nonstop.net.frames import DEFAULT_MAX_FRAME
from nonstop.net.handshake import PROTOCOL_MAX, PROTOCOL_MIN
from nonstop.net.tls import TLSConfig, setup_problem
from nonstop.runtime.limits import ConnectionLimits

DEFAULT_CLUSTER = "nonstop"
DEFAULT_MACHINE = "nonstop.node.machine:build_cluster_node"

CLUSTER_KEYS = ("quorum", "raft", "snapshot_every", "max_log_entry_bytes")
"""Keys handed unchanged to :class:`nonstop.cluster.node.ClusterConfig` (via ``extra``)."""
SERVICE_KEYS = (
    "lock_wait",
    "deadlock_every",
    "deadlock_wound",
    "deadlock_age_max",
    "tx_idle",
    "branch_idle",
    "rpc_timeout",
    "commit_timeout",
    "sweep_every",
    "result_window",
)
"""Keys handed to :class:`nonstop.dataplane.service.ServiceConfig` (via ``extra``)."""


class ConfigError(ValueError):
    """The configuration is unusable; the message is one line for the operator."""


class Section(BaseModel):
    """A table of the config: unknown keys are errors, values are not coerced from strings."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)


class TLSSection(Section):
    """`[tls]`: PEM files; with `cert` the node listens with TLS only (see TLS)."""

    cert: str | None = Field(
        default=None, description="this node's certificate (server and client)"
    )
    key: str | None = Field(default=None, description="its private key")
    ca: str | None = Field(default=None, description="CA that peers and clients must be signed by")
    require_client_cert: bool = Field(default=True, description="with `ca`: mutual TLS")
    check_hostname: bool = Field(default=True, description="verify peers' host names")
    member_names: bool = Field(
        default=False,
        description="with `ca`: a node's certificate must name it (CN or DNS SAN = node name)",
    )

    @property
    def enabled(self) -> bool:
        return self.cert is not None or self.ca is not None

    def runtime(self) -> TLSConfig:
        """The network layer's :class:`~nonstop.net.tls.TLSConfig`."""
        return TLSConfig(**self.model_dump())


# ---------------------------------------------------------------- [limits] (issue 11)
_LIMITS = ConnectionLimits()


class LimitsSection(Section):
    """`[limits]`: what connections may make a node hold (see Resource bounds in security.md)."""

    buffer_budget_bytes: int = Field(
        default=_LIMITS.buffer_budget_bytes,
        ge=1024 * 1024,
        description="bytes of incomplete frames all connections together may buffer; "
        "a connection that would overrun it is closed",
    )
    handshake_frame_bytes: int = Field(
        default=_LIMITS.handshake_frame_bytes,
        ge=1024,
        description="largest frame accepted before a connection's handshake is done",
    )
    max_client_connections: int = Field(
        default=_LIMITS.max_client_connections,
        ge=1,
        description="client connections at once; beyond, `TooManyConnections`",
    )
    max_peer_connections: int = Field(
        default=_LIMITS.max_peer_connections,
        ge=1,
        description="inbound connections from nodes at once; beyond, `TooManyConnections`",
    )
    max_handshaking_connections: int = Field(
        default=_LIMITS.max_handshaking_connections,
        ge=1,
        description="connections still in their handshake at once; beyond, refused",
    )
    handshake_timeout: float = Field(
        default=_LIMITS.handshake_timeout,
        gt=0,
        description="seconds a new connection has to finish its handshake (TLS included)",
    )
    frame_timeout: float = Field(
        default=_LIMITS.frame_timeout,
        gt=0,
        description="seconds a frame may take to arrive once begun, and a client to take its "
        "replies (slow senders and readers are closed)",
    )
    reply_backlog_bytes: int = Field(
        default=_LIMITS.reply_backlog_bytes,
        ge=64 * 1024,
        description="unsent reply bytes of a client above which its requests wait to be read; "
        "not taken within `frame_timeout`: closed",
    )
    client_idle_timeout: float = Field(
        default=_LIMITS.client_idle_timeout,
        ge=0,
        description="seconds a client connection may go without a frame either way "
        "(0: no limit); clients reconnect by themselves",
    )

    def runtime(self) -> ConnectionLimits:
        """The runtime's :class:`~nonstop.runtime.limits.ConnectionLimits`."""
        return ConnectionLimits(**self.model_dump())


class DiscoverySection(Section):
    """`[discovery]`: UDP announcements, off by default (see Dynamic discovery)."""

    enabled: bool = Field(default=False, description="announce and listen for nodes over UDP")
    mode: Literal["multicast", "loopback"] = Field(
        default="multicast", description="`loopback`: nodes on one machine, UDP to their ports"
    )
    group: str = Field(default="239.255.77.77", description="multicast group")
    port: int = Field(default=7199, description="multicast UDP port")
    interface: str = Field(default="127.0.0.1", description="interface to announce on")
    ttl: int = Field(default=0, description="multicast TTL (0 = this host only)")
    interval: float = Field(default=1.0, description="seconds between announcements")
    ports: list[int] = Field(
        default_factory=lambda: [7101, 7120],
        description="loopback mode: inclusive range of listen ports to announce to",
    )

    def runtime(self) -> DiscoveryConfig:
        return DiscoveryConfig(**self.model_dump())


# -- authentication (sec-auth): a separate block to ease merges with other sections
class AuthSection(Section):
    """`[auth]`: who may connect (see Authentication; docs/security.md)."""

    enabled: bool = Field(
        default=True,
        description="peers prove the cluster secret, clients a user's password; `false` "
        "runs the node open to anyone who reaches its port (benchmarks only)",
    )
    secret_file: str | None = Field(
        default=None,
        description="file with the cluster secret (hex, mode 0600, the same on every node); "
        "default `DATA/cluster.secret`, generated for a node that joins no one",
    )
    admin_file: str | None = Field(
        default=None,
        description="credentials file (JSON user/password, 0600) of the bootstrap admin; "
        "default `DATA/admin.credentials.json`, generated on first start",
    )


class RaftSection(Section):
    """`[raft]`: cluster-log tunables (`nonstop.cluster.raft.RaftConfig`)."""

    election_timeout: float = Field(
        default=1.0, description="seconds; elections time out in [t, 2t)"
    )
    heartbeat_interval: float = Field(default=0.1, description="seconds between leader heartbeats")
    max_entries_per_append: int = Field(default=4096, description="log entries per append message")
    max_inflight_appends: int = Field(default=4, description="appends in flight per follower")
    join_retry_interval: float = Field(default=0.5, description="seconds between join attempts")


class QuorumSection(Section):
    """`[quorum]`: the quorum policy (D16, `nonstop.cluster.quorum.QuorumPolicy`)."""

    mode: Literal["majority", "min_votes", "percentage", "off"] = Field(
        default="majority", description="how many votes make a quorum"
    )
    min_votes: int | None = Field(default=None, description="mode min_votes: votes needed")
    percentage: float | None = Field(
        default=None, description="mode percentage: share of votes, (0, 100]"
    )
    weights: dict[str, int] = Field(default_factory=dict, description="votes per node name")
    default_weight: int = Field(default=1, description="votes of a node not in `weights`")
    allow_non_intersecting: bool | None = Field(
        default=None,
        description="accept policies whose quorums need not intersect (default: mode off)",
    )

    @_model_validator(mode="after")
    def _consistent(self) -> QuorumSection:
        from nonstop.cluster.quorum import QuorumPolicy

        try:
            QuorumPolicy.from_config(self.model_dump(exclude_unset=True))
        except ValueError as exc:
            raise ValueError(f"quorum policy: {exc}") from None
        return self


class HaPolicySection(Section):
    """`[ha.policies.NAME]`: one distribution policy (D2, D3; ha.md section 4)."""

    kind: Literal["dynamic", "static"] | None = Field(
        default=None,
        description="`dynamic`: partitions spread over the nodes; `static`: the lists below "
        "(default: static when `partitions_static` is given)",
    )
    partitions: int = Field(default=16, ge=1, description="dynamic: number of partitions")
    replicas: int = Field(default=1, ge=0, description="dynamic: sync replicas per partition")
    async_replicas: int = Field(
        default=0, ge=0, description="dynamic: async replicas per partition"
    )
    batch: int = Field(default=1000, ge=1, description="objects copied per restore transaction")
    partitions_static: dict[str, list[list[str]]] = Field(
        default_factory=dict,
        description="static: partition name → priority-ordered node list "
        '`[["A", "sync"], ["B", "async"], ...]`',
    )


class HaBindingSection(Section):
    """`[ha.bindings.TYPE]`: the policy and mapper of a managed type and its subtypes."""

    policy: str = Field(default="default", description="the policy its objects go to")
    mapper: str = Field(
        default="hash",
        description='`"hash"` (consistent hash of the unique key), `"round_robin"`, or '
        '`"module:Class"` (an application mapper)',
    )
    ring_size: int = Field(default=4096, ge=1, description="hash: slots of the ring")


class HaSection(Section):
    """`[ha]`: partitions, policies, bindings, leases (see High availability)."""

    default_policy: str = Field(
        default="default", description="the policy of types without a binding"
    )
    policies: dict[str, HaPolicySection] = Field(
        default_factory=dict,
        description="policies by name; `default` (dynamic, 16 partitions, 1 sync replica) "
        "exists unless given here",
    )
    bindings: dict[str, HaBindingSection] = Field(
        default_factory=dict, description="bindings by managed type name"
    )
    lease: float = Field(
        default=0.6, gt=0, description="seconds a node's liveness lease lasts (ha.md section 8)"
    )
    drift: float = Field(
        default=0.05, ge=0, lt=1, description="tolerated difference of clock rates between nodes"
    )
    retry: float = Field(
        default=0.5, gt=0, description="seconds before an unanswered table proposal is resent"
    )
    data: Literal["nodes", "partitions"] = Field(
        default="partitions",
        description="how the data path routes: `partitions` (a reference names its "
        'partition, served by the partition\'s active node; ha.md "Routing by partition"; '
        "with a policy with replicas, each partition's writes reach its sync replicas "
        "before they are acknowledged, `replicate_data`) or `nodes` (the older layout: a "
        "reference names the node that created it, no copy). A data directory keeps the "
        "routing it was made with",
    )
    replicate_data: bool = Field(
        default=True,
        description='with `data = "partitions"`: replicate each partition\'s writes to its '
        "sync replicas when a policy has replicas (replication.md section 10d); `false` "
        "turns replication off, and policies with replicas are then refused. No effect "
        'with `data = "nodes"`',
    )

    @_model_validator(mode="after")
    def _consistent(self) -> HaSection:
        from nonstop.ha.policies import DistributionError

        try:
            dist = self.distribution(resolve_mappers=False)
        except DistributionError as exc:
            raise ValueError(str(exc)) from None
        if self.data == "partitions":
            refusal = replicas_refusal(dist, replicated=self.replicate_data)
            if refusal is not None:
                raise ValueError(refusal)
        return self

    @property
    def replicating(self) -> bool:
        """Do this node's partitions replicate their writes?  Routing by partition, the
        switch on and not turned off, and a policy that keeps more than one copy (with
        one copy there is nothing to replicate to: the node runs as before)."""
        from nonstop.dataplane.placement import SYNC_REPLICATION_OF_DATA

        if self.data != "partitions" or not (SYNC_REPLICATION_OF_DATA and self.replicate_data):
            return False
        return keeps_copies(self.distribution(resolve_mappers=False))

    def distribution(
        self, known_nodes: list[str] | None = None, *, resolve_mappers: bool = True
    ) -> Any:
        """The validated :class:`nonstop.ha.policies.Distribution` (raises ``DistributionError``).

        ``known_nodes``: the cluster's nodes, when known, that static lists may name.
        """
        from nonstop.ha.policies import DEFAULT_POLICY, distribution_from_config

        policies = {
            name: policy.model_dump(exclude_unset=True) for name, policy in self.policies.items()
        }
        if DEFAULT_POLICY not in policies:
            policies = {DEFAULT_POLICY: {}, **policies}
        raw = {
            "default_policy": self.default_policy,
            "policies": policies,
            "bindings": {n: b.model_dump() for n, b in self.bindings.items()},
        }
        return distribution_from_config(
            raw, known_nodes=known_nodes, resolve_mappers=resolve_mappers
        )


# -- the admin HTTP API (admin-http): a separate block to ease merges with other sections
class AdminSection(Section):
    """`[admin]`: the admin HTTP API and web console (see Admin API); off unless `listen`."""

    listen: str | None = Field(
        default=None,
        description="`host:port` of the admin API and console (`/api/v1/...`, `/console/`); "
        "HTTPS when the node's TLS has a certificate",
    )
    session_ttl: float = Field(
        default=3600.0, gt=0, description="seconds a console session token is valid"
    )
    max_body: int = Field(
        default=65536, ge=1024, description="largest request body (bytes); larger is 413"
    )


def _copies(policy: Any) -> tuple[int, int]:
    """(copies of a partition, async replicas among them) a policy keeps at most."""
    from nonstop.ha.policies import ASYNC, STATIC

    if policy.kind == STATIC:
        lists = [part.nodes for part in policy.static]
        asyncs = sum(1 for nodes in lists for _, style in nodes if style == ASYNC)
        return max((len(nodes) for nodes in lists), default=1), asyncs
    return 1 + policy.replicas + policy.async_replicas, policy.async_replicas


def keeps_copies(distribution: Any) -> bool:
    """Does any policy keep more than one copy of a partition?"""
    return any(_copies(p)[0] > 1 for p in distribution.policies.values())


def replicas_refusal(distribution: Any, *, replicated: bool = True) -> str | None:
    """Why ``ha.data = "partitions"`` cannot run this distribution, or None.

    Without sync replication of the data (``replicated`` false, or the switch
    ``dataplane/placement.SYNC_REPLICATION_OF_DATA`` off) a failover would promote a
    node that has none of the partition's objects: every policy must then keep one
    copy (``replicas = 0``, static lists of one sync node).  With it only async
    replicas are refused: they are not fed yet (D11, replication.md §10d).
    """
    from nonstop.dataplane.placement import SYNC_REPLICATION_OF_DATA

    on = SYNC_REPLICATION_OF_DATA and replicated
    for name in sorted(distribution.policies):
        copies, asyncs = _copies(distribution.policies[name])
        if on and asyncs:
            return (
                f"policy {name!r} has async replicas: async replication of data is not "
                "built yet (D11); use sync replicas (ha.data = 'partitions')"
            )
        if not on and copies > 1:
            return (
                f"policy {name!r} keeps {copies} copies of a partition, but sync replication "
                "of data is off (ha.replicate_data = false); set replicas = 0 or turn it on"
            )
    return None


class MetricsSection(Section):
    """`[metrics]`: the Prometheus endpoint (see Metrics); off unless `listen` is set."""

    listen: str | None = Field(
        default=None,
        description="`host:port` of the metrics endpoint (`GET /metrics`, a user allowed "
        "`status`); HTTPS when the node's TLS has a certificate",
    )
    latency_buckets: list[float] = Field(
        default_factory=lambda: [
            0.0005,
            0.001,
            0.002,
            0.005,
            0.01,
            0.02,
            0.05,
            0.1,
            0.2,
            0.5,
            1.0,
            2.0,
            5.0,
        ],
        description="upper bounds (seconds) of the commit latency histogram's buckets",
    )

    @field_validator("listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            check_address(value)
        return value


class NodeConfig(Section):
    """Everything one node process needs; the defaults make a single local node."""

    name: str = Field(default="", description="cluster-unique node name (required)")
    data: str = Field(default="", description="data directory (required)")
    cluster: str | None = Field(
        default=None,
        description=f'cluster id, checked against the data directory (`"{DEFAULT_CLUSTER}"`)',
    )
    listen: str = Field(
        default="127.0.0.1:7101", description="address to listen on, and to announce to peers"
    )
    join: list[str] = Field(
        default_factory=list,
        description='peers: `"host:port"` or `"name@host:port"` (a comma string is accepted)',
    )
    members: list[str] = Field(
        default_factory=list,
        description="bootstrap membership of a *new* cluster (every node the same list)",
    )
    protocol: list[int] = Field(
        default_factory=lambda: [PROTOCOL_MIN, PROTOCOL_MAX],
        description="wire protocol range `[min, max]`; only changed to test upgrades (E4)",
    )
    max_frame_bytes: int = Field(
        default=DEFAULT_MAX_FRAME, description="largest frame accepted or sent"
    )
    # Defaults detect a dead node in well under a second on a LAN (~0.5-0.6 s
    # measured: bench/results/cluster.md); raise them on slow or lossy networks.
    keepalive_interval: float = Field(default=0.1, description="seconds between keep-alives (C6)")
    nonresponse_timeout: float = Field(
        default=0.4,
        description="silence before the one reconnect; Down one interval later "
        "(raise both on slow or lossy networks)",
    )
    connect_timeout: float = Field(default=2.0, description="seconds for a TCP connect + handshake")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level"
    )
    log_file: str | None = Field(default=None, description="log file (default: stderr)")
    log_format: Literal["json", "text"] = Field(
        default="json",
        description="`json`: one JSON object per line (`nonstop logs` reads it); "
        "`text`: plain lines for a terminal",
    )
    machine: str = Field(
        default=DEFAULT_MACHINE, description="`module:factory` of the protocol machine"
    )
    app: list[str] = Field(
        default_factory=list,
        description="application modules imported at start, before the store opens (F2)",
    )
    sync: bool = Field(
        default=True, description="fsync commits (turn off only for throw-away tests)"
    )
    scrub_interval: float = Field(
        default=3600.0,
        description="seconds between background scrubs of the stores (0: none; "
        "`nonstop store verify`)",
    )
    tls: TLSSection = Field(default_factory=TLSSection, description="TLS, see below")
    metrics: MetricsSection = Field(
        default_factory=MetricsSection, description="Prometheus endpoint, see below"
    )
    admin: AdminSection = Field(
        default_factory=AdminSection, description="admin HTTP API and console, see below"
    )
    auth: AuthSection = Field(default_factory=AuthSection, description="authentication, see below")
    discovery: DiscoverySection = Field(
        default_factory=DiscoverySection, description="UDP discovery, see below"
    )
    limits: LimitsSection = Field(
        default_factory=LimitsSection, description="connection limits, see below"
    )
    # -- passed to the cluster layer (ClusterConfig) when set
    quorum: QuorumSection = Field(
        default_factory=QuorumSection, description="quorum policy table (D16)"
    )
    raft: RaftSection = Field(default_factory=RaftSection, description="cluster-log tunables")
    snapshot_every: int = Field(default=256, description="cluster-log entries between snapshots")
    ha: HaSection = Field(
        default_factory=HaSection, description="partitions and their policies, see below"
    )
    max_log_entry_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="largest cluster-log entry a proposal may add (packed bytes); "
        "larger ones are refused with `TooLarge` naming the limit and the size",
    )
    # -- passed to the data service (ServiceConfig) when set
    lock_wait: float = Field(
        default=5.0,
        description="seconds a transaction waits for a lock before `LockTimeout` (B4)",
    )
    deadlock_every: float = Field(
        default=0.025,
        ge=0,
        description="seconds between reads of the store's lock waits, shared with the other "
        "nodes to find deadlocks across nodes (docs/design/deadlocks.md); 0 turns it off",
    )
    deadlock_wound: Literal["blocked", "any", "off"] = Field(
        default="blocked",
        description="wound-wait, at each read of the lock waits: an older transaction waiting "
        "for a younger one aborts it (`Deadlock`, replayed by `@transactional`) when that one "
        "waits too (`blocked`) or always (`any`); `off`: only cycles are broken",
    )
    deadlock_age_max: float = Field(
        default=0.0,
        ge=0,
        description="above 0, a transaction replayed by `@transactional` ranks from its first "
        "attempt in wound-wait (no transaction starves), as its client says, but at most this "
        "many seconds older than its replay; 0: every replay ranks anew (fewer wounds, "
        "shorter gaps under heavy contention; docs/design/deadlocks.md section 2b)",
    )
    tx_idle: float = Field(
        default=60.0,
        gt=0,
        description="a transaction with no client call this long is rolled back on every node, "
        "the coordinator's own branch included; its next call answers `TransactionClosed`",
    )
    branch_idle: float = Field(
        default=90.0,
        gt=0,
        description="a participant's branch idle this long is rolled back (B8); keep it above "
        "`tx_idle`",
    )
    rpc_timeout: float = Field(
        default=15.0,
        description="a peer silent this long on a data request is `Unavailable` "
        "(keep it above `lock_wait`)",
    )
    commit_timeout: float = Field(
        default=30.0,
        description="a distributed commit undecided this long answers `Unavailable` "
        "(outcome unknown: ask `request.result`)",
    )
    sweep_every: float = Field(default=1.0, description="seconds between the data service's sweeps")
    result_window: int = Field(
        default=1024, description="request outcomes kept per client session for `request.result`"
    )

    # ------------------------------------------------------------ parsing
    @field_validator("join", "members", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        return parse_join(value) if isinstance(value, str) else value

    @field_validator("app", mode="before")
    @classmethod
    def _apps(cls, value: Any) -> Any:
        from nonstop.node.apps import AppLoadError, parse_apps

        try:
            return parse_apps(value)
        except AppLoadError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("listen")
    @classmethod
    def _address(cls, value: str) -> str:
        check_address(value)
        if value.rpartition(":")[2].lstrip("0") == "":
            # Port 0 ("any free port") cannot work here: this address is announced to
            # the peers, which dial it.
            raise ValueError(f"{value!r} has port 0: a node needs a fixed port its peers dial")
        return value

    @field_validator("join")
    @classmethod
    def _join_addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            check_address(entry.rpartition("@")[2])
        return value

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, value: list[int]) -> list[int]:
        if len(value) != 2 or not 1 <= value[0] <= value[1]:
            raise ValueError(f"protocol must be [min, max], got {value!r}")
        return value

    @field_validator("max_frame_bytes")
    @classmethod
    def _frame(cls, value: int) -> int:
        if value < 1024:
            raise ValueError("max_frame_bytes must be at least 1024")
        return value

    @_model_validator(mode="after")
    def _ha_nodes(self) -> NodeConfig:
        """Static node lists name nodes of the bootstrap membership (when there is one)."""
        if not self.members:
            return self  # a joining node: the table checks lists against the committed view
        from nonstop.ha.policies import DistributionError

        try:
            self.ha.distribution(self.members, resolve_mappers=False)
        except DistributionError as exc:
            raise ValueError(f"config key 'ha': {exc}") from None
        return self

    # ------------------------------------------------------------ use
    def validate_node(self) -> None:
        """What a starting node needs beyond well-typed keys (name, data, TLS files)."""
        if not self.name:
            raise ConfigError("a node needs a name (--name or name = ...)")
        if not self.data:
            raise ConfigError("a node needs a data directory (--data or data = ...)")
        problem = setup_problem(self.tls.runtime())
        if problem is not None:
            raise ConfigError(problem)

    # ``validate`` is the name the node and the CLI call (pydantic's own classmethod
    # of that name is deprecated and unused here).
    validate = validate_node  # type: ignore[assignment]

    @property
    def extra(self) -> dict[str, Any]:
        """The keys set for the layers below (cluster layer, data service), by name.

        Only keys given in the configuration: a layer's own default applies otherwise
        (``tests/unit/test_config.py`` checks the schema's defaults equal theirs).
        """
        out: dict[str, Any] = {}
        for key in (*CLUSTER_KEYS, *SERVICE_KEYS):
            if key not in self.model_fields_set:
                continue
            value = getattr(self, key)
            out[key] = value.model_dump(exclude_unset=True) if isinstance(value, Section) else value
        return out

    def to_dict(self) -> dict[str, Any]:
        """A TOML/JSON-able view (what the node writes to ``DATA/node.json``)."""
        return self.model_dump(exclude_none=True)

    def settings(self) -> dict[str, Any]:
        """Only the keys that were set (what a config file written from this holds)."""
        return self.model_dump(exclude_unset=True, exclude_none=True)


def check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")


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


# ================================================================ checking
def from_mapping(data: Mapping[str, Any], base: NodeConfig | None = None) -> NodeConfig:
    """Check ``data`` (a parsed TOML file, ``--option`` values) against the schema.

    With ``base`` the keys of ``data`` override it (nested tables are replaced whole).
    Raises :class:`ConfigError` with one line naming every bad key.
    """
    merged = {**(base.settings() if base is not None else {}), **data}
    try:
        return NodeConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(explain(exc)) from None


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Validate partial settings (``local up --option``); returns them normalised."""
    cfg = from_mapping(options)
    return {key: value for key, value in cfg.settings().items() if key in options}


def explain(exc: ValidationError, model: type[BaseModel] = NodeConfig) -> str:
    """One line for every problem pydantic found: the key, what was expected, the value."""
    return "; ".join(_explain_one(error, model) for error in exc.errors())


BOUNDS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
"""pydantic error types of a number out of its field's bounds (``ge=``, ``gt=``...)."""


def _explain_one(error: Any, model: type[BaseModel]) -> str:
    loc = [str(part) for part in error["loc"]]
    key = ".".join(loc)
    if not loc:  # a check of the whole configuration: its message names the keys
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if error["type"] == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        valid = list(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
        return f"unknown config key {key!r} ({hint})"
    expected = _expected(model, loc)
    if error["type"] in BOUNDS:
        bound = error["msg"].lower().removeprefix("input should be ")
        return f"config key {key!r} must be {bound}, got {error['input']!r}"
    if error["type"] == "value_error":
        message = str(error.get("ctx", {}).get("error", error["msg"]))
        return f"config key {key!r}: {message}"
    return f"config key {key!r} must be {expected}, got {error['input']!r}"


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    current: Any = model
    for part in path:
        if get_origin(current) is dict:  # a table of sections (``ha.policies.NAME``)
            current = get_args(current)[1]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = field.annotation
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _expected(model: type[BaseModel], loc: list[str]) -> str:
    parent = _model_at(model, loc[:-1])
    name = loc[-1]
    if parent is None:  # an item of a list or table: describe the container's item type
        container = _model_at(model, loc[:-2])
        if container is not None and loc[-2] in container.model_fields:
            args = get_args(container.model_fields[loc[-2]].annotation)
            return describe_type(args[-1]) if args else "a value of another type"
        return "a value of another type"
    field = parent.model_fields.get(name)
    return describe_type(field.annotation) if field is not None else "a value of another type"


def describe_type(annotation: Any) -> str:
    """An operator's name for a field type: ``a number``, ``a list of strings``..."""
    origin = get_origin(annotation)
    args = [a for a in get_args(annotation) if a is not type(None)]
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(annotation))
    if origin is list:
        return f"a list of {_plural(args[0])}"
    if origin is dict:
        return f"a table of {_plural(args[1])}"
    if args and len(args) < len(get_args(annotation)):  # X | None
        return describe_type(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a table"
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _plural(annotation: Any) -> str:
    return {str: "strings", int: "integers", float: "numbers", bool: "booleans"}.get(
        annotation, "values"
    )


# ================================================================ files
def load(path: str | Path) -> NodeConfig:
    """Read and check a TOML config file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
    try:
        return from_mapping(data)
    except ConfigError as exc:
        raise ConfigError(f"config {path}: {exc}") from None


def to_toml(settings: Mapping[str, Any]) -> str:
    """TOML text of ``settings`` (written by ``tomli_w``: nested tables round-trip)."""
    return tomli_w.dumps({k: v for k, v in settings.items() if v is not None})


def write(path: str | Path, cfg: NodeConfig) -> None:
    """Write the keys set in ``cfg`` as a config file :func:`load` reads back equal."""
    Path(path).write_text(to_toml(cfg.settings()))
