"""Where a unique key is unique once a node's store holds several partitions (issue 10).

A node's store keeps one index per unique key for every object it holds, of
every partition (active ones and replicas): a unique value is unique in the
whole store.  That is right exactly when a value can live in one partition
only, which the binding decides:

* mapper ``hash`` (the default): the partition is a hash of the type's unique
  key, so equal values map to one partition, and a value is unique across the
  cluster (that partition's active node checks it, its replicas hold it);
* the application's own mapper: it is given the same unique key, and must map
  equal values alike (ha.md §4) — the same holds;
* ``round_robin``: creates are spread whatever their key, so one value could be
  created in two partitions on two nodes, and a node holding both (one active,
  one replica) could not apply the second: replication would fail on data;
* a type with two unique keys: the mapper routes by one of them, the other
  could again be in two partitions.

So :func:`check_unique_scope` refuses the last two at bind time, naming the type and
the key, instead of keeping unique indexes per partition (which would let one
"unique" value exist twice in the cluster and make every unique lookup probe
every partition held).  A binding to a single partition is always accepted.
"""

from __future__ import annotations

from nonstop.errors import SchemaError
from nonstop.model.managed import TypeInfo

KEYED_MAPPERS = frozenset({"hash"})
"""Built-in mappers that route by the unique key (an application mapper does too, ha.md §4)."""
SPREADING_MAPPERS = frozenset({"round_robin"})
"""Built-in mappers that ignore the key."""


def unique_key_names(info: TypeInfo) -> list[str]:
    """The unique keys of ``info`` (its own and inherited), in declaration order."""
    return [name for name, key in info.keys.items() if key.options.unique]


def check_unique_scope(info: TypeInfo, mapper: str, partitions: int) -> None:
    """SchemaError unless every unique value of ``info`` can live in one partition only when
    it is bound to ``mapper`` ("hash", "round_robin", or anything else for the
    application's own) over ``partitions`` partitions (module doc)."""
    unique = unique_key_names(info)
    if partitions <= 1 or not unique:
        return
    if mapper in SPREADING_MAPPERS:
        raise SchemaError(
            f"{info.name} has the unique key {info.name}.{unique[0]}, and a {mapper!r} binding "
            "spreads its objects whatever their key, so one value could be created in two "
            "partitions: bind it with mapper 'hash' (by its unique key) or drop unique=True"
        )
    if len(unique) > 1:
        raise SchemaError(
            f"{info.name} has {len(unique)} unique keys ({', '.join(unique)}); a partition "
            "mapper routes by one, so the others could repeat across partitions: keep one "
            "unique key (make the others non-unique) or bind the type to a single partition"
        )


__all__ = ["KEYED_MAPPERS", "SPREADING_MAPPERS", "check_unique_scope", "unique_key_names"]
