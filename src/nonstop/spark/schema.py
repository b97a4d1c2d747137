"""Managed types as Spark schemas, and the data source's options.

Field kinds map to Spark types as the Arrow columns of :mod:`nonstop.bulk.handlers`
do: bool → boolean, int → bigint, float → double, str → string, bytes →
binary, datetime → timestamp (UTC instants), date → date, Decimal →
decimal(38, 18), a reference → string (``"<location>-<timestamp>-<counter>"``).
Lists, dicts and ``Any`` have no Spark column here: a type with such a field
is readable only with that field left out (option ``exclude``), and the error
says so.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from nonstop.bulk.handlers import DECIMAL_PRECISION, DECIMAL_SCALE, REF_COLUMN
from nonstop.errors import BadArgument, SchemaError

SPARK_TYPES: dict[str, DataType] = {
    "bool": BooleanType(),
    "int": LongType(),
    "float": DoubleType(),
    "str": StringType(),
    "bytes": BinaryType(),
    "datetime": TimestampType(),
    "date": DateType(),
    "decimal": DecimalType(DECIMAL_PRECISION, DECIMAL_SCALE),
    "ref": StringType(),
}

# Spark column types a DataFrame may write into a field of each kind (narrower
# numbers widen; anything else is a schema mismatch reported before any task runs).
_WRITABLE: dict[str, tuple[type, ...]] = {
    "bool": (BooleanType,),
    "int": (LongType, IntegerType, ShortType, ByteType),
    "float": (DoubleType, FloatType, LongType, IntegerType, ShortType, ByteType),
    "str": (StringType,),
    "bytes": (BinaryType,),
    "datetime": (TimestampType, TimestampNTZType),
    "date": (DateType,),
    "decimal": (DecimalType, LongType, IntegerType),
    "ref": (StringType,),
}

DEFAULT_SPLITS = 2
DEFAULT_BATCH_ROWS = 10_000


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


@dataclass(slots=True)
class Options:
    """The data source options (``.option(name, value)``), parsed and checked."""

    cluster: str
    type: str
    splits: int = DEFAULT_SPLITS
    fields: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    refs: bool = False
    key: str | None = None
    batch_rows: int = DEFAULT_BATCH_ROWS
    stream: str | None = None
    cluster_id: str = ""
    nodes: list[str] = field(default_factory=list)
    credentials: str | None = None
    """A credentials file every Spark worker can read (default: ``$NONSTOP_CREDENTIALS``)."""

    @classmethod
    def parse(cls, options: Any) -> Options:
        opts = {str(k).lower(): str(v) for k, v in dict(options).items()}
        cluster = opts.get("cluster", "")
        type_name = opts.get("type", "")
        if not cluster:
            raise BadArgument(
                "the nonstop data source needs option 'cluster' (node addresses 'host:port,...')"
            )
        if not type_name:
            raise BadArgument("the nonstop data source needs option 'type' (a managed type name)")
        for module in _csv(opts.get("app")):
            importlib.import_module(module)  # the user's types, if the job needs them locally
        try:
            splits = int(opts.get("splits", DEFAULT_SPLITS))
            batch_rows = int(opts.get("batchrows", opts.get("batch", DEFAULT_BATCH_ROWS)))
        except ValueError:
            raise BadArgument("options 'splits' and 'batch' must be integers") from None
        if splits < 1 or batch_rows < 1:
            raise BadArgument("options 'splits' and 'batch' must be >= 1")
        return cls(
            cluster=cluster,
            type=type_name,
            splits=splits,
            fields=_csv(opts.get("fields")),
            exclude=_csv(opts.get("exclude")),
            refs=opts.get("refs", "false").lower() in ("1", "true", "yes"),
            key=opts.get("key") or None,
            batch_rows=batch_rows,
            stream=opts.get("stream") or None,
            cluster_id=opts.get("clusterid", ""),
            nodes=_csv(opts.get("nodes")),
            credentials=opts.get("credentials") or None,
        )


def columns(opts: Options, type_schema: dict[str, Any]) -> list[str]:
    """The columns a read returns: ``fields`` (or every field) minus ``exclude``, (+ ``_ref``)."""
    fields: dict[str, list[Any]] = type_schema["fields"]
    name = type_schema["name"]
    unknown = [f for f in [*opts.fields, *opts.exclude] if f not in fields and f != REF_COLUMN]
    if unknown:
        raise SchemaError(
            f"{name} has no field(s) {', '.join(unknown)} (fields: {', '.join(fields)})"
        )
    chosen = opts.fields or list(fields)
    chosen = [f for f in chosen if f not in opts.exclude]
    if opts.refs and REF_COLUMN not in chosen:
        chosen.append(REF_COLUMN)
    bad = [f for f in chosen if f != REF_COLUMN and fields[f][0] not in SPARK_TYPES]
    if bad:
        kinds = ", ".join(f"{f} ({fields[f][0]})" for f in bad)
        raise SchemaError(
            f"{name} field(s) {kinds} have no Spark column type; leave them out with "
            f".option('exclude', '{','.join(bad)}')"
        )
    return chosen


def spark_schema(type_schema: dict[str, Any], cols: list[str]) -> StructType:
    """The Spark schema of the chosen columns; key fields are not nullable."""
    fields = type_schema["fields"]
    out = []
    for c in cols:
        if c == REF_COLUMN:
            out.append(StructField(c, StringType(), False))
            continue
        kind, optional = fields[c]
        out.append(StructField(c, SPARK_TYPES[kind], bool(optional) or c not in _keys(type_schema)))
    return StructType(out)


def _keys(type_schema: dict[str, Any]) -> set[str]:
    return set(type_schema.get("unique", []))


def check_writable(type_schema: dict[str, Any], df_schema: StructType, key: str) -> None:
    """A DataFrame's schema against the type: clear errors before any task runs."""
    fields = type_schema["fields"]
    name = type_schema["name"]
    problems = []
    for f in df_schema.fields:
        if f.name == REF_COLUMN:
            problems.append(f"column {REF_COLUMN} is read-only (leave it out of writes)")
        elif f.name not in fields:
            problems.append(f"column {f.name!r} is not a field of {name}")
        else:
            kind = fields[f.name][0]
            allowed = _WRITABLE.get(kind)
            if allowed is None:
                problems.append(f"field {f.name!r} ({kind}) cannot be written from Spark")
            elif not isinstance(f.dataType, allowed):
                problems.append(
                    f"column {f.name!r} is {f.dataType.simpleString()}, field {name}.{f.name} "
                    f"is {kind} (Spark {SPARK_TYPES[kind].simpleString()})"
                )
    if key not in df_schema.fieldNames():
        problems.append(f"the DataFrame has no column {key!r}, the unique key of {name}")
    if problems:
        raise SchemaError(f"schema mismatch writing to {name}: " + "; ".join(problems))


def write_key(opts: Options, type_schema: dict[str, Any]) -> str:
    """The unique key writes upsert by: option ``key``, else the type's first unique key."""
    uniques = type_schema.get("unique", [])
    if opts.key is not None:
        if opts.key not in uniques:
            raise SchemaError(
                f"{type_schema['name']}.{opts.key} is not a unique key "
                f"(unique keys: {', '.join(uniques) or '(none)'})"
            )
        return opts.key
    if not uniques:
        raise SchemaError(f"{type_schema['name']} has no unique key: Spark writes upsert by one")
    return str(uniques[0])
