"""Which protocol machine a node process runs, built from its configuration.

The default is the cluster layer with distributed commit,
:class:`nonstop.dtx.clustered.DtxClusterNode` (a cluster node plus the
two-phase-commit machine over the node's object store); without an object
store it is the cluster node alone.  The cluster node is
:class:`nonstop.ha.cluster_node.HaClusterNode`: the ``ClusterNode`` with the
partition table, its promoter, restorer and leases, laid out from the ``[ha]``
configuration (ha.md section 11a).  The
``machine`` config key (``"module:callable"``) selects another factory with the
same signature — tests and benchmarks use :func:`build_probe` to exercise the
runtime on its own.  A factory that declares a ``context`` keyword gets the
node's :class:`NodeContext` (the object store and the data service's hooks).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nonstop.dtx.clustered import ClusterFactory
from nonstop.node.config import ConfigError, NodeConfig, split_join
from nonstop.node.datadir import Identity
from nonstop.replication.data import KEYS as REPLICA_KEYS
from nonstop.runtime.interface import Machine, Persist
from nonstop.runtime.persist import Done, writes_of

REPLICA_COMMIT_WRITES = 8000
"""Writes of the replicas' data per write set at most (two replication messages' worth):
the bound on what the cluster log's next append may share a commit with."""

MachineFactory = Callable[..., Machine]
"""``(cfg, ident, recovered, rng[, context=NodeContext])`` → the node's machine."""


@dataclass
class NodeContext:
    """What the node process gives a machine factory beyond the configuration."""

    db: Any = None
    """The node's object store (``nonstop.Database``), or None."""
    lookup_branch: Callable[[str], Any] | None = None
    """The data service's branch registry (``DataService.lookup_branch``)."""
    branch_lapsed: Callable[[str], bool] | None = None
    """Whether a branch is refused only for a lapse of the lease (``DataService.
    branch_lapsed``): the participant's vote waits it out."""
    feed: Callable[[list[Any]], None] | None = None
    """Hands the resource manager's late progress to the machine (on the loop)."""
    replicator: Any = None
    """Sync replication of partitions (``nonstop.node.replicated.StoreSide``): the store's
    side of the replication machine, or None when the node does not replicate."""
    cluster_writer: Any = None
    """The cluster store's persister (the real runtime's ``writer``): the replicas' data
    gets a route of its own to it (``build``)."""
    route_persists: Callable[..., None] | None = None
    """``route_persists(prefix, persister, label=..., distinct_keys=...)``: send the
    machine's ``Persist`` writes under ``prefix`` to ``persister`` instead of the cluster
    store (the runtime's :meth:`~nonstop.runtime.persist.PersistRouter.route`)."""


def takes_context(factory: MachineFactory) -> bool:
    """Does ``factory`` accept the ``context`` keyword?"""
    try:
        return "context" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def resolve(spec: str) -> MachineFactory:
    """``"package.module:callable"`` → the callable."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
        factory: Any = getattr(module, attr or "build")
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load machine {spec!r}: {exc}") from exc
    return factory  # type: ignore[no-any-return]


def build_cluster_node(
    cfg: NodeConfig,
    ident: Identity,
    recovered: dict[bytes, bytes],
    rng: random.Random,
    context: NodeContext | None = None,
) -> Machine:
    """The real cluster layer (failure detector, cluster log, quorum) and distributed commit.

    With an object store in ``context`` the machine is a ``DtxClusterNode``
    whose resource manager is the store (``nonstop.dataplane.participant``); its durable
    ``dtx/`` state is read back from the store and written by a ``DtxPersister``
    in the store's own commits, routed there through ``context.route_persists``
    (data-path.md section 5).
    """
    from nonstop.security.users_table import UsersLogTable

    config = cluster_config(cfg, ident)
    make_cluster = ha_cluster_factory(cfg)
    if context is None or context.db is None:
        cluster = make_cluster(config, rng, recovered)
        cluster.register_table(UsersLogTable(cluster))
        return cluster
    from nonstop.dataplane.participant import (
        K_DTX,
        DtxPersister,
        StoreResourceManager,
        recovered_dtx_state,
    )
    from nonstop.dtx.clustered import DtxClusterNode
    from nonstop.dtx.protocol import DtxConfig

    assert context.lookup_branch is not None and context.feed is not None
    assert context.route_persists is not None
    db = context.db
    merged = {**recovered, **recovered_dtx_state(db)}
    rm = StoreResourceManager(db, context.lookup_branch, context.feed, context.branch_lapsed)
    # The object store's group committer applies a write set's deletes before its
    # puts: it must never get a write set that writes a key twice.
    context.route_persists(K_DTX, StoreWrites(DtxPersister(db)), label="dtx", distinct_keys=True)
    real = getattr(DtxConfig, "real", None)
    dtx_config = real() if real is not None else DtxConfig()
    machine: DtxClusterNode
    if context.replicator is not None and cfg.ha.replicating:
        if context.cluster_writer is not None:
            # The replicas' data (records, copies, holds: ``rep/``) on a route of its own to
            # the same writer, a bounded write set at a time: a swap's replication made
            # write sets of 20,000-46,000 keys, back to back, and the cluster log's appends
            # -- the liveness leases' renewals among them -- queued behind them on the one
            # route, so every node's lease lapsed for seconds (runtime.md, "Persists").
            # Small write sets of both routes still share one commit (one fsync).
            context.route_persists(
                REPLICA_KEYS,
                context.cluster_writer,
                label="rep",
                serial=True,
                max_writes=REPLICA_COMMIT_WRITES,
            )
        machine = replicated_node(cfg, config, rm, rng, merged, dtx_config, make_cluster, context)
    else:
        machine = DtxClusterNode(config, rm, rng, merged, dtx_config, cluster_factory=make_cluster)
    machine.cluster.register_table(UsersLogTable(machine.cluster))
    return machine


def replicated_node(
    cfg: NodeConfig,
    config: Any,
    rm: Any,
    rng: random.Random,
    recovered: dict[bytes, bytes],
    dtx_config: Any,
    make_cluster: ClusterFactory,
    context: NodeContext,
) -> Any:
    """The cluster node with sync replication of partitions (``nonstop.node.replicated``):
    its ``rep/`` keys go to the cluster store (the runtime's default persister); the object
    store takes a partition's copy when the node starts acting for it."""
    from nonstop.ha.partition_table import partition_location
    from nonstop.node.replica_store import install, load_copy
    from nonstop.node.replicated import ReplicatedClusterNode
    from nonstop.replication import ReplicationConfig

    db = context.db

    async def load(name: str, values: Any) -> int:
        return await load_copy(db, partition_location(name), values)

    async def put(name: str, writes: Any) -> None:
        await install(db, writes)

    rm.replicator = context.replicator
    return ReplicatedClusterNode(
        config,
        rm,
        rng,
        recovered,
        dtx_config,
        cluster_factory=make_cluster,
        store=context.replicator,
        load=load,
        install=put,
        replication=ReplicationConfig(silence_from_write=True),
    )


def ha_cluster_factory(cfg: NodeConfig) -> ClusterFactory:
    """``(config, rng, recovered)`` → the node's cluster node: the HA one with the
    configuration table (:class:`~nonstop.configuration.cluster_node.ConfiguredClusterNode`).

    The partition layout comes from the ``[ha]`` configuration over the bootstrap
    members (every founding node has the same list, so every node computes the same
    layout).  A node started without members (it joins later) hosts only the static
    partitions that list it: the dynamic ones were laid out over the founders
    (spreading them over new nodes is rebalancing, D19, later).  A binding whose
    mapper does not resolve (the application modules are loaded by now) is a
    :class:`ConfigError` naming it: the node does not start.
    """
    from nonstop.configuration.cluster_node import ConfiguredClusterNode
    from nonstop.ha.failover import PromoterConfig
    from nonstop.ha.lease import LeaseConfig
    from nonstop.ha.policies import STATIC, DistributionError

    try:
        distribution = cfg.ha.distribution(cfg.members or None)
    except DistributionError as exc:
        raise ConfigError(f"config key 'ha': {exc}") from None
    if cfg.members:
        layout = distribution.layout(cfg.members)
    else:
        layout = [
            part
            for policy in distribution.policies.values()
            if policy.kind == STATIC
            for part in policy.static
        ]
    promoter = PromoterConfig(retry=cfg.ha.retry)
    lease = LeaseConfig(lease=cfg.ha.lease, drift=cfg.ha.drift)
    # The HA cluster node plus the configuration table (F1, nonstop.configuration).
    factory: ClusterFactory = functools.partial(
        ConfiguredClusterNode, layout=layout, promoter=promoter, lease=lease
    )
    return factory


def users_table(machine: Any) -> Any:
    """The machine's users table (``nonstop.security.users_table``), or None."""
    cluster = getattr(machine, "cluster", machine)
    tables = getattr(cluster, "tables", None)
    return None if tables is None else tables.get("users")


class StoreWrites:
    """The object store's ``DtxPersister`` as a :class:`~nonstop.runtime.persist.Persister`.

    The persister takes one write set as plain writes; the runtime hands it the
    ``Persist`` actions of a write set.
    """

    __slots__ = ("persister",)

    def __init__(self, persister: Any) -> None:
        self.persister = persister

    def persist(self, batch: Sequence[Persist], done: Done) -> None:
        self.persister.persist(writes_of(batch), done)


def cluster_config(cfg: NodeConfig, ident: Identity) -> Any:
    """The :class:`~nonstop.cluster.node.ClusterConfig` of this node."""
    from nonstop.cluster.failure import DetectorConfig
    from nonstop.cluster.node import ClusterConfig

    _, static_peers = split_join(cfg.join)
    # Extra config keys named like a ClusterConfig field (quorum, raft,
    # snapshot_every, ...) are passed through unchanged.
    passthrough = {f.name for f in dataclasses.fields(ClusterConfig)} - {
        "name",
        "address",
        "store_timestamp",
        "members",
        "static_peers",
        "location",
        "protocol",
        "detector",
    }
    kwargs: dict[str, Any] = {k: v for k, v in cfg.extra.items() if k in passthrough}
    return ClusterConfig(
        name=ident.name,
        address=cfg.listen,
        store_timestamp=ident.timestamp,
        members=tuple(cfg.members),
        static_peers=static_peers,
        location=ident.location,
        protocol=(cfg.protocol[0], cfg.protocol[1]),
        detector=DetectorConfig(
            keepalive_interval=cfg.keepalive_interval,
            non_response_timeout=cfg.nonresponse_timeout,
        ),
        **kwargs,
    )


def build_probe(
    cfg: NodeConfig, ident: Identity, recovered: dict[bytes, bytes], rng: random.Random
) -> Machine:
    """The runtime's diagnostic machine (:mod:`nonstop.runtime.probe`)."""
    from nonstop.runtime.probe import ProbeMachine

    return ProbeMachine(
        ident.name,
        recovered,
        rng,
        interval=cfg.keepalive_interval,
        timeout=cfg.nonresponse_timeout,
        members=cfg.members,
    )
