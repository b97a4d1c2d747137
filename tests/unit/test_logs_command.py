"""``nonstop logs`` on synthetic files: merge order, filters, JSON output, following."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from nonstop.admin.cli import cli
from nonstop.admin.cmd_logs import Follower
from nonstop.admin.local import LocalCluster
from nonstop.node.log_events import LogFilter, merged_logs, parse_when, read_events


def line(node: str, second: float, level: str = "INFO", message: str = "m", **extra: object) -> str:
    moment = datetime.datetime(2026, 1, 2, 3, 4, 0, tzinfo=datetime.UTC) + datetime.timedelta(
        seconds=second
    )
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    event = {"time": stamp, "node": node, "level": level, "logger": "nonstop.t", "message": message}
    return json.dumps({**event, **extra}) + "\n"


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Path:
    """A local cluster folder of three nodes whose logs interleave in time."""
    lc = LocalCluster(tmp_path)
    layout = lc.create(3, 7000)
    files = lc.log_files(layout)
    for path in files.values():
        path.parent.mkdir(parents=True)
    files["A"].write_text(
        line("A", 0, message="a0") + line("A", 3, "WARNING", "a3") + line("A", 6, message="a6")
    )
    files["B"].write_text(line("B", 1, message="b1") + line("B", 4, "ERROR", "b4", view=2))
    files["C"].write_text(line("C", 2, "DEBUG", "c2") + line("C", 5, message="c5"))
    return tmp_path


def run(*args: str) -> list[str]:
    result = CliRunner().invoke(cli, ["logs", *args])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def messages(out: list[str]) -> list[str]:
    return [json.loads(o)["message"] for o in out]


def test_merged_in_time_order(cluster_dir: Path) -> None:
    out = run("--dir", str(cluster_dir), "--json")
    assert messages(out) == ["a0", "b1", "c2", "a3", "b4", "c5", "a6"]
    assert json.loads(out[4])["view"] == 2, "structured fields are kept"


def test_text_output_names_node_and_level(cluster_dir: Path) -> None:
    out = run("--dir", str(cluster_dir))
    assert len(out) == 7
    assert " B    ERROR   nonstop.t: b4" in out[4]


def test_filters(cluster_dir: Path) -> None:
    d = str(cluster_dir)
    assert messages(run("--dir", d, "--json", "--node", "B")) == ["b1", "b4"]
    assert messages(run("--dir", d, "--json", "--node", "A", "--node", "C")) == [
        "a0",
        "c2",
        "a3",
        "c5",
        "a6",
    ]
    assert messages(run("--dir", d, "--json", "--level", "warning")) == ["a3", "b4"]
    assert messages(run("--dir", d, "--json", "--level", "info", "--node", "C")) == ["c5"]
    since, until = "2026-01-02T03:04:02Z", "2026-01-02T03:04:04Z"
    assert messages(run("--dir", d, "--json", "--since", since, "--until", until)) == [
        "c2",
        "a3",
        "b4",
    ]


def test_given_files_and_text_lines(tmp_path: Path) -> None:
    (tmp_path / "X").mkdir()
    (tmp_path / "X" / "node.log").write_text(
        "2026-01-02 03:04:01,000 INFO X nonstop.node: started\n"
        "2026-01-02 03:04:03,000 ERROR X nonstop.node: failed\n"
        "Traceback (most recent call last):\n"
        "ValueError: boom\n"
    )
    (tmp_path / "y.log").write_text(line("Y", 0, message="y0") + line("Y", 10**7, message="late"))
    out = run(str(tmp_path / "X" / "node.log"), str(tmp_path / "y.log"), "--json")
    events = [json.loads(o) for o in out]
    assert [e["message"] for e in events] == ["y0", "started", "failed", "late"]
    failed = next(e for e in events if e["message"] == "failed")
    assert failed["node"] == "X" and "ValueError: boom" in failed["exc"]
    assert run(str(tmp_path / "X" / "node.log"), "--node", "X", "--level", "error", "--json")


def test_bad_arguments_are_one_line_usage_errors(cluster_dir: Path) -> None:
    for args in (["--since", "yesterday-ish"], ["--node", "Z"]):
        result = CliRunner().invoke(cli, ["logs", "--dir", str(cluster_dir), *args])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("nonstop: error:")
    empty = CliRunner().invoke(cli, ["logs", "--dir", str(cluster_dir / "none")])
    assert empty.exit_code == 2


def test_durations_count_back_from_now() -> None:
    assert parse_when("15m", now=10_000.0) == 10_000.0 - 900
    assert parse_when("2h", now=10_000.0) == 10_000.0 - 7200
    assert (
        parse_when("2026-01-02T03:04:00Z")
        == datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC).timestamp()
    )


def test_follower_reads_whole_appended_lines_in_time_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(line("A", 0, message="old"))
    follower = Follower({"A": a, "B": b}, LogFilter())
    try:
        assert [e.message for e in follower.poll()] == ["old"]
        assert follower.poll() == []
        with open(a, "a") as fa, open(b, "a") as fb:
            fb.write(line("B", 2, message="b2"))
            fa.write(line("A", 1, message="a1"))
            half = line("A", 3, message="a3")
            fa.write(half[:10])
        assert [e.message for e in follower.poll()] == ["a1", "b2"]
        with open(a, "a") as fa:
            fa.write(half[10:])
        assert [e.message for e in follower.poll()] == ["a3"]
    finally:
        follower.close()


def test_a_missing_log_gives_no_events(tmp_path: Path) -> None:
    events = list(merged_logs({"A": tmp_path / "nope.log"}, LogFilter()))
    assert events == []
    assert list(read_events(["not a log line\n"])) == []


def test_follow_prints_what_is_appended(tmp_path: Path) -> None:
    """``nonstop logs -f`` as a process: the old events, then one appended after it started."""
    log = tmp_path / "A" / "node.log"
    log.parent.mkdir()
    log.write_text(line("A", 0, message="before"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nonstop.admin.cli", "logs", "-f", "--json", str(log)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["message"] == "before"
        time.sleep(0.3)
        with open(log, "a") as fh:
            fh.write(line("A", 1, message="after"))
        assert json.loads(proc.stdout.readline())["message"] == "after"
    finally:
        proc.terminate()
        proc.wait(10)
