"""The cluster demo (``python -m nonstop.demos.cluster``) as a newcomer runs it, made small.

Without Spark (``--no-spark``: the Spark steps are the pipeline tests' business), a
few thousand accounts and a few seconds of transfers: the demo must report OK with
the node kill and restart in between, and leave no node process behind — also
when it is interrupted with Ctrl-C in the middle of the transfers; nodes left by a
demo that was SIGKILLed are stopped by the next demo in the same folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import child_env


def demo(folder: Path, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "nonstop.demos.cluster", "--no-spark", "--dir", str(folder)),
            *("--accounts", "3000", "--seconds", str(seconds), "--tasks", "8"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(),
        # Ctrl-C reaches a process whose SIGINT is not ignored (a background job's is).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def node_processes(folder: Path) -> list[str]:
    """Command lines of live processes started with a config under ``folder``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(folder) in cmd and "node start" in cmd:
            found.append(cmd)
    return found


def wait_for_transfers(proc: subprocess.Popen[str]) -> str:
    """Read the demo's output until its transfers run."""
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    seen = ""
    while "loaded 3,000 accounts" not in seen:
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, seen
        seen += line
    return seen


def test_demo_reports_ok_and_leaves_nothing_running(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    # A demo killed outright cannot stop its nodes; the next one in the folder does.
    first = demo(folder, seconds=60)
    wait_for_transfers(first)
    first.kill()
    first.wait(10)
    assert len(node_processes(folder)) == 3
    proc = demo(folder, seconds=5)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert "stopped 3 node(s) left running by an earlier demo" in out
    assert "OK: total conserved across 3 nodes" in out
    # Read through a pipe, as in a log file: no progress-bar frames, plain lines instead.
    assert "\r" not in out
    assert "transfers: " in out and " tx in " in out
    # The summary leads with what was checked and held, not with the errors seen.
    assert "failed with an error" not in out
    checked = out.index("checked after the crash and restart:")
    assert "held: total balance conserved" in out[checked:]
    assert "held: every acknowledged transfer recorded exactly once" in out[checked:]
    assert "outcome-unknown transfers applied at most once" in out[checked:]
    assert "FAILED" not in out
    assert "SIGKILL node B" in out and "node B restarted on its data" in out
    assert "in doubt per node after the stop: {'A': 0, 'B': 0, 'C': 0}" in out
    assert (folder / "export" / "accounts.parquet").exists()
    assert node_processes(folder) == []


def test_demo_interrupted_stops_the_cluster(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    proc = demo(folder, seconds=60)
    seen = wait_for_transfers(proc)
    assert len(node_processes(folder)) == 3
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, seen + out
    assert "interrupted: stopping the cluster" in out
    assert node_processes(folder) == []
