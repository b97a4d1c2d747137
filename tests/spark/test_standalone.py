"""The data source on a real Spark standalone cluster, not only ``local[*]`` (issue 12).

A master and two workers are started from the installed pyspark distribution
(``bin/spark-class``) on 127.0.0.1, each a process of its own with one core;
a job in a process of its own (``session_job.py``) creates its session on
``spark://...`` with nothing of nonstop imported, writes, reads and reads with
pushdown against a ``nonstop pipeline serve`` endpoint: the executors run the
source in their own Python workers.  Every JVM of it runs with the tests' options
(``TEST_JVM_OPTIONS``: the quick compiler only, one GC thread; a third less CPU), set as
an operator sets them: ``SPARK_DAEMON_JAVA_OPTS`` and the job's ``spark-defaults.conf``.

It runs in ``make test`` (issue 12 asks for it there; a master and two workers
cost about 35 s).  The same job on ``local[1]`` (test_session_setup.py) is in
``make test-long``: this test asserts everything it does, on a real cluster.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_JVM_OPTIONS
from tests.spark.conftest import ROOT, free_port
from tests.spark.test_session_setup import run_job

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"
WORKER_SIZE = ("--cores", "1", "--memory", "768m")


def _no_ui() -> list[str]:
    return ["--webui-port", str(free_port())]


def _spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


def _wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYSPARK_PYTHON"] = sys.executable  # the workers' Python: where nonstop is
    env["SPARK_LOG_DIR"] = str(tmp_path)
    env["SPARK_NO_DAEMONIZE"] = "1"
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    env["SPARK_DAEMON_JAVA_OPTS"] = TEST_JVM_OPTIONS  # the master's and workers' JVMs
    port = free_port()
    master = f"spark://127.0.0.1:{port}"
    cmd = [str(_spark_class())]
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        log = open(tmp_path / "master.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [*cmd, MASTER, "--host", "127.0.0.1", "--port", str(port), *_no_ui()],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        assert _wait_port(port, 90), (tmp_path / "master.log").read_text()[-2000:]
        for i in range(2):
            log = open(tmp_path / f"worker{i}.log", "wb")  # noqa: SIM115
            logs.append(log)
            work = tmp_path / f"work{i}"
            work.mkdir()
            args = [WORKER, "--host", "127.0.0.1", *WORKER_SIZE, "--work-dir", str(work)]
            procs.append(
                subprocess.Popen(
                    [*cmd, *args, *_no_ui(), master],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both workers registered with the master
            text = (tmp_path / "master.log").read_text(errors="replace")
            if text.count("Registering worker") >= 2:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the workers did not register: " + text[-2000:])
        yield master
    finally:
        for p in procs:  # only the processes this fixture started, by their handle
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for log in logs:
            log.close()


def test_the_data_source_on_a_spark_standalone_cluster(
    standalone: str, endpoints: Any, tmp_path: Path
) -> None:
    (ep,) = endpoints(1)
    # The driver's and executors' JVMs as the tests' own (conftest.TEST_JVM_OPTIONS), set
    # where a cluster's operator sets them: spark-defaults.conf, not the job.
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.driver.extraJavaOptions {TEST_JVM_OPTIONS}\n"
        f"spark.executor.extraJavaOptions {TEST_JVM_OPTIONS}\n"
    )
    out = run_job(
        standalone,
        ep.address,
        venv_on_path=True,
        pyspark_python=True,
        extra_env={"SPARK_CONF_DIR": str(conf)},
    )
    assert out["executors"] == 2  # one executor on each worker
    assert out["nonstop_imported"] is False  # found by discovery, nothing registered
    assert out["count"] == 100 and out["qty7"] == [7]
    assert out["pushed"] == out["unpushed"] == [10, 11, 12]
    # Pushdown off: Spark evaluates the comparisons; on: the source took them.
    assert "BatchScan nonstop" in out["plan_off"] and ">= 10" in out["plan_off"], out["plan_off"]
    assert "BatchScan nonstop" in out["plan"] and ">= 10" not in out["plan"], out["plan"]
