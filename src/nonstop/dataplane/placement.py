"""Which partition a new object or a unique key belongs to (routing by partition, ha.md §9a).

The data plane routes by partition when its configuration has a
:class:`Placement` (the node's ``ha.data = "partitions"``): a reference's
location code names its partition, and a unique key or a create is placed by
the type's binding and mapper.  The machine stays pure: it hands the placement
a type name and a *routing key* (the unique key's value, packed by
:func:`routing_key`, so that a lookup and a create compute the same bytes on
every node) and gets a partition name back.

:class:`BindingPlacement` is the node's: the ``[ha]`` distribution's bindings
(``ha/policies.py``) over the managed types this process defines.  The
simulator passes its own (anything with these two methods).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from nonstop import errors
from nonstop.ha.mapper import ConsistentHashMapper, Mapper, MapperError, map_object
from nonstop.ha.policies import STATIC, Distribution, DistributionError, resolve_mapper
from nonstop.model.codec import pack
from nonstop.model.managed import TypeInfo, registered_type, type_info
from nonstop.tx.unique_scope import check_unique_scope, unique_key_names

SYNC_REPLICATION_OF_DATA = True
"""Whether a partition's writes reach its replicas (ha.md §5): yes since issue 10,
session 6 (replication.md §10d).  A node with ``ha.data = "partitions"`` and a policy with
replicas replicates each partition to its sync replicas (``node/replicated.py``);
``[ha] replicate_data = false`` turns it off, and such a node refuses policies with
replicas again (``node/config.replicas_refusal``: a failover would promote a node
without the data)."""


class Placement(Protocol):
    """Where objects of a type go (module doc)."""

    def partition_for(self, type_name: str, key: bytes | None) -> str:
        """The partition of an object of ``type_name`` with routing key ``key`` (None: the
        type has no unique key, the binding's mapper decides)."""
        ...

    def unique_field(self, type_name: str) -> str | None:
        """The unique key field a type is placed by, or None."""
        ...


def routing_key(value: Any) -> bytes:
    """The bytes a unique key value is placed by: the same for a lookup and a create."""
    return pack(value)


class BindingPlacement:
    """The node's placement: bindings and mappers of the ``[ha]`` distribution (module doc).

    A policy's partitions are its names (``<policy>.<i>`` for a dynamic one, the
    static list's otherwise): the same on every node, whichever nodes hold them.
    """

    def __init__(self, distribution: Distribution) -> None:
        self.distribution = distribution
        self._unique: dict[str, str | None] = {}
        self._mappers: dict[str, tuple[Mapper, list[str]]] = {}

    def partitions_of(self, policy_name: str) -> list[str]:
        policy = self.distribution.policies[policy_name]
        if policy.kind == STATIC:
            return [part.name for part in policy.static]
        return [f"{policy.name}.{i}" for i in range(policy.partitions)]

    def _info(self, type_name: str) -> TypeInfo:
        cls = registered_type(type_name)
        if cls is None:
            raise errors.UnknownType(f"managed type {type_name!r} is not defined on this node")
        return type_info(cls)

    def partition_for(self, type_name: str, key: bytes | None) -> str:
        bound = self._mappers.get(type_name)
        try:
            if bound is None:
                binding = self.distribution.binding_for(self._info(type_name).cls)
                bound = (resolve_mapper(binding), self.partitions_of(binding.policy))
                self._mappers[type_name] = bound
            return map_object(bound[0], type_name, key, bound[1])
        except (MapperError, DistributionError) as exc:
            raise errors.BadArgument(str(exc)) from None

    def partitions_for(self, type_name: str, keys: list[bytes]) -> list[str]:
        """``[partition_for(type_name, k) for k in keys]``; in one pass for the built-in
        consistent hash (a bulk batch's thousands of keys), key by key for any other
        mapper (each answer checked by ``map_object``)."""
        if not keys:
            return []
        first = self.partition_for(type_name, keys[0])  # (binds the type's mapper)
        mapper, partitions = self._mappers[type_name]
        if type(mapper) is not ConsistentHashMapper:
            return [first, *(self.partition_for(type_name, k) for k in keys[1:])]
        return mapper.partitions_for(keys, partitions)

    def unique_field(self, type_name: str) -> str | None:
        if type_name not in self._unique:
            names = unique_key_names(self._info(type_name))
            self._unique[type_name] = names[0] if names else None
        return self._unique[type_name]

    def check_bindings(self, infos: Iterable[TypeInfo]) -> None:
        """SchemaError naming the type if a binding could put one unique value in two
        partitions (``tx/unique_scope.py``); called at node start for every managed type."""
        for info in infos:
            binding = self.distribution.binding_for(info.cls)
            count = len(self.partitions_of(binding.policy))
            check_unique_scope(info, binding.mapper, count)


__all__ = [
    "SYNC_REPLICATION_OF_DATA",
    "BindingPlacement",
    "Placement",
    "routing_key",
]
