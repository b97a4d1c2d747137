"""PySpark's discovery hook for the ``nonstop`` data source (zero setup).

PySpark 4 registers, in every session, the ``DefaultSource`` of each installed
top-level module named ``pyspark_<name>`` (``pyspark/sql/worker/
lookup_data_sources.py``).  This module is that one for nonstop, so
``spark.read.format("nonstop")`` and ``df.write.format("nonstop")`` work in a
session created before, or without, any import of nonstop.
``nonstop.spark.register(session)`` keeps working (it registers the same
source by name, replacing this one in that session).

Filter pushdown: Spark plans a Python data source's read in one of two worker
entry points, depending on ``spark.sql.python.filterPushdown.enabled``, and
refuses, when the setting is off, a reader that implements ``pushFilters``.
A statically registered source cannot read the session's settings, so
:class:`DefaultSource` gives the pushdown-capable reader only when Spark asks
from its pushdown entry point, and the plain one otherwise.
"""

from __future__ import annotations

import sys

from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.types import StructType

from nonstop.spark.source import NAME, NonstopDataSource, NonstopFilteringDataSource

PUSHDOWN_WORKER = "pyspark.sql.worker.data_source_pushdown_filters"
"""The module of Spark's Python worker that plans a read with filter pushdown."""


def _planning_with_pushdown() -> bool:
    """Whether Spark's filter-pushdown worker is the caller (on the call stack)."""
    frame = sys._getframe(1)
    while frame is not None:
        g = frame.f_globals
        spec = g.get("__spec__")
        if g.get("__name__") == PUSHDOWN_WORKER or getattr(spec, "name", None) == PUSHDOWN_WORKER:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class DefaultSource(NonstopFilteringDataSource):
    """The ``nonstop`` data source as PySpark discovers it (module doc)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def reader(self, schema: StructType) -> DataSourceReader:
        if _planning_with_pushdown():
            return super().reader(schema)
        return NonstopDataSource.reader(self, schema)


__all__ = ["DefaultSource"]
