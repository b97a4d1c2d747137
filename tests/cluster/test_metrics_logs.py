"""Metrics and logs of real nodes (G6): a Prometheus scrape, JSON log lines, ``nonstop logs``.

One 3-node local cluster serves the module.  The scrapes are parsed with the
client library's own parser (``prometheus_client.parser``); the counts are
checked exactly where the test alone drives them (commits through node A).
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import nonstop
import tests.distmodel  # noqa: F401  (the types the nodes load with --app)
from nonstop.admin.cli import cli
from nonstop.client.credentials import load_credentials
from nonstop.node.log_format import REQUIRED_FIELDS
from tests.cluster.conftest import Procs, app_cluster, run_cli, wait_until
from tests.distmodel import Account
from tests.prometheus_samples import families, value

NAMES = ["A", "B", "C"]

FAMILIES = {
    # transactions
    "nonstop_transactions_committed",
    "nonstop_transactions_aborted",
    "nonstop_transactions_active",
    "nonstop_commit_latency_seconds",
    # locks
    "nonstop_lock_waits",
    "nonstop_lock_timeouts",
    "nonstop_lock_deadlock_victims",
    "nonstop_lock_waiting_transactions",
    # group commit
    "nonstop_group_commit_batches",
    "nonstop_group_commit_write_sets",
    "nonstop_group_commit_batch_size",
    "nonstop_group_commit_write_seconds",
    # cluster log, failure detector, quorum
    "nonstop_cluster_log_term",
    "nonstop_cluster_log_commit_index",
    "nonstop_cluster_log_applied_index",
    "nonstop_cluster_log_applied_entries",
    "nonstop_cluster_log_snapshots",
    "nonstop_cluster_log_leader",
    "nonstop_cluster_log_role",
    "nonstop_cluster_peers",
    "nonstop_cluster_peer_transitions",
    "nonstop_cluster_quorum_state",
    # data service
    "nonstop_data_branches",
    "nonstop_data_client_connections",
    "nonstop_data_request_errors",
    "nonstop_data_session_ops",
    # the library's process collector
    "process_cpu_seconds",
    "process_resident_memory_bytes",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    options = {"app": ["tests.distmodel"], "lock_wait": 0.5, "nonresponse_timeout": 2.0}
    with app_cluster(tmp_path_factory.mktemp("metrics"), 3, options) as procs:
        yield procs


def basic_auth(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def get_metrics(cluster: Procs, name: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """Status and body of a scrape of node ``name`` with ``headers``."""
    address = cluster.nodes[name].metrics
    assert address is not None and address.startswith("127.0.0.1:")
    request = urllib.request.Request(f"http://{address}/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        assert exc.code != 401 or exc.headers["WWW-Authenticate"] == 'Basic realm="nonstop"'
        return exc.code, exc.read()


def scrape(cluster: Procs, name: str) -> dict[str, Any]:
    """A scrape with the cluster folder's admin credential (credentials.json)."""
    admin = load_credentials(cluster.lc.credentials_path)
    status, body = get_metrics(cluster, name, basic_auth(admin.user, admin.password))
    assert status == 200
    return families(body.decode())


def test_a_scrape_needs_a_user_allowed_status(cluster: Procs, tmp_path: Path) -> None:
    admin = load_credentials(cluster.lc.credentials_path)
    assert get_metrics(cluster, "A", {})[0] == 401
    assert get_metrics(cluster, "A", basic_auth(admin.user, "wrong"))[0] == 401
    creds = tmp_path / "watch.json"
    node = ["--node", cluster.address("A")]
    code, _, err = run_cli("user", "add", "watch", "--role", "monitor", "--out", str(creds), *node)
    assert code == 0, err
    watch = load_credentials(creds)
    wait_until(
        lambda: get_metrics(cluster, "B", basic_auth(watch.user, watch.password))[0] == 200,
        10,
        "the monitor user scrapes B",
    )
    code, _, err = run_cli("user", "roles", "watch", "--role", "reports", *node)
    assert code == 0, err
    wait_until(
        lambda: get_metrics(cluster, "B", basic_auth(watch.user, watch.password))[0] == 403,
        10,
        "a user without status is refused",
    )
    log = (cluster.nodes["B"].data / "node.log").read_text()
    assert "refused a scrape for watch@127.0.0.1" in log


def test_every_node_serves_the_named_families(cluster: Procs) -> None:
    for name in NAMES:
        families = scrape(cluster, name)
        missing = FAMILIES - set(families)
        assert not missing, f"node {name} lacks {sorted(missing)}"
        assert value(families, "nonstop_cluster_peers", state="Up") == 2
        assert value(families, "nonstop_cluster_quorum_state", state="Active") == 1
        assert value(families, "nonstop_cluster_log_term") >= 1
        assert value(families, "nonstop_cluster_log_applied_index") >= 1
        leaders = [s.labels["leader"] for s in families["nonstop_cluster_log_leader"].samples]
        assert len(leaders) == 1 and leaders[0] in NAMES
        up = value(families, "nonstop_cluster_peer_transitions", old="InUpNotifier", new="Up")
        assert up == 2, "each peer went Up once"


def test_commits_through_a_node_move_its_counters_by_exactly_n(cluster: Procs) -> None:
    n = 12
    before = scrape(cluster, "A")
    with nonstop.connect(cluster.address("A")) as db:
        for i in range(n):
            with db.transaction() as tx:
                tx.create(Account, number=f"metrics-{i}", owner="m", balance=i)
    after = scrape(cluster, "A")

    def grew(family: str, sample: str = "", **labels: str) -> float:
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    assert grew("nonstop_transactions_committed") == n
    latency = "nonstop_commit_latency_seconds"
    assert grew(latency, latency + "_count") == n
    assert grew(latency, latency + "_bucket", le="+Inf") == n
    assert value(after, latency, latency + "_sum") > 0
    assert grew("nonstop_data_session_ops") >= n
    assert grew("nonstop_group_commit_write_sets") >= 1
    assert grew("nonstop_group_commit_batches") >= 1
    assert value(after, "nonstop_transactions_active") == 0


def test_a_lock_timeout_is_counted(cluster: Procs) -> None:
    with nonstop.connect(cluster.address("A")) as db, db.transaction() as tx:
        tx.create(Account, number="metrics-lock", owner="m", balance=0)
    # Counted where it happens: the lock waits on the active node of the object's
    # partition (any node under routing by partition), the error where the client is.
    before = [scrape(cluster, name) for name in NAMES]
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with nonstop.connect(cluster.address("A")) as db, db.transaction() as tx:
            tx.get(Account, number="metrics-lock", lock="write")
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(10)
        with (
            pytest.raises(nonstop.LockTimeout),
            nonstop.connect(cluster.address("A")) as db,
            db.transaction() as tx,
        ):
            tx.get(Account, number="metrics-lock", lock="write")
    finally:
        release.set()
        thread.join(10)
    after = [scrape(cluster, name) for name in NAMES]

    def increase(metric: str) -> float:
        return sum(value(a, metric) - value(b, metric) for a, b in zip(after, before, strict=True))

    assert increase("nonstop_lock_waits") >= 1
    assert increase("nonstop_lock_timeouts") >= 1
    errors = "nonstop_data_request_errors"
    assert value(after[NAMES.index("A")], errors, kind="LockTimeout") >= 1


def test_node_logs_are_json_lines_with_the_required_fields(cluster: Procs) -> None:
    for name in NAMES:
        lines = (cluster.nodes[name].data / "node.log").read_text().splitlines()
        assert len(lines) > 5
        events = [json.loads(line) for line in lines]
        for event in events:
            assert set(REQUIRED_FIELDS) <= set(event), event
            assert event["node"] == name
        notes = [e for e in events if e["logger"] == "nonstop.notify"]
        assert notes and all(isinstance(e["notify"], dict) for e in notes), "structured field"
        assert any("metrics at http://" in e["message"] for e in events)


def test_nonstop_logs_merges_the_cluster_by_time(cluster: Procs) -> None:
    folder = str(cluster.lc.dir)
    result = CliRunner().invoke(cli, ["logs", "--dir", folder, "--json"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.output.splitlines()]
    assert {e["node"] for e in events} == set(NAMES)
    times = [e["time"] for e in events]
    assert times == sorted(times)
    only_b = CliRunner().invoke(cli, ["logs", "--dir", folder, "--json", "--node", "B"])
    assert {json.loads(line)["node"] for line in only_b.output.splitlines()} == {"B"}
    warn = CliRunner().invoke(cli, ["logs", "--dir", folder, "--json", "--level", "warning"])
    assert all(
        json.loads(line)["level"] in ("WARNING", "ERROR", "CRITICAL")
        for line in warn.output.splitlines()
    )
    since = times[len(times) // 2]
    later = CliRunner().invoke(cli, ["logs", "--dir", folder, "--json", "--since", since])
    assert all(json.loads(line)["time"] >= since for line in later.output.splitlines())
    assert len(later.output.splitlines()) < len(events)


def test_cluster_status_names_each_metrics_endpoint(cluster: Procs) -> None:
    result = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(cluster.lc.dir), "--json"])
    assert result.exit_code == 0, result.output
    rows = {n["name"]: n for n in json.loads(result.output)["nodes"]}
    for name in NAMES:
        assert rows[name]["metrics"] == cluster.nodes[name].metrics
    table = CliRunner().invoke(cli, ["cluster", "status", "--dir", str(cluster.lc.dir)])
    assert "METRICS" in table.output
