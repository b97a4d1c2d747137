"""Local clusters give every node a metrics port on 127.0.0.1, and the status shows it."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner

from nonstop.admin.local import LocalCluster
from nonstop.admin.output import emit_status


def test_an_older_folder_gets_metrics_ports_when_its_nodes_start(tmp_path: Path) -> None:
    lc = LocalCluster(tmp_path)
    layout = lc.create(2, 7300)
    assert all(entry["metrics"].startswith("127.0.0.1:") for entry in layout["nodes"])
    for entry in layout["nodes"]:
        del entry["metrics"]  # as written before there were metrics endpoints
    lc.save(layout)
    old = lc.load()
    assert old is not None and lc.metrics_addresses(old) == {}
    node = lc.node(old, "A")
    lc.write_config(old, node)
    assert node.metrics is not None
    assert f'listen = "{node.metrics}"' in node.config.read_text()
    again = lc.load()
    assert again is not None and lc.metrics_addresses(again) == {"A": node.metrics}


def test_status_table_and_json_show_the_metrics_addresses() -> None:
    status = {
        "name": "A",
        "view": 1,
        "quorum": "Active",
        "leader": "A",
        "term": 1,
        "nodes": [
            {"name": "A", "address": "127.0.0.1:1", "state": "Self", "pid": 10, "member": True},
            {"name": "B", "address": "127.0.0.1:2", "state": "Up", "pid": 11, "member": True},
        ],
    }
    metrics = {"A": "127.0.0.1:9101"}

    def run(as_json: bool) -> str:

        @click.command()
        def show() -> None:
            emit_status(status, as_json, metrics=metrics)

        result = CliRunner().invoke(show)
        assert result.exit_code == 0, result.output
        return result.output

    table = run(False).splitlines()
    header = next(line for line in table if line.startswith("NAME"))
    assert header.split()[-1] == "METRICS"
    assert next(line for line in table if line.startswith("A ")).split()[-1] == "127.0.0.1:9101"
    assert next(line for line in table if line.startswith("B ")).split()[-1] == "-"
    rows = {n["name"]: n for n in json.loads(run(True))["nodes"]}
    assert rows["A"]["metrics"] == "127.0.0.1:9101" and "metrics" not in rows["B"]
