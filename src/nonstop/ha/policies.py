"""Distribution policies and type bindings (D2, D3, D4; ha.md section 4).

A :class:`Policy` says how a family of partitions is laid out: *dynamic* (a
fixed number of partitions spread over the nodes present, ``replicas`` sync
replicas each) or *static* (explicit priority-ordered node lists, D2).  A
:class:`Binding` attaches a type to a policy with a mapper; bindings are
inherited by subtypes (the nearest class in the MRO with a binding wins, so a
subtype overrides by binding itself).  Types without a binding use the
default policy with the consistent-hash mapper.

:class:`Distribution` validates the whole set at once and raises
:class:`DistributionError` naming the culprit: a binding to an unknown policy,
a node list naming a node the cluster does not know, a partition named by two
policies, bad counts, a mapper spec that does not resolve.  Nothing is half
applied: a bad configuration never produces a layout.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nonstop.ha.mapper import (
    DEFAULT_RING_SIZE,
    ConsistentHashMapper,
    Mapper,
    MapperError,
    RoundRobinMapper,
    map_object,
)

SYNC = "sync"
ASYNC = "async"
STYLES = frozenset({SYNC, ASYNC})
DYNAMIC = "dynamic"
STATIC = "static"

DEFAULT_POLICY = "default"
DEFAULT_PARTITIONS = 16
"""Partitions of the default dynamic policy (ha.md section 4: why 16)."""
DEFAULT_REPLICAS = 1
DEFAULT_BATCH = 1000
"""Objects copied (and locked) per restore transaction (000: 'objects locked per transaction')."""

HASH = "hash"
ROUND_ROBIN = "round_robin"

NodeList = tuple[tuple[str, str], ...]
"""A priority-ordered node list ``((node, "sync"|"async"), ...)``; the first is preferred."""


class DistributionError(ValueError):
    """A policy, binding or partition definition that cannot be used (the message names it)."""


@dataclass(frozen=True, slots=True)
class PartitionDef:
    """One partition as a policy defines it: its name, node list and policy."""

    name: str
    nodes: NodeList
    policy: str

    def node_names(self) -> list[str]:
        return [n for n, _ in self.nodes]


@dataclass(frozen=True, slots=True)
class Policy:
    """How a family of partitions is laid out (module doc)."""

    name: str
    kind: str = DYNAMIC
    partitions: int = DEFAULT_PARTITIONS
    replicas: int = DEFAULT_REPLICAS
    async_replicas: int = 0
    batch: int = DEFAULT_BATCH
    static: tuple[PartitionDef, ...] = ()

    def check(self) -> None:
        where = f"policy {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise DistributionError(f"a policy needs a name, not {self.name!r}")
        if self.kind not in (DYNAMIC, STATIC):
            raise DistributionError(f"{where}: kind must be dynamic or static, not {self.kind!r}")
        for what, value, low in (
            ("partitions", self.partitions, 1),
            ("replicas", self.replicas, 0),
            ("async_replicas", self.async_replicas, 0),
            ("batch", self.batch, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise DistributionError(
                    f"{where}: {what} must be an integer >= {low}, not {value!r}"
                )
        if self.kind == STATIC and not self.static:
            raise DistributionError(f"{where}: a static policy needs at least one partition")
        if self.kind == DYNAMIC and self.static:
            raise DistributionError(f"{where}: a dynamic policy lists no partitions")
        for part in self.static:
            check_node_list(part.name, part.nodes)


@dataclass(frozen=True, slots=True)
class Binding:
    """A type bound to a policy with a mapper (``hash``, ``round_robin``, a class or object)."""

    type_name: str
    policy: str = DEFAULT_POLICY
    mapper: Any = HASH
    ring_size: int = DEFAULT_RING_SIZE


def check_node_list(partition: str, nodes: Sequence[Any]) -> None:
    """A node list's own shape: non-empty, names, known styles, no node twice."""
    where = f"partition {partition!r}"
    if not isinstance(partition, str) or not partition:
        raise DistributionError(f"a partition needs a name, not {partition!r}")
    if not nodes:
        raise DistributionError(f"{where}: the node list is empty")
    seen: set[str] = set()
    for item in nodes:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise DistributionError(f"{where}: {item!r} is not [node, style]")
        node, style = item
        if not isinstance(node, str) or not node:
            raise DistributionError(f"{where}: {node!r} is not a node name")
        if style not in STYLES:
            raise DistributionError(f"{where}: node {node} has style {style!r}, not sync/async")
        if node in seen:
            raise DistributionError(f"{where}: node {node} is listed twice")
        seen.add(node)


def dynamic_layout(policy: Policy, nodes: Iterable[str]) -> list[PartitionDef]:
    """The partitions of a dynamic policy over ``nodes`` (ha.md section 4).

    Partition ``i`` is ``<policy>.<i>``; its list starts at the i-th of the sorted
    nodes and takes the next ``replicas`` as sync replicas, then ``async_replicas``
    async ones (capped by the node count).  Deterministic: every node computes
    the same layout from the same node set.
    """
    names = sorted(set(nodes))
    if not names:
        raise DistributionError(f"policy {policy.name!r}: no nodes to lay partitions over")
    width = min(len(names), 1 + policy.replicas + policy.async_replicas)
    parts = []
    for i in range(policy.partitions):
        listed: list[tuple[str, str]] = []
        for k in range(width):
            style = SYNC if k <= policy.replicas else ASYNC
            listed.append((names[(i + k) % len(names)], style))
        parts.append(PartitionDef(f"{policy.name}.{i}", tuple(listed), policy.name))
    return parts


def resolve_mapper(binding: Binding) -> Mapper:
    """The mapper object of a binding; a spec that does not resolve names the type."""
    spec = binding.mapper
    where = f"binding of {binding.type_name}"
    if spec == HASH:
        try:
            return ConsistentHashMapper(binding.ring_size)
        except MapperError as exc:
            raise DistributionError(f"{where}: {exc}") from exc
    if spec == ROUND_ROBIN:
        return RoundRobinMapper()
    if isinstance(spec, str):
        module, _, attr = spec.partition(":")
        try:
            spec = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise DistributionError(
                f"{where}: mapper {binding.mapper!r} not found ({exc})"
            ) from exc
    if isinstance(spec, type):
        try:
            spec = spec()
        except Exception as exc:
            raise DistributionError(f"{where}: mapper {spec.__name__}() raised {exc!r}") from exc
    if not callable(getattr(spec, "partition_for", None)):
        raise DistributionError(
            f"{where}: {binding.mapper!r} has no partition_for(key, partitions)"
        )
    mapper: Mapper = spec
    return mapper


def check_mapper_spec(binding: Binding) -> None:
    """A mapper spec's shape, without importing anything (see :meth:`Distribution.validate`)."""
    spec = binding.mapper
    where = f"binding of {binding.type_name}"
    if spec == HASH:
        if not isinstance(binding.ring_size, int) or binding.ring_size < 1:
            raise DistributionError(f"{where}: ring_size must be >= 1, not {binding.ring_size!r}")
        return
    if spec == ROUND_ROBIN or not isinstance(spec, str):
        return
    module, colon, attr = spec.partition(":")
    if not colon or not module or not attr:
        raise DistributionError(
            f"{where}: mapper {spec!r} is not 'hash', 'round_robin' or 'module:Class'"
        )


@dataclass(slots=True)
class Distribution:
    """Policies and bindings of one cluster, validated together (module doc)."""

    policies: Mapping[str, Policy] = field(
        default_factory=lambda: {DEFAULT_POLICY: Policy(DEFAULT_POLICY)}
    )
    bindings: Mapping[str, Binding] = field(default_factory=dict)
    default_policy: str = DEFAULT_POLICY
    _mappers: dict[str, Mapper] = field(default_factory=dict)

    def validate(
        self, known_nodes: Iterable[str] | None = None, *, resolve_mappers: bool = True
    ) -> None:
        """Raise :class:`DistributionError` naming the first culprit (module doc).

        ``resolve_mappers=False`` checks a mapper spec's shape only (``hash``,
        ``round_robin`` or ``module:attr``) without importing application code: a
        configuration file is checked that way where it is read, and resolved in
        full when the node starts, after its application modules are loaded.
        """
        known = set(known_nodes) if known_nodes is not None else None
        for name, policy in self.policies.items():
            if name != policy.name:
                raise DistributionError(f"policy {policy.name!r} is registered as {name!r}")
            policy.check()
        if self.default_policy not in self.policies:
            raise DistributionError(f"the default policy {self.default_policy!r} is not defined")
        owner: dict[str, str] = {}
        for policy in self.policies.values():
            names = (
                [p.name for p in policy.static]
                if policy.kind == STATIC
                else [f"{policy.name}.{i}" for i in range(policy.partitions)]
            )
            for part in names:
                if part in owner:
                    raise DistributionError(
                        f"partition {part!r} is defined by policies {owner[part]!r} "
                        f"and {policy.name!r}"
                    )
                owner[part] = policy.name
            if known is not None:
                for part_def in policy.static:
                    for node in part_def.node_names():
                        if node not in known:
                            raise DistributionError(
                                f"policy {policy.name!r}, partition {part_def.name!r}: "
                                f"node {node!r} is not a node of the cluster {sorted(known)}"
                            )
        for type_name, binding in self.bindings.items():
            if binding.policy not in self.policies:
                raise DistributionError(
                    f"type {type_name} is bound to unknown policy {binding.policy!r} "
                    f"(policies: {sorted(self.policies)})"
                )
            if resolve_mappers:
                self._mappers[type_name] = resolve_mapper(binding)
            else:
                check_mapper_spec(binding)

    def layout(self, nodes: Iterable[str]) -> list[PartitionDef]:
        """Every partition of every policy, for the given nodes present."""
        present = sorted(set(nodes))
        parts: list[PartitionDef] = []
        for name in sorted(self.policies):
            policy = self.policies[name]
            parts += (
                list(policy.static) if policy.kind == STATIC else dynamic_layout(policy, present)
            )
        return parts

    def binding_for(self, cls: type) -> Binding:
        """The nearest binding in ``cls``'s MRO, else the default policy's hash mapper."""
        for klass in cls.__mro__:
            binding = self.bindings.get(klass.__name__)
            if binding is not None:
                return binding
        return Binding(cls.__name__, self.default_policy)

    def partitions_of(self, policy_name: str, nodes: Iterable[str]) -> list[str]:
        return [p.name for p in self.layout(nodes) if p.policy == policy_name]

    def partition_for(self, cls: type, key: Any, nodes: Iterable[str]) -> str:
        """The partition a new object of ``cls`` with unique key ``key`` goes to."""
        binding = self.binding_for(cls)
        mapper = self._mappers.get(binding.type_name)
        if mapper is None:
            mapper = self._mappers[binding.type_name] = resolve_mapper(binding)
        return map_object(mapper, cls.__name__, key, self.partitions_of(binding.policy, nodes))


def distribution_from_config(
    config: Mapping[str, Any],
    known_nodes: Iterable[str] | None = None,
    *,
    resolve_mappers: bool = True,
) -> Distribution:
    """A distribution from its TOML form (``[ha]`` table of the node configuration).

    ::

        [ha.policies.default]            # kind, partitions, replicas, async_replicas, batch
        partitions = 16
        [ha.policies.pinned]
        kind = "static"
        partitions_static = {p1 = [["A", "sync"], ["B", "sync"]]}
        [ha.bindings.Account]
        policy = "pinned"
        mapper = "hash"                  # or "round_robin", or "module:Class"
        ring_size = 4096
    """
    policies: dict[str, Policy] = {}
    raw_policies = config.get("policies", {DEFAULT_POLICY: {}})
    if not isinstance(raw_policies, Mapping):
        raise DistributionError("ha.policies must be a table")
    for name, raw in raw_policies.items():
        if not isinstance(raw, Mapping):
            raise DistributionError(f"policy {name!r} must be a table")
        unknown = set(raw) - {
            "kind",
            "partitions",
            "replicas",
            "async_replicas",
            "batch",
            "partitions_static",
        }
        if unknown:
            raise DistributionError(f"policy {name!r}: unknown settings {sorted(unknown)}")
        static = raw.get("partitions_static", {})
        if not isinstance(static, Mapping):
            raise DistributionError(f"policy {name!r}: partitions_static must be a table")
        parts = []
        for part, nodes in static.items():
            if not isinstance(nodes, list):
                raise DistributionError(f"partition {part!r}: the node list must be a list")
            check_node_list(part, nodes)
            parts.append(PartitionDef(part, tuple((n, s) for n, s in nodes), name))
        policies[name] = Policy(
            name,
            kind=raw.get("kind", STATIC if parts else DYNAMIC),
            partitions=raw.get("partitions", DEFAULT_PARTITIONS),
            replicas=raw.get("replicas", DEFAULT_REPLICAS),
            async_replicas=raw.get("async_replicas", 0),
            batch=raw.get("batch", DEFAULT_BATCH),
            static=tuple(parts),
        )
    bindings: dict[str, Binding] = {}
    raw_bindings = config.get("bindings", {})
    if not isinstance(raw_bindings, Mapping):
        raise DistributionError("ha.bindings must be a table")
    for type_name, raw in raw_bindings.items():
        if not isinstance(raw, Mapping):
            raise DistributionError(f"binding of {type_name} must be a table")
        bindings[type_name] = Binding(
            type_name,
            policy=raw.get("policy", DEFAULT_POLICY),
            mapper=raw.get("mapper", HASH),
            ring_size=raw.get("ring_size", DEFAULT_RING_SIZE),
        )
    default = config.get("default_policy", DEFAULT_POLICY)
    dist = Distribution(policies, bindings, default)
    dist.validate(known_nodes, resolve_mappers=resolve_mappers)
    return dist


__all__ = [
    "ASYNC",
    "DEFAULT_PARTITIONS",
    "DEFAULT_POLICY",
    "DYNAMIC",
    "STATIC",
    "SYNC",
    "Binding",
    "Distribution",
    "DistributionError",
    "PartitionDef",
    "Policy",
    "check_mapper_spec",
    "check_node_list",
    "distribution_from_config",
    "dynamic_layout",
    "resolve_mapper",
]
