"""Fixtures shared by every folder of tests (the store, the bank, the one Spark session)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nonstop

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # child processes and `import tests.bankmodel`
    sys.path.insert(0, str(ROOT))


def _test_credentials() -> None:
    """One admin credential for every local cluster the tests create (G5).

    ``nonstop local up`` (``LocalCluster``) makes ``$NONSTOP_CREDENTIALS`` the admin
    of a new cluster, and every client -- in this process, in the CLI and node
    processes the tests start, in Spark's workers -- proves it by default: tests
    connect as an operator would after ``export NONSTOP_CREDENTIALS=...``.
    """
    if os.environ.get("NONSTOP_CREDENTIALS"):
        return
    import atexit
    import shutil
    import tempfile

    from nonstop.client.credentials import new_password, write_credentials

    folder = tempfile.mkdtemp(prefix="nonstop-test-cred.")
    path = Path(folder) / "credentials.json"
    write_credentials(path, "admin", new_password())
    os.environ["NONSTOP_CREDENTIALS"] = str(path)
    atexit.register(shutil.rmtree, folder, True)


_test_credentials()


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The tests' JVMs (the one Spark session's driver, the standalone cluster's daemons and
executors): the quick compiler only and one GC thread.  The tests' jobs are short, so the
optimizing compiler and a concurrent collector cost more CPU than they save: on
tests/spark/test_jobs.py 30 % less CPU (130 s -> 91 s), on tests/spark/test_standalone.py
33 % (128 s -> 85 s; session 11, CPU of every process of the run).  Nothing a test asserts
depends on them."""


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """ONE Spark session for the whole run (each costs a JVM and seconds to start):
    every test that asks for ``spark``, in any folder, gets this one.

    ``local[2,3]``: two cores and up to three attempts per task, so a test can make a
    task fail on its first attempt and watch Spark retry it.  Spark starts only if a
    test asks for it.  Tests of how a user's session is made start their own, in a
    process of their own (tests/spark/test_session_setup.py).
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("nonstop-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", TEST_JVM_OPTIONS)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    import nonstop.spark

    nonstop.spark.register(session)
    yield session
    session.stop()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def db(store_dir: Path) -> Iterator[nonstop.Database]:
    """A fresh database (fsync durability, short lock timeout so a hang fails fast)."""
    database = nonstop.open(store_dir, lock_timeout=20.0)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def bank(db: nonstop.Database) -> tuple[nonstop.Database, list[str]]:
    from tests.bankmodel import account_numbers, open_accounts

    numbers = account_numbers(6)
    open_accounts(db, numbers)
    return db, numbers


def child_env() -> dict[str, str]:
    """Environment for a child Python process that must import ``tests.*`` and ``nonstop``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_threads(n: int, target: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """Run ``target(i)`` in ``n`` threads; re-raise the first exception; return results."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker thread hung"
    if errors:
        raise errors[0]
    return results


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests on a fresh event loop (no asyncio plugin needed)."""
    import asyncio
    import inspect

    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(pyfuncitem.obj(**kwargs))
    return True
