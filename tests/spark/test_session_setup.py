"""A user's Spark script, however the session and Python were set up (issue 12).

Each test runs ``session_job.py`` in a process of its own (its own Spark
session: the shared one of the other tests has the source registered already)
against one ``nonstop pipeline serve`` endpoint.  Each costs a JVM and a session
(about 20 s), so all three are in ``make test-long``.  ``make test`` covers them
otherwise: the session made first with nothing imported runs there on a Spark
standalone cluster (test_standalone.py, the same job and assertions), and the
refusal of workers that cannot import nonstop on a stand-in session
(tests/unit/test_spark_worker_python.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import ROOT

JOB = Path(__file__).with_name("session_job.py")


def run_job(
    mode: str,
    cluster: str,
    *,
    venv_on_path: bool,
    pyspark_python: bool = False,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run session_job.py MODE CLUSTER; ``extra_env``: variables added to its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env.update(extra_env or {})
    if pyspark_python:  # as documented for a Spark cluster
        env["PYSPARK_PYTHON"] = sys.executable
    plain = "/usr/local/bin:/usr/bin:/bin"
    if venv_on_path:  # as from a shell where the virtualenv is activated
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), plain])
    else:  # as `.venv/bin/python job.py` from a plain shell
        env["PATH"] = plain
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT)])
    done = subprocess.run(
        [sys.executable, str(JOB), mode, cluster],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.long  # make test runs the same job on a standalone cluster (test_standalone.py)
def test_a_session_made_first_with_nothing_imported_reads_and_writes(endpoints: Any) -> None:
    (ep,) = endpoints(1)
    out = run_job("zero", ep.address, venv_on_path=True)
    assert out["nonstop_imported"] is False  # the driver never imported nonstop
    assert out["count"] == 100 and out["qty7"] == [7]
    assert out["pushed"] == out["unpushed"] == [10, 11, 12]
    # Pushdown off: Spark evaluates the comparisons; on: the source took them
    # (the nodes evaluate them) and they are gone from Spark's plan.
    assert "BatchScan nonstop" in out["plan_off"] and ">= 10" in out["plan_off"], out["plan_off"]
    assert "BatchScan nonstop" in out["plan"] and ">= 10" not in out["plan"], out["plan"]


@pytest.mark.long  # a Spark session of its own (about 20 s): in make test-long
def test_a_script_run_by_the_venv_python_without_the_venv_on_path(endpoints: Any) -> None:
    (ep,) = endpoints(1)
    out = run_job("import-first", ep.address, venv_on_path=False)
    assert out["count"] == 100 and out["pushed"] == [10, 11, 12]


@pytest.mark.long  # a JVM of its own; make test checks the same refusal on a stand-in
# session (tests/unit/test_spark_worker_python.py)
def test_a_session_whose_workers_cannot_import_nonstop_fails_at_once(endpoints: Any) -> None:
    (ep,) = endpoints(1)
    out = run_job("session-first", ep.address, venv_on_path=False)
    assert out["error"] == "WorkerPythonError", out
    assert f"set PYSPARK_PYTHON={sys.executable}" in out["message"], out["message"]
    assert "cannot import nonstop" in out["message"], out["message"]
