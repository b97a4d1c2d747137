"""Which protocol machine a node process runs, built from its configuration.

The default is the cluster layer, :class:`nonstop.cluster.node.ClusterNode`.
The ``machine`` config key (``"module:callable"``) selects another factory with
the same signature — tests and benchmarks use
:func:`build_probe` to exercise the runtime on its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
from collections.abc import Callable
from typing import Any

from nonstop.node.config import ConfigError, NodeConfig, split_join
from nonstop.node.datadir import Identity
from nonstop.runtime.interface import Machine

MachineFactory = Callable[[NodeConfig, Identity, dict[bytes, bytes], random.Random], Machine]


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
    cfg: NodeConfig, ident: Identity, recovered: dict[bytes, bytes], rng: random.Random
) -> Machine:
    """The real cluster layer: failure detector, cluster log and quorum."""
    from nonstop.cluster.failure import DetectorConfig
    from nonstop.cluster.node import ClusterConfig, ClusterNode

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
    config = ClusterConfig(
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
    return ClusterNode(config, rng, recovered)


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
