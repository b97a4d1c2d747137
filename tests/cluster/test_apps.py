"""Application modules (F2): ``--app`` on ``node start`` and ``local up``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from nonstop.client import Client
from nonstop.node.apps import AppLoadError, load_apps, parse_apps
from nonstop.node.config import ConfigError, from_mapping
from tests.cluster.conftest import MACHINE, free_port, kill_dir_nodes

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def cli(*args: str, pythonpath: list[str] | None = None) -> tuple[int, str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *(pythonpath or [])])
    proc = subprocess.run(
        [sys.executable, "-m", "nonstop.admin.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    try:
        yield tmp_path
    finally:
        kill_dir_nodes(tmp_path)


def test_parse_and_load_in_process() -> None:
    assert parse_apps("a.b, c ,a.b,") == ["a.b", "c"]
    assert parse_apps(["x"]) == ["x"]
    assert parse_apps(None) == []
    assert [m.__name__ for m in load_apps(["tests.distmodel"])] == ["tests.distmodel"]
    with pytest.raises(AppLoadError, match=r"'no_such_mod_xyz'.*ModuleNotFoundError"):
        load_apps(["no_such_mod_xyz"])
    with pytest.raises(AppLoadError, match="not a dotted module name"):
        load_apps(["../etc"])
    assert from_mapping({"app": "tests.distmodel"}).app == ["tests.distmodel"]
    with pytest.raises(ConfigError):
        from_mapping({"app": [1]})


def test_node_start_with_a_broken_app_is_a_one_line_error(folder: Path) -> None:
    (folder / "brokenapp.py").write_text("raise RuntimeError('boom at import')\n")
    base = [
        "node",
        "start",
        "--name",
        "A",
        "--data",
        str(folder / "A"),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--members",
        "A",
        "--machine",
        MACHINE,
    ]
    code, _, err = cli(*base, "--app", "brokenapp", pythonpath=[str(folder)])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert lines[-1].startswith("nonstop: error: cannot load application module 'brokenapp'")
    assert "RuntimeError: boom at import" in lines[-1]
    assert not any("Traceback" in line for line in lines)
    code, _, err = cli(*base, "--app", "tests.distmodel", "--app", "missing_mod_q")
    assert code == 1 and "'missing_mod_q'" in err, err
    # Nothing was started, so nothing listens and no pid file is left behind.
    assert not (folder / "A" / "node.pid").exists()


def test_local_up_with_app_loads_it_on_every_node(folder: Path) -> None:
    local = folder / "local"
    code, _, err = cli(
        "local",
        "up",
        "-n",
        "2",
        "--dir",
        str(local),
        "--app",
        "tests.distmodel",
        "--option",
        f"machine={json.dumps(MACHINE)}",
        "--timeout",
        "40",
    )
    assert code == 0, err
    assert tomllib.loads((local / "A.toml").read_text())["app"] == ["tests.distmodel"]
    layout = json.loads((local / "local.json").read_text())
    for node in layout["nodes"]:
        with Client([node["listen"]], timeout=10) as c:
            types = c.request({"op": "types"})["types"]
            assert types["dist.Account"]["version"] == 1
    code, _, err = cli("local", "down", "--dir", str(local))
    assert code == 0, err
