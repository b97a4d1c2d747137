"""Demo output reads well in a log file (issue 13): no carriage-return frames in a pipe.

The cluster demo's pipe test is in e2e/test_demo_cluster.py (it needs a cluster);
here the progress reporter and the embedded demo, both through a pipe.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from tests.conftest import child_env

from nonstop.demos.progress import Progress


def test_progress_writes_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()  # not a TTY, like a pipe or a log file
    with Progress("transfers", "tx", 10, every=0.0, stream=out) as bar:
        bar.update(4)
        bar.write("  ... a message")
        bar.update(6)
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("  transfers: 4 of 10 tx in ")
    assert lines[1] == "  ... a message"
    assert lines[-1].startswith("  transfers: 10 of 10 tx in ")


def test_disabled_progress_prints_only_messages() -> None:
    out = io.StringIO()
    bar = Progress("transfers", "tx", enabled=False, every=0.0, stream=out)
    bar.update(3)
    bar.write("hello")
    bar.close()
    assert out.getvalue() == "hello\n"


def test_embedded_demo_through_a_pipe(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "nonstop.demos.embedded"),
            *("--accounts", "400", "--transfers", "300", "--dir", str(tmp_path / "demo")),
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\r" not in done.stdout + done.stderr
    assert "OK: total conserved" in done.stdout
    assert "creating accounts: 400 of 400 acct" in done.stdout
