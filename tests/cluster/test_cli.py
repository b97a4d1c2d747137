"""The ``nonstop`` command line against real processes (G1, G2)."""

from __future__ import annotations

import json
import os
import signal
import socket
import tomllib
from pathlib import Path

import pytest

import nonstop
from nonstop.node.config import from_mapping
from nonstop.node.datadir import DataDir, pid_alive
from tests.cluster.conftest import MACHINE, REAL_CLUSTER, kill_dir_nodes, run_cli, wait_until
from tests.distmodel import Account

pytestmark = pytest.mark.timeout(120)

FAST = [
    "--option",
    f"machine={json.dumps(MACHINE)}",
    "--option",
    "keepalive_interval=0.1",
    "--option",
    "nonresponse_timeout=0.5",
]


def test_local_up_status_partial_restart_down(folder: Path) -> None:
    code, out, err = run_cli("local", "up", "-n", "3", "--dir", str(folder), *FAST)
    assert code == 0, err
    assert "started: A, B, C" in out
    assert "Active" in out
    # A new local cluster routes by partition, one sync replica each (issue 10): the
    # default of every node configuration, which the one written does not override.
    node_config = from_mapping(tomllib.loads((folder / "A.toml").read_text()))
    assert node_config.ha.data == "partitions"

    code, out, err = run_cli("cluster", "status", "--json", "--dir", str(folder))
    assert code == 0, err
    status = json.loads(out)
    assert status["quorum"] == "Active"
    assert isinstance(status["view"], int)
    assert "leader" in status
    if REAL_CLUSTER:
        assert status["members"] == ["A", "B", "C"]
        assert set(status["live"]) <= {"A", "B", "C"}
        assert status["views"][-1]["id"] == status["view"]
        assert set(status["views"][-1]) == {"id", "members", "live"}
    nodes = {n["name"]: n for n in status["nodes"]}
    assert set(nodes) == {"A", "B", "C"}
    for n in nodes.values():
        assert set(n) >= {"name", "address", "state", "pid"}
        assert isinstance(n["pid"], int) and pid_alive(n["pid"])

    # table output names every node
    code, out, _ = run_cli("cluster", "status", "--dir", str(folder))
    assert code == 0 and all(f"\n{x} " in out for x in "ABC")
    if REAL_CLUSTER:
        assert "members A,B,C  live " in out

    # kill B; `local up` starts only B again, on its old data
    old_b = DataDir(folder / "B").running_pid()
    assert old_b is not None
    os.kill(old_b, signal.SIGKILL)
    wait_until(lambda: not pid_alive(old_b), 5, "B to die")
    code, out, err = run_cli("local", "up", "-n", "3", "--dir", str(folder), "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["quorum"] == "Active"
    new_b = DataDir(folder / "B").running_pid()
    assert new_b is not None and new_b != old_b

    # ask a specific node
    b_addr = next(n["address"] for n in status["nodes"] if n["name"] == "B")
    code, out, err = run_cli("cluster", "status", "--json", "--node", b_addr)
    assert code == 0, err
    assert json.loads(out)["name"] == "B"

    code, out, err = run_cli("local", "down", "--dir", str(folder))
    assert code == 0, err
    assert "stopped: A, B, C" in out
    for name in "ABC":
        assert DataDir(folder / name).running_pid() is None

    # status with nothing running: one line, non-zero
    code, out, err = run_cli("cluster", "status", "--dir", str(folder), "--timeout", "0.5")
    assert code == 1 and err.startswith("nonstop: error:") and err.count("\n") == 1
    assert "nonstop local up --dir" in err


def test_start_errors_are_one_line(folder: Path, tmp_path: Path) -> None:
    code, _, err = run_cli("local", "up", "-n", "2", "--dir", str(folder), *FAST)
    assert code == 0, err
    layout = json.loads((folder / "local.json").read_text())
    a_addr = layout["nodes"][0]["listen"]

    def start(*args: str) -> tuple[int, str]:
        code, _, err = run_cli("node", "start", "--detach", "--machine", MACHINE, *args, timeout=30)
        return code, err.strip()

    # port in use
    code, err = start("--name", "X", "--data", str(tmp_path / "x"), "--listen", a_addr)
    assert code != 0 and "port in use" in err and "\n" not in err, err

    # the data directory of a running node
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, err = start("--name", "A", "--data", str(folder / "A"), "--listen", f"127.0.0.1:{port}")
    assert code != 0 and "in use" in err and "\n" not in err, err

    # a data directory of another cluster
    code, _, err = run_cli("local", "down", "--dir", str(folder))
    assert code == 0, err
    code, err = start(
        "--name", "A", "--data", str(folder / "A"), "--cluster", "other",
        "--listen", f"127.0.0.1:{port}",
    )  # fmt: skip
    assert code != 0 and "belongs to cluster" in err and "\n" not in err, err

    # a node name already used by a running node of the cluster
    code, _, err = run_cli("local", "up", "-n", "2", "--dir", str(folder))
    assert code == 0, err
    cluster_id = layout["cluster"]
    code, err = start(
        "--name", "A", "--data", str(tmp_path / "a2"), "--cluster", cluster_id,
        "--listen", f"127.0.0.1:{port}", "--join", a_addr,
        "--secret-file", str(folder / "cluster.secret"),
    )  # fmt: skip
    assert code != 0 and "already" in err and "\n" not in err, err
    assert DataDir(tmp_path / "a2").running_pid() is None


def test_node_start_stop(tmp_path: Path) -> None:
    data = tmp_path / "solo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        code, out, err = run_cli(
            "node", "start", "--detach", "--name", "S", "--data", str(data),
            "--listen", f"127.0.0.1:{port}", "--members", "S", "--machine", MACHINE,
        )  # fmt: skip
        assert code == 0, err
        pid = DataDir(data).running_pid()
        assert pid is not None
        code, out, err = run_cli("cluster", "status", "--json", "--node", f"127.0.0.1:{port}")
        assert code == 0, err
        assert json.loads(out)["name"] == "S"
        code, out, err = run_cli("node", "stop", "--data", str(data))
        assert code == 0, err
        assert not pid_alive(pid)
        assert "stopped" in (data / "node.log").read_text()
    finally:
        kill_dir_nodes(tmp_path)


ROOT = Path(__file__).resolve().parents[2]


def one_line_error(err: str) -> str:
    assert err.startswith("nonstop: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def test_bad_input_is_one_line_with_the_fix(tmp_path: Path) -> None:
    folder = tmp_path / "none"
    code, _, err = run_cli(
        "local", "up", "--dir", str(folder), "--option", "lock_wiat=3", "--option",
        "rpc_timeout=abc",
    )  # fmt: skip
    assert code == 2 and "did you mean 'lock_wait'?" in one_line_error(err)
    assert "'rpc_timeout' must be a number, got 'abc'" in err
    assert not folder.exists()
    # outside a cluster folder: refuse with a hint instead of asking 127.0.0.1:7101
    code, _, err = run_cli("cluster", "status", "--dir", str(folder))
    assert code == 2 and "pass --node HOST:PORT" in one_line_error(err)
    code, _, err = run_cli("local", "stop", "A", "--dir", str(folder))
    assert code == 2 and "nonstop local up" in one_line_error(err)
    code, out, _ = run_cli("--help", timeout=30)
    assert code == 0 and "local" in out


def test_python_dash_m_nonstop() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "nonstop", "local", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "destroy" in proc.stdout


def test_local_and_membership_commands(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    d = ["--dir", str(folder)]
    code, out, err = run_cli("local", "up", "-n", "2", *d, *FAST, "--app", "tests.distmodel")
    assert code == 0, err
    layout = json.loads((folder / "local.json").read_text())
    assert f"cluster {layout['cluster']}" in out and 'connect: nonstop.connect("' in out

    # another layout asked of an existing folder: said, not silently ignored
    code, out, err = run_cli("local", "up", "-n", "3", "--base-port", "7101", *d)
    assert code == 0, err
    assert "-n 3 ignored" in err and "--base-port 7101 ignored" in err

    code, out, err = run_cli("local", "add", *d)
    assert code == 0 and "started: C" in out, err
    code, out, err = run_cli("cluster", "status", *d)
    assert code == 0, err
    assert f"cluster {layout['cluster']}  (addresses from {folder / 'local.json'})" in out
    assert "members A,B,C" in out and "MEMBER" in out
    c_addr = json.loads((folder / "local.json").read_text())["nodes"][2]["listen"]
    code, out, err = run_cli("cluster", "join", "C", c_addr, *d)
    assert code == 0 and "C is a member" in out, err

    # stop one node: no stale pid for it.  While B is down, A holds the last in-sync copy
    # of the partitions they share (routing by partition, the default): A is not removed
    # (the node asked refuses, naming them).  Start B again.
    addresses = ",".join(n["listen"] for n in layout["nodes"])
    with nonstop.connect(addresses) as c, c.transaction() as tx:
        tx.create(Account, number="A-1")
    code, out, err = run_cli("local", "stop", "B", *d)
    assert code == 0 and "stopped: B" in out, err

    def b_down() -> bool:
        # A's view first (in this process): the CLI's, a process start each, once it holds.
        with nonstop.Client([layout["nodes"][0]["listen"]], timeout=2, rounds=1) as a:
            if "B" in a.status()["live"]:
                return False
        code, out, _ = run_cli("cluster", "status", "--json", *d)
        b = next(n for n in json.loads(out)["nodes"] if n["name"] == "B")
        return code == 0 and b["state"] == "Down" and b["pid"] is None

    wait_until(b_down, 20, "B seen Down")
    code, _, err = run_cli("cluster", "remove", "A", *d)
    assert code == 1 and "A holds the last in-sync copy of" in one_line_error(err), err
    code, out, err = run_cli("local", "start", "B", *d)
    assert code == 0 and "started: B" in out, err

    # C leaves the membership, then leaves the folder
    code, out, err = run_cli("cluster", "leave", "--node", c_addr)
    assert code == 0 and "C removed" in out and "members A,B" in out, err
    code, out, err = run_cli("local", "remove", "C", *d)
    assert code == 0 and "removed: C" in out, err
    assert [n["name"] for n in json.loads((folder / "local.json").read_text())["nodes"]] == [
        "A",
        "B",
    ]
    assert not (folder / "C").exists()
    code, _, err = run_cli("local", "stop", "Z", *d)
    assert code == 2 and "has no node named 'Z'" in one_line_error(err)

    code, _, err = run_cli("local", "destroy", *d)
    assert code == 2 and "--yes" in one_line_error(err)
    code, out, err = run_cli("local", "destroy", "--yes", *d)
    assert code == 0, err
    assert not folder.exists()


def test_failed_up_stops_what_it_started(folder: Path) -> None:
    code, _, err = run_cli("local", "up", "-n", "2", "--dir", str(folder), *FAST)
    assert code == 0, err
    code, _, err = run_cli("local", "down", "--dir", str(folder))
    assert code == 0, err
    b_port = int(
        json.loads((folder / "local.json").read_text())["nodes"][1]["listen"].split(":")[1]
    )
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", b_port))
        squatter.listen()
        code, _, err = run_cli("local", "up", "--dir", str(folder))
    assert code == 1 and "node B" in one_line_error(err) and "stopped again: A" in err
    assert DataDir(folder / "A").running_pid() is None
