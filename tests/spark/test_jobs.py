"""The pipeline jobs (J3): load, export, import, audit — as functions and from the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nonstop.bulk.handlers import decode_rows, encode_rows
from nonstop.client.bulk import BulkClient
from nonstop.errors import SchemaError
from nonstop.spark import jobs
from tests.spark.conftest import cluster_of

ITEM = "pipe.Item"


def table(address: str) -> dict[str, tuple[Any, ...]]:
    with BulkClient(address) as c:
        reply = c.call("bulk.scan", type=ITEM, fields=["sku", "qty", "price", "day", "label"])
    cols = decode_rows(reply["rows"], "columns")
    return {
        s: (q, p, d, lb)
        for s, q, p, d, lb in zip(
            cols["sku"], cols["qty"], cols["price"], cols["day"], cols["label"], strict=True
        )
    }


def test_load_each_format(spark: Any, endpoints: Any, tmp_path: Path) -> None:
    eps = endpoints(2)
    cluster = cluster_of(eps)
    csv = tmp_path / "items.csv"
    csv.write_text(
        "sku,qty,price,day\n" + "".join(f"c{i},{i},{i}.5,2024-01-0{i % 9 + 1}\n" for i in range(50))
    )
    jl = tmp_path / "items.jsonl"
    jl.write_text(
        "".join(json.dumps({"sku": f"j{i}", "qty": i, "label": "json"}) + "\n" for i in range(30))
    )
    pq = tmp_path / "items.parquet"
    spark.createDataFrame([(f"p{i}", i) for i in range(20)], "sku string, qty int").write.parquet(
        str(pq)
    )
    steps: list[str] = []
    assert jobs.load(spark, cluster, ITEM, str(csv), progress=steps.append)["rows"] == 50
    assert jobs.load(spark, cluster, ITEM, str(jl))["rows"] == 30
    assert jobs.load(spark, cluster, ITEM, str(pq), fmt="parquet")["rows"] == 20
    assert steps and steps[0].startswith("reading csv")
    got = {**table(eps[0].address), **table(eps[1].address)}
    assert len(got) == 100
    import datetime as dt

    assert got["c7"] == (7, 7.5, dt.date(2024, 1, 8), None)
    assert got["j3"] == (3, 0.0, None, "json") and got["p19"][0] == 19
    bad = tmp_path / "bad.csv"
    bad.write_text("sku,colour\nx,red\n")
    with pytest.raises(SchemaError, match="colour"):
        jobs.load(spark, cluster, ITEM, str(bad))
    with pytest.raises(Exception, match="format"):
        jobs.load(spark, cluster, ITEM, str(tmp_path / "items.xml"))


def test_export_import_equal_and_audit_finds_differences(
    spark: Any, endpoints: Any, tmp_path: Path
) -> None:
    (a,) = endpoints(1)  # two separate one-node "clusters"
    (b,) = endpoints(1)
    rows = [(f"s{i:04}", i, i / 4) for i in range(1000)]
    df = spark.createDataFrame(rows, "sku string, qty long, price double")
    df.write.format("nonstop").option("cluster", a.address).option("type", ITEM).mode(
        "append"
    ).save()
    out = tmp_path / "export"
    report = jobs.export(spark, a.address, ITEM, str(out))
    assert report["rows"] == 1000
    meta = json.loads((out / jobs.EXPORT_META).read_text())
    assert meta["type"] == ITEM and meta["nodes"]["n1"]["count"] == 1000
    assert meta["nodes"]["n1"]["snapshot"] > 0
    assert jobs.import_(spark, b.address, ITEM, str(out))["rows"] == 1000
    assert table(b.address) == table(a.address)
    assert jobs.audit(spark, str(out), b.address, ITEM, key="sku")["equal"]
    same = jobs.audit(spark, a.address, b.address, ITEM)
    assert same["equal"] and same["left_rows"] == same["right_rows"] == 1000
    # Inject differences: two changed objects and one extra on b, one extra on a.
    with BulkClient(b.address) as cl:
        changed = {"sku": ["s0005", "s0500"], "qty": [-5, 501], "price": [1.5, 125.0]}
        cl.call("bulk.upsert", type=ITEM, rows=encode_rows(changed))
        cl.call("bulk.upsert", type=ITEM, rows=encode_rows({"sku": ["extra"]}))
    with BulkClient(a.address) as cl:
        cl.call("bulk.upsert", type=ITEM, rows=encode_rows({"sku": ["mine"]}))
    diff = jobs.audit(spark, a.address, b.address, ITEM)
    assert not diff["equal"] and diff["key"] == "sku"
    assert (diff["only_left"], diff["only_right"], diff["different"]) == (1, 1, 2)
    assert diff["samples"]["only_left"] == ["mine"]
    assert diff["samples"]["only_right"] == ["extra"]
    assert diff["samples"]["different"] == [("s0005", ["qty", "price"]), ("s0500", ["qty"])]
    with pytest.raises(SchemaError, match=r"is an export of pipe\.Item, not of pipe\.Owner"):
        jobs.import_(spark, b.address, "pipe.Owner", str(out))


def cli(*args: str) -> Any:
    """Run ``nonstop pipeline ...`` in-process: it uses the tests' active Spark session."""
    from click.testing import CliRunner

    from nonstop.admin.cli import cli as nonstop_cli

    return CliRunner().invoke(nonstop_cli, ["pipeline", *args], catch_exceptions=False)


def test_cli_load_and_audit(spark: Any, endpoints: Any, tmp_path: Path) -> None:
    a, b = endpoints(2)
    csv = tmp_path / "in.csv"
    csv.write_text("sku,qty\n" + "".join(f"k{i},{i}\n" for i in range(40)))
    done = cli("load", "--cluster", a.address, "--type", ITEM, str(csv), "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 40
    assert "writing 40 rows into pipe.Item" in done.stderr  # the progress display
    assert len(table(a.address)) + len(table(b.address)) == 40
    with BulkClient(b.address) as cl:
        cl.call("bulk.upsert", type=ITEM, rows=encode_rows({"sku": ["zz"], "qty": [1]}))
    audit = cli("audit", "--type", ITEM, "--json", f"{a.address}#n1", f"{a.address}#n2")
    assert audit.exit_code == 2, audit.stderr  # they differ
    report = json.loads(audit.stdout)
    assert report["only_left"] == len(table(a.address))
    assert report["only_right"] == len(table(b.address))
    out = tmp_path / "exp"
    assert cli("export", "--cluster", a.address, "--type", ITEM, str(out)).exit_code == 0
    again = cli("audit", "--type", ITEM, str(out), a.address)
    assert again.exit_code == 0 and "equal: True" in again.stdout
    bad = cli("load", "--cluster", a.address, "--type", "no.Such", str(csv))
    assert bad.exit_code == 1 and "UnknownType" in bad.stderr and "no.Such" in bad.stderr
    assert "Spark" not in bad.stderr  # checked before Spark is used
    dead = cli("export", "--cluster", "127.0.0.1:1", "--type", ITEM, str(tmp_path / "x"))
    assert dead.exit_code == 1 and "Unavailable" in dead.stderr
    wrong = tmp_path / "wrong.csv"
    wrong.write_text("sku,qty\nw1,notanumber\n")
    failed = cli("load", "--cluster", a.address, "--type", ITEM, str(wrong))
    assert failed.exit_code == 1 and "nonstop: error:" in failed.stderr
