"""Fixtures of the pipeline tests: bulk endpoints.

Their Spark session is ``spark`` of tests/conftest.py: ONE for the whole run,
whichever folder a test that asks for it is in.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Endpoint:
    """A bulk server child process on one store directory."""

    def __init__(self, data: Path, name: str, port: int, peers: list[tuple[str, int]]) -> None:
        self.data, self.name, self.port = data, name, port
        self.address = f"127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "nonstop.bulk.server", "--data", str(data)]
        cmd += ["--listen", self.address, "--name", name, "--app", "tests.spark.model"]
        cmd += ["--durability", "none"]
        for peer, pport in peers:
            cmd += ["--peer", f"{peer}@127.0.0.1:{pport}"]
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *paths])}
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("listening"):
            self.proc.kill()
            raise RuntimeError(f"bulk server did not start: {line!r} {self.proc.stderr.read()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def endpoints(tmp_path: Path) -> Iterator[Callable[[int], list[Endpoint]]]:
    """``endpoints(n)``: n bulk servers that announce each other as one cluster."""
    started: list[Endpoint] = []

    def start(n: int) -> list[Endpoint]:
        ports = [free_port() for _ in range(n)]
        names = [f"n{i + 1}" for i in range(n)]
        for i in range(n):
            peers = [(names[j], ports[j]) for j in range(n) if j != i]
            data = tmp_path / f"{names[i]}-{len(started)}"
            started.append(Endpoint(data, names[i], ports[i], peers))
        return started[-n:]

    yield start
    for e in started:
        e.stop()


def cluster_of(eps: list[Any]) -> str:
    return ",".join(e.address for e in eps)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
