"""Which Python Spark's workers run, and the one-line refusal when it cannot import
nonstop (spark/python_check.py, issue 12), on a stand-in for a session: the same
check as ``tests/spark/test_session_setup.py`` makes in a real session of its own
(``make test-long``), without a JVM."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from nonstop.spark import python_check
from nonstop.spark.python_check import WorkerPythonError, check_worker_python, worker_python


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class Jvm:
    """The JVM's environment, fixed when it started (``System.getenv``)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.java = self
        self.lang = self
        self.System = self
        self.env = env

    def getenv(self, name: str) -> str | None:
        return self.env.get(name)


class Context:
    def __init__(self, master: str, conf: dict[str, str], jvm_env: dict[str, str]) -> None:
        self.master = master
        self._conf = Conf(conf)
        self._jvm = Jvm(jvm_env)

    def getConf(self) -> Conf:
        return self._conf


class Session:
    def __init__(
        self, master: str = "local[1]", conf: dict[str, str] | None = None, **jvm_env: str
    ) -> None:
        self.sparkContext = Context(master, conf or {}, jvm_env)


@pytest.fixture(autouse=True)
def fresh_probe_cache() -> None:
    python_check._can_import_nonstop.cache_clear()


def test_the_workers_python_is_chosen_as_spark_chooses_it() -> None:
    assert worker_python(Session()) == "python3"  # nothing set: python3 from PATH
    assert worker_python(Session(PYSPARK_PYTHON="/opt/py")) == "/opt/py"
    chosen = Session(conf={"spark.pyspark.python": "/conf/py"}, PYSPARK_PYTHON="/opt/py")
    assert worker_python(chosen) == "/conf/py"  # the session's conf first
    driver = Session(PYSPARK_PYTHON="/opt/py", PYSPARK_DRIVER_PYTHON="/drv/py")
    assert worker_python(driver, driver=True) == "/drv/py"
    assert worker_python(driver) == "/opt/py"


def test_a_session_whose_workers_cannot_import_nonstop_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As `.venv/bin/python job.py` from a plain shell: python3 on PATH is not this one.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(WorkerPythonError) as refused:
        check_worker_python(Session())
    message = str(refused.value)
    assert f"set PYSPARK_PYTHON={sys.executable}" in message, message
    assert "cannot import nonstop" in message or "not found on PATH" in message, message
    assert "\n" not in message


def test_this_interpreter_passes_and_a_missing_one_is_named() -> None:
    check_worker_python(Session(PYSPARK_PYTHON=sys.executable))  # no error
    with pytest.raises(WorkerPythonError, match="'/no/such/python' is not found on PATH"):
        check_worker_python(Session(PYSPARK_PYTHON="/no/such/python"))


def test_a_spark_cluster_is_not_checked_here() -> None:
    check_worker_python(Session(master="spark://127.0.0.1:7077", PYSPARK_PYTHON="/no/such"))
