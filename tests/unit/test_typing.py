"""A user's code is type-checked against nonstop's annotations (issue 13: a typed API).

``tests/typing/user_app.py`` is what a newcomer writes from the README; it must
pass ``mypy --strict`` with no error.  ``tests/typing/wrong_calls.py`` holds
deliberately wrong calls, each marked ``# expect-error``; mypy must report an
error on exactly those lines, which proves the annotations carry information
(``transactional`` keeps the signature, ``key()``/``field()`` their types).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy", reason="mypy is a dev dependency (pip install -e '.[dev]')")

TYPING = Path(__file__).resolve().parents[1] / "typing"


def _mypy(target: Path, cache: Path) -> tuple[int, str]:
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--hide-error-context",
            "--cache-dir",
            str(cache),
            "--config-file",
            os.devnull,
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the module's runs, new each test run: the second run reuses
    what the first learned of nonstop's own modules instead of checking them again."""
    return tmp_path_factory.mktemp("mypy") / "cache"


def test_user_script_passes_mypy_strict(cache: Path) -> None:
    code, out = _mypy(TYPING / "user_app.py", cache)
    assert code == 0, f"mypy --strict found errors in the user script:\n{out}"
    assert "error" not in out


def test_wrong_calls_are_reported_on_their_lines(cache: Path) -> None:
    source = TYPING / "wrong_calls.py"
    expected = {
        n
        for n, line in enumerate(source.read_text().splitlines(), start=1)
        if line.rstrip().endswith("# expect-error")
    }
    code, out = _mypy(source, cache)
    assert code == 1, out
    reported = {
        int(line.split(":")[1])
        for line in out.splitlines()  # mypy may print the path relative to the cwd
        if line.split(":")[0].endswith(source.name) and ": error:" in line
    }
    assert expected, "the wrong-calls file marks no line"
    assert reported == expected, f"expected errors on lines {sorted(expected)}:\n{out}"
