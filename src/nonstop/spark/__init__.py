"""nonstop on Spark: the ``nonstop`` PySpark data source and the pipeline jobs.

::

    import nonstop.spark                      # registers "nonstop" in the active session
    df = (spark.read.format("nonstop")
            .option("cluster", "127.0.0.1:7101,127.0.0.1:7102")
            .option("type", "bank.model.Account").load())

Nothing needs to be called in PySpark 4: the installed ``pyspark_nonstop``
module makes every session find the source (zero setup).  Importing this
module also sets ``PYSPARK_PYTHON`` to the running interpreter when unset, so
a session created afterwards runs its Python workers where nonstop is
installed (:mod:`nonstop.spark.python_check`).  See ``docs/pipeline.md`` for the
options and the guarantees of each write mode.
"""

from __future__ import annotations

from typing import Any

from nonstop.spark.python_check import check_worker_python, default_worker_python
from nonstop.spark.source import NAME, NonstopDataSource, NonstopFilteringDataSource

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
"""The Spark setting under which key equality and range filters reach the nodes."""


def register(spark: Any) -> None:
    """Register the ``nonstop`` data source in ``spark`` (a SparkSession).

    With ``spark.sql.python.filterPushdown.enabled=true`` the registered source
    pushes comparisons of a field with a constant down to the nodes; without
    it, the plain source is registered (Spark refuses a pushdown-capable reader
    when the setting is off).  Fails at once (:class:`~nonstop.spark.python_check.
    WorkerPythonError`, naming what to set) if the session's Python workers
    cannot import nonstop.
    """
    check_worker_python(spark)
    enabled = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    spark.dataSource.register(NonstopFilteringDataSource if enabled else NonstopDataSource)


def _register_active() -> None:
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    except Exception:  # pragma: no cover - pyspark without a JVM
        return
    if session is not None:
        register(session)


default_worker_python()
_register_active()

__all__ = ["NAME", "PUSHDOWN_CONF", "NonstopDataSource", "register"]
