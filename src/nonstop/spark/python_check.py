"""Which Python Spark's workers run, and whether it can run the data source.

Spark runs the data source (planning, reads, writes) in Python worker
processes started with ``spark.pyspark.python``, else the ``PYSPARK_PYTHON``
its JVM was started with, else ``python3`` from ``PATH``.  A script run as
``.venv/bin/python job.py`` without the virtualenv on ``PATH`` thus gets
workers that cannot import nonstop, and every read fails deep in a Py4J trace
with ``No module named 'nonstop'``.  So:

* importing :mod:`nonstop.spark` sets ``PYSPARK_PYTHON`` to this interpreter
  when it is not set (:func:`default_worker_python`): a session created after
  the import starts its workers with it;
* :func:`check_worker_python` (called by ``register`` and the jobs) fails at
  once, with the setting to change, when a session's workers would run an
  interpreter that cannot import nonstop.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from typing import Any

from nonstop.errors import BadArgument

CONF = "spark.pyspark.python"
ENV = "PYSPARK_PYTHON"
DRIVER_CONF = "spark.pyspark.driver.python"
DRIVER_ENV = "PYSPARK_DRIVER_PYTHON"


class WorkerPythonError(BadArgument):
    """Spark's Python workers would run an interpreter that cannot import nonstop."""


def default_worker_python() -> None:
    """Make Spark sessions started from now on run their workers with this interpreter,
    unless the user chose one (``PYSPARK_PYTHON`` already set)."""
    os.environ.setdefault(ENV, sys.executable)


def worker_python(spark: Any, *, driver: bool = False) -> str:
    """The Python command the session's workers run, as Spark chooses it: the
    executors' (``driver=False``) or the driver's, which plans data source reads
    and writes (``spark.pyspark.driver.python`` / ``PYSPARK_DRIVER_PYTHON`` first)."""
    conf = spark.sparkContext.getConf()
    names = [(DRIVER_CONF, DRIVER_ENV)] if driver else []
    names.append((CONF, ENV))
    for key, _ in names:
        chosen = conf.get(key, None)
        if chosen:
            return str(chosen)
    for _, var in names:
        try:  # the JVM's environment, fixed when it started
            env = spark.sparkContext._jvm.java.lang.System.getenv(var)
        except Exception:  # pragma: no cover - no JVM gateway (Spark Connect)
            env = os.environ.get(var)
        if env:
            return str(env)
    return "python3"


@lru_cache(maxsize=16)
def _can_import_nonstop(command: str) -> str | None:
    """None if ``command`` imports nonstop and pyarrow; else why not (one line)."""
    path = shutil.which(command)
    if path is None:
        return f"{command!r} is not found on PATH"
    if os.path.realpath(path) == os.path.realpath(sys.executable):
        return None
    probe = "import nonstop.spark.source"
    try:
        done = subprocess.run([path, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} does not run: {exc}"
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    return f"{path} cannot import nonstop ({last})"


def check_worker_python(spark: Any) -> None:
    """Raise :class:`WorkerPythonError` naming what to set when the workers of a local
    session would not be able to run the data source.  (On a cluster the workers'
    Python is the cluster's: not checked here.)"""
    master = str(spark.sparkContext.master)
    if not master.startswith("local"):
        return
    for command in sorted({worker_python(spark), worker_python(spark, driver=True)}):
        _refuse(command)


def _refuse(command: str) -> None:
    why = _can_import_nonstop(command)
    if why is not None:
        raise WorkerPythonError(
            f"Spark's Python workers run {why}: set {ENV}={sys.executable} before the "
            f"SparkSession starts (or .config({CONF!r}, sys.executable) on its builder), "
            "or import nonstop.spark before creating the session (it sets it)"
        )


__all__ = [
    "WorkerPythonError",
    "check_worker_python",
    "default_worker_python",
    "worker_python",
]
