"""The admin HTTP API of real nodes (G2, G5): a 3-node loopback cluster, asked over HTTP.

Status, partition list and a changing command (partition disable/enable) through
``/api/v1``; the configuration commands (load, activate, list; refusals as on the CLI);
the role matrix (a monitor refused a change with 403, a bad password
401, a forged token 401); a huge body 413; a path traversal on the console 404;
CLI/HTTP parity: every registered command reachable both ways with the same
result; and a bounded schemathesis run over the OpenAPI description.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nonstop.admin.cli import cli
from nonstop.admin.registered import cli_path
from nonstop.client.credentials import load_credentials
from nonstop.commands.registry import load_all
from tests.cluster.conftest import REAL_CLUSTER, Procs, app_cluster, wait_until
from tests.cluster.conftest import run_cli as run_cli_process
from tests.cluster.conftest import run_cli_here as run_cli

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not REAL_CLUSTER, reason="the partition table is the real cluster node's"),
]

MONITOR = ("mo", "monitor-password-1")
CLERK = ("clerk", "clerk-password-1")
FUZZ_EXAMPLES = int(os.environ.get("NONSTOP_FUZZ_EXAMPLES", "5"))
"""Valid and invalid examples per operation: 5 in ``make test``, 10 in ``make test-long``."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Procs]:
    """Three nodes that know the ``rates`` configuration type (``tests.configmodel``) and the
    ``ledger`` application commands (``tests.appcommands``)."""
    folder = tmp_path_factory.mktemp("admin-api")
    apps = ["tests.configmodel", "tests.appcommands"]
    with app_cluster(folder, 3, {"app": apps}) as procs:
        for (user, password), role in ((MONITOR, "monitor"), (CLERK, "ledger.clerk")):
            code, _, err = run_cli(
                "user", "add", user, "--role", role, "--password", password,
                "--node", procs.address("A"),
            )  # fmt: skip
            assert code == 0, err
        yield procs


def admin_auth() -> tuple[str, str]:
    cred = load_credentials(os.environ["NONSTOP_CREDENTIALS"])
    return cred.user, cred.password


def base(cluster: Procs, name: str = "A") -> str:
    address = cluster.nodes[name].admin
    assert address is not None and address.startswith("127.0.0.1:")
    return f"http://{address}"


def post(cluster: Procs, path: str, body: Any = None, **kw: Any) -> httpx.Response:
    kw.setdefault("auth", admin_auth())
    return httpx.post(f"{base(cluster)}/api/v1/{path}", json=body, timeout=30, **kw)


def test_status_and_partition_list_over_http(cluster: Procs) -> None:
    r = post(cluster, "cluster/status")
    assert r.status_code == 200, r.text
    status = r.json()
    assert status["quorum"] == "Active" and status["cluster"] == cluster.layout["cluster"]
    assert {n["name"]: n["state"] for n in status["nodes"]} == {"A": "Self", "B": "Up", "C": "Up"}
    r = post(cluster, "partition/list")
    assert r.status_code == 200, r.text
    assert [p["name"] for p in r.json()["partitions"]][:2] == ["default.0", "default.1"]
    r = post(cluster, "node/status")
    assert r.status_code == 200 and r.json()["name"] == "A", r.text


def test_a_changing_command_over_http(cluster: Procs) -> None:
    part = next(
        p for p in post(cluster, "partition/list").json()["partitions"] if len(p["nodes"]) > 1
    )
    name, second = part["name"], part["nodes"][1][0]
    r = post(cluster, "partition/disable", {"name": name, "on": [second]})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["node"] == second

    def status_on(node: str) -> str | None:
        rows = post(cluster, "partition/list").json()["partitions"]
        return next(p["status"][node] for p in rows if p["name"] == name)

    wait_until(lambda: status_on(second) == "LocalDisabled", 10, f"{name} disabled on {second}")
    r = post(cluster, "partition/enable", {"name": name, "on": [second]})
    assert r.status_code == 200, r.text
    wait_until(lambda: status_on(second) == "LocalEnabled", 10, f"{name} enabled on {second}")
    r = post(cluster, "partition/enable", {"name": "no-such-partition"})
    assert r.status_code == 400 and "not defined" in r.json()["detail"]


def test_role_matrix_and_bad_input(cluster: Procs) -> None:
    assert post(cluster, "cluster/status", auth=MONITOR).status_code == 200
    refused = post(cluster, "partition/disable", {"name": "default.0"}, auth=MONITOR)
    assert refused.status_code == 403 and "admin" in refused.json()["detail"]
    assert post(cluster, "cluster/status", auth=(MONITOR[0], "wrong")).status_code == 401
    assert post(cluster, "cluster/status", auth=("nobody", "x")).status_code == 401
    assert post(cluster, "cluster/status", auth=None).status_code == 401
    login = httpx.post(
        f"{base(cluster, 'B')}/api/v1/login",
        json={"user": MONITOR[0], "password": MONITOR[1]},
        timeout=30,
    )
    assert login.status_code == 200, login.text
    token = login.json()["token"]
    # A token from B is good on C (one key per cluster), and its roles still apply.
    on_c = f"{base(cluster, 'C')}/api/v1/"
    bearer = {"Authorization": f"Bearer {token}"}
    assert httpx.post(on_c + "cluster/status", headers=bearer, timeout=30).status_code == 200
    r = httpx.post(on_c + "partition/enable", json={"name": "x"}, headers=bearer, timeout=30)
    assert r.status_code == 403
    forged = {"Authorization": f"Bearer {token[:-4]}AAAA"}
    assert httpx.post(on_c + "cluster/status", headers=forged, timeout=30).status_code == 401
    huge = httpx.post(
        f"{base(cluster)}/api/v1/partition/enable",
        content=b"{" + b" " * (1 << 20) + b"}",
        headers={"Content-Type": "application/json"},
        auth=admin_auth(),
        timeout=30,
    )
    assert huge.status_code == 413
    assert post(cluster, "partition/enable", {"nme": "x"}).status_code == 422
    # Membership over HTTP: a monitor may not; bad input and a non-member are refused.
    r = post(cluster, "cluster/remove", {"name": "C"}, auth=MONITOR)
    assert r.status_code == 403 and "membership" in r.json()["detail"]
    r = post(cluster, "cluster/join", {"name": "D", "node_address": "no port"})
    assert r.status_code == 422
    r = post(cluster, "cluster/remove", {"name": "nobody"})
    assert r.status_code == 400 and "nobody is not a member" in r.json()["detail"]
    assert post(cluster, "no/such-command").status_code == 404
    for path in ("/console/../../node.toml", "/console/%2e%2e/%2e%2e/A.toml"):
        r = httpx.get(base(cluster) + path, timeout=30)
        assert r.status_code == 404 and "listen" not in r.text
    assert httpx.get(base(cluster) + "/console/", timeout=30).status_code == 200
    # The node kept serving, and said who was refused what.
    assert post(cluster, "cluster/status").status_code == 200
    log = (cluster.nodes["A"].data / "node.log").read_text()
    assert "refused POST /api/v1/partition/disable for mo@127.0.0.1" in log
    assert "bad user or password (user 'nobody')" in log


def test_every_command_is_reachable_from_cli_and_http_with_the_same_result(
    cluster: Procs,
) -> None:
    commands = load_all()
    assert {"cluster.status", "node.status", "partition.list", "partition.enable"} <= set(commands)
    assert {f"config.{verb}" for verb in CONFIG_VERBS} <= set(commands)
    for cmd in commands.values():
        on_cli = cli_path(cli, cmd)
        assert on_cli is not None, f"{cmd.name} is not on the CLI"
        params = {p.name for p in on_cli.params}
        assert set(cmd.arguments.model_fields) <= params, (cmd.name, params)
        spec = httpx.get(f"{base(cluster)}/api/v1/openapi.json", timeout=30).json()
        assert f"/api/v1/{'/'.join(cmd.words)}" in spec["paths"], cmd.name
    # Same result: the read commands compared on what does not change between two asks.
    node = ["--node", cluster.address("A")]
    code, out, err = run_cli("cluster", "status", "--json", *node)
    assert code == 0, err
    via_cli = json.loads(out)
    via_http = post(cluster, "cluster/status").json()
    for key in ("cluster", "view", "quorum", "members", "name"):
        assert via_cli[key] == via_http[key], key
    assert [(n["name"], n["address"], n["state"]) for n in via_cli["nodes"]] == [
        (n["name"], n["address"], n["state"]) for n in via_http["nodes"]
    ]
    code, out, err = run_cli("partition", "list", "--json", *node)
    assert code == 0, err
    strip = lambda rows: [{k: v for k, v in r.items() if k != "acting_on"} for r in rows]  # noqa: E731
    assert strip(json.loads(out)["partitions"]) == strip(
        post(cluster, "partition/list").json()["partitions"]
    )
    code, out, err = run_cli("node", "status", "--json", *node)
    assert code == 0 and json.loads(out)["name"] == post(cluster, "node/status").json()["name"]
    code, out, err = run_cli("user", "list", "--json", *node)
    assert code == 0, err
    users = post(cluster, "user/list").json()["users"]
    assert json.loads(out) == users and {"user": MONITOR[0], "roles": ["monitor"]} in users
    code, out, err = run_cli("config", "list", "--json", *node)
    assert code == 0, err
    assert json.loads(out) == post(cluster, "config/list").json()
    # A changing command: the same refusal both ways (a partition that does not exist).
    code, out, err = run_cli("partition", "enable", "no-such", *node)
    r = post(cluster, "partition/enable", {"name": "no-such"})
    assert code == 2 and r.status_code == 400
    assert r.json()["detail"] in err


CONFIG_VERBS = ("list", "show", "load", "activate", "deactivate", "remove")


def rates_text(version: str, eur: str) -> str:
    return f'type = "rates"\nname = "http"\nversion = "{version}"\neur = {eur}\n'


def test_configuration_over_http(cluster: Procs, tmp_path: Path) -> None:
    """Load + activate + list over HTTP; a monitor may read but not activate (403); an
    audit veto and a bad file refused (409) with the very line the CLI prints (exit 2)."""
    loaded = post(
        cluster, "config/load", {"files": [{"file": "fx1", "text": rates_text("1", "1.5")}]}
    )
    assert loaded.status_code == 200, loaded.text
    assert [c["kind"] for c in loaded.json()["changes"]] == ["load"]
    which = {"type": "rates", "name": "http", "version": "1"}
    assert post(cluster, "config/activate", which, auth=MONITOR).status_code == 403
    activated = post(cluster, "config/activate", which)
    assert activated.status_code == 200, activated.text
    assert [(c["kind"], c["version"]) for c in activated.json()["changes"]] == [("activate", "1")]
    listed = post(cluster, "config/list", auth=MONITOR)
    assert listed.status_code == 200, listed.text
    rows = [(r["name"], r["version"], r["state"]) for r in listed.json()["configurations"]]
    assert ("http", "1", "Active") in rows
    shown = post(cluster, "config/show", {"type": "rates", "name": "http"}, auth=MONITOR)
    assert shown.status_code == 200 and shown.json()["versions"][0]["data"]["eur"] == 1.5

    veto, wrong = tmp_path / "fx-veto.toml", tmp_path / "fx-wrong.toml"
    unknown = tmp_path / "fx-unknown.toml"
    veto.write_text(rates_text("2", "-1.0"))
    wrong.write_text(rates_text("3", '"high"'))
    unknown.write_text(rates_text("4", "1.0") + "usdd = 2.0\n")
    for path, message in [
        (veto, "vetoed by the audit: eur must be positive, got -1.0"),
        (wrong, f"{wrong}:4: key 'eur'"),
        (unknown, f"{unknown}:5: unknown key 'usdd'; did you mean 'usd'?"),
    ]:
        body = {"files": [{"file": str(path), "text": path.read_text()}], "activate": True}
        refused = post(cluster, "config/load", body)
        assert refused.status_code == 409, refused.text
        detail = refused.json()["detail"]
        assert message in detail
        code, out, err = run_cli(
            "config", "load", str(path), "--activate", "--node", cluster.address("A")
        )
        assert code == 2, (out, err)
        assert err.strip() == f"nonstop: error: {' '.join(detail.split())}"
    after = post(cluster, "config/list").json()["configurations"]
    assert [(r["version"], r["state"]) for r in after if r["name"] == "http"] == [("1", "Active")]
    log = (cluster.nodes["A"].data / "node.log").read_text()
    assert "refused POST /api/v1/config/activate for mo@127.0.0.1" in log
    for refused_because in ("vetoed by the audit", "unknown key 'usdd'", "key 'eur'"):
        assert any(
            "refused POST /api/v1/config/load for admin@127.0.0.1" in line
            and refused_because in line
            for line in log.splitlines()
        ), refused_because


def test_openapi_fuzz(cluster: Procs, tmp_path: Path) -> None:
    """schemathesis over every operation, bounded: ``FUZZ_EXAMPLES`` valid and as many
    invalid examples each (10 of each: about 30 s); every answer as documented (status,
    schema) and none a server error."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.generation import GenerationMode

    url = base(cluster)
    schema = schemathesis.openapi.from_url(f"{url}/api/v1/openapi.json")
    login = httpx.post(
        f"{url}/api/v1/login", json={"user": MONITOR[0], "password": MONITOR[1]}, timeout=30
    ).json()
    headers = {"Authorization": f"Bearer {login['token']}"}
    seen: dict[int, int] = {}
    for operation in schema.get_all_operations():
        op = operation.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=FUZZ_EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                # A body over the API's 64 KiB limit is refused with 413 before it is
                # read (an invalid example can be that large); schemathesis's list of
                # refusals of invalid data lacks 413, so such an answer is only checked
                # to be that refusal.
                response = case.call(base_url=url, headers=headers, timeout=30)
                if response.status_code == 413:
                    assert "larger than" in response.text, response.text
                else:
                    case.validate_response(response, headers=headers)
                seen[response.status_code] = seen.get(response.status_code, 0) + 1

            run()
    print("fuzz statuses:", dict(sorted(seen.items())))
    assert {200, 403, 422} <= set(seen) and all(code < 500 for code in seen), seen


def test_admin_port_is_https_when_the_node_has_tls(folder: Path, tmp_path: Path) -> None:
    """With the node's TLS (mutual, as `local up --option tls=...` sets it) the admin port
    speaks HTTPS with the node's certificate, and its commands reach the node over TLS;
    so does the metrics port (a scrape over HTTPS, none over plain HTTP)."""
    from tests.unit.test_transport import make_certs

    tls = make_certs(tmp_path)
    option = json.dumps({"cert": tls.cert, "key": tls.key, "ca": tls.ca})
    code, _, err = run_cli_process(
        "local", "up", "-n", "1", "--dir", str(folder), "--option", f"tls={option}"
    )
    assert code == 0, err
    entry = json.loads((folder / "local.json").read_text())["nodes"][0]
    admin, metrics = entry["admin"], entry["metrics"]
    ssl_context = ssl.create_default_context(cafile=tls.ca)
    r = httpx.post(
        f"https://{admin}/api/v1/cluster/status", auth=admin_auth(), verify=ssl_context, timeout=30
    )
    assert r.status_code == 200 and r.json()["quorum"] == "Active", r.text
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"http://{admin}/api/v1/cluster/status", auth=admin_auth(), timeout=5)
    scrape = httpx.get(
        f"https://{metrics}/metrics", auth=admin_auth(), verify=ssl_context, timeout=30
    )
    assert scrape.status_code == 200 and b"nonstop_" in scrape.content, scrape.text
    assert (
        httpx.get(f"https://{metrics}/metrics", verify=ssl_context, timeout=30).status_code == 401
    )
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{metrics}/metrics", auth=admin_auth(), timeout=5)


# ------------------------------------------------------------ application commands (G4)
def credentials_file(tmp_path: Path, user: tuple[str, str]) -> str:
    from nonstop.client.credentials import write_credentials

    path = tmp_path / f"{user[0]}.json"
    write_credentials(path, *user)
    return str(path)


def test_application_commands_over_http_and_cli(cluster: Procs, tmp_path: Path) -> None:
    """An application module's commands (``tests.appcommands``): in the OpenAPI
    description and the console's list, run on the node in a transaction (HTTP, CLI),
    refused to a role without the command's, bad arguments a clear error, a failure
    rolled back, an ``Abort`` refused."""
    spec = httpx.get(f"{base(cluster)}/api/v1/openapi.json", timeout=30).json()
    assert (
        "Permission: `role:ledger.clerk`"
        in spec["paths"]["/api/v1/app/ledger/open"]["post"]["description"]
    )
    listing = httpx.get(f"{base(cluster)}/api/v1/commands", auth=CLERK, timeout=30).json()
    allowed = {c["name"]: c["allowed"] for c in listing}
    assert allowed["app.ledger.open"] and allowed["app.ledger.balances"] is False
    pids = {n["name"]: n["pid"] for n in post(cluster, "cluster/status").json()["nodes"]}

    opened = post(cluster, "app/ledger/open", {"number": "h-1", "balance": 5}, auth=CLERK)
    assert opened.status_code == 200, opened.text
    answer = opened.json()
    assert answer["node"] == "A" and answer["columns"] == ["number", "balance", "pid"]
    assert answer["rows"] == [["h-1", 5, pids["A"]]]  # it ran in node A's process
    # Refused: a monitor lacks the role (403); the clerk lacks `status` for balances.
    refused = post(cluster, "app/ledger/open", {"number": "h-2", "balance": 1}, auth=MONITOR)
    assert refused.status_code == 403 and "ledger.clerk" in refused.json()["detail"]
    assert post(cluster, "app/ledger/balances", {}, auth=CLERK).status_code == 403
    bad = post(cluster, "app/ledger/open", {"number": "h-3", "balance": -1}, auth=CLERK)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "balance"
    failed = post(cluster, "app/ledger/fail", {"number": "h-4", "balance": 1}, auth=CLERK)
    assert failed.status_code == 500 and "failed after the create" in failed.json()["detail"]
    no = post(cluster, "app/ledger/refuse", None, auth=CLERK)
    assert no.status_code == 409 and no.json()["detail"] == "the ledger is closed today"
    rows = post(cluster, "app/ledger/balances", {"prefix": "h-"}, auth=MONITOR).json()
    assert rows["columns"] == ["number", "balance"] and rows["rows"] == [["h-1", 5]]  # h-4 undone
    # An asynchronous command (async def): on the node's event loop, same checks, same
    # transaction; a failure (no such account) rolled back.
    deposit = {"number": "h-1", "amount": 3}
    assert post(cluster, "app/ledger/deposit", deposit, auth=MONITOR).status_code == 403
    added = post(cluster, "app/ledger/deposit", deposit, auth=CLERK)
    assert added.status_code == 200, added.text
    assert added.json()["rows"] == [["h-1", 8, "MainThread"]]  # not a worker thread
    missing = post(cluster, "app/ledger/deposit", {"number": "h-9", "amount": 1}, auth=CLERK)
    assert missing.status_code == 500 and "h-9" in missing.json()["detail"], missing.text
    rows = post(cluster, "app/ledger/balances", {"prefix": "h-"}, auth=MONITOR).json()
    assert rows["rows"] == [["h-1", 8]]

    # The CLI: same command, same checks, on the node asked.
    clerk = ["--credentials", credentials_file(tmp_path, CLERK), "--node", cluster.address("B")]
    code, out, err = run_cli(
        "app", "run", "ledger.open", "number=c-1", "balance=7", "--json", *clerk
    )
    assert code == 0, err
    assert json.loads(out)["node"] == "B" and json.loads(out)["rows"] == [["c-1", 7, pids["B"]]]
    code, out, err = run_cli("app", "run", "ledger.open", "number=c-2", "balance=x", *clerk)
    assert code == 2 and "balance: Input should be a valid integer" in err, err
    monitor = ["--credentials", credentials_file(tmp_path, MONITOR), "--node", cluster.address("C")]
    code, out, err = run_cli("app", "run", "ledger.open", "number=c-3", "balance=1", *monitor)
    assert code == 1 and "may not run ledger.open" in err, err
    code, out, err = run_cli("app", "run", "ledger.balances", "prefix=c-", *monitor)
    assert code == 0 and out.split() == ["number", "balance", "c-1", "7"], (out, err)
    code, out, err = run_cli("app", "list", "--json", *monitor)
    assert code == 0, err
    assert [c["name"] for c in json.loads(out)["commands"]] == [
        "ledger.balances", "ledger.deposit", "ledger.fail", "ledger.open", "ledger.refuse",
    ]  # fmt: skip
    assert {c["name"]: c["asynchronous"] for c in json.loads(out)["commands"]}["ledger.deposit"]
    log = (cluster.nodes["C"].data / "node.log").read_text()
    assert "refused application command ledger.open to mo (roles monitor)" in log


# ------------------------------------------------------------ groups of nodes (G3)
def group_text(name: str, nodes: list[str]) -> str:
    return f'type = "nonstop.group"\nname = "{name}"\nversion = "1"\nnodes = {json.dumps(nodes)}\n'


def test_a_command_on_every_node_of_a_group(cluster: Procs, tmp_path: Path) -> None:
    """Groups are configuration (``nonstop.group``); a per-node command runs on each node of
    one, over HTTP (``?group=``) and the CLI (``group run``, ``app run --group``), one
    result per node; a node that is no member is a failed result, not a failure of all."""
    files = [{"file": "east", "text": group_text("east", ["A", "B"])}]
    files.append({"file": "odd", "text": group_text("odd", ["C", "Z"])})
    loaded = post(cluster, "config/load", {"files": files, "activate": True})
    assert loaded.status_code == 200, loaded.text
    vetoed = post(
        cluster, "config/load", {"files": [{"file": "all", "text": group_text("all", ["A"])}]}
    )
    assert vetoed.status_code == 409 and "reserved" in vetoed.json()["detail"]

    r = httpx.post(
        f"{base(cluster)}/api/v1/node/status", params={"group": "east"}, auth=MONITOR, timeout=30
    )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["group"] == "east" and answer["nodes"] == ["A", "B"]
    assert [(x["node"], x["ok"], x["result"]["name"]) for x in answer["results"]] == [
        ("A", True, "A"),
        ("B", True, "B"),
    ]
    odd = post(cluster, "node/status?group=odd").json()["results"]
    assert [(x["node"], x["ok"]) for x in odd] == [("C", True), ("Z", False)]
    assert "Z is no member" in odd[1]["error"]
    assert post(cluster, "node/status?group=west").status_code == 404
    once = post(cluster, "partition/enable?group=east", {"name": "default.0"})
    assert once.status_code == 400 and "once, not per node" in once.json()["detail"]
    assert post(cluster, "node/status?group=east", auth=CLERK).status_code == 403

    node = ["--node", cluster.address("C")]
    code, out, err = run_cli("group", "run", "all", "node.status", *node)
    assert code == 0, err
    assert [x["result"]["name"] for x in json.loads(out)["results"]] == ["A", "B", "C"]
    code, out, err = run_cli("group", "nodes", "east", *node)
    assert code == 0 and out.split() == ["A", "B"], err
    code, out, err = run_cli("group", "run", "east", "partition.enable", "name=x", *node)
    assert code == 2 and "once, not per node" in err
    code, out, err = run_cli("app", "run", "ledger.balances", "--group", "east", *node)
    assert code == 0, err
    results = json.loads(out)["results"]
    assert [(x["node"], x["result"]["node"]) for x in results] == [("A", "A"), ("B", "B")]

    # Configuration for a group (G3): stored on every node, the effective configuration of
    # the group's nodes only; the same over HTTP and the CLI.
    text = 'type = "rates"\nname = "grouped"\nversion = "1"\neur = 2.0\n'
    body = {"files": [{"file": "grouped", "text": text}], "activate": True}
    unknown = post(cluster, "config/load", {**body, "group": "west"})
    assert unknown.status_code == 409 and "unknown group 'west'" in unknown.json()["detail"]
    both = post(cluster, "config/load", {**body, "group": "east", "nodes": ["A"]})
    assert both.status_code == 422, both.text
    loaded = post(cluster, "config/load", {**body, "group": "east"})
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["changes"][-1]["applies_to"] == {"group": "east"}

    def grouped(results: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        return [
            (x["node"], any(c["name"] == "grouped" for c in x["result"]["configurations"]))
            for x in results
        ]

    want = [("A", True), ("B", True), ("C", False)]
    wait_until(
        lambda: (
            grouped(
                post(cluster, "config/effective?group=all", {"type": "rates"}).json()["results"]
            )
            == want
        ),
        10,
        "the grouped version on A and B only",
    )
    code, out, err = run_cli("group", "run", "all", "config.effective", "type=rates", *node)
    assert code == 0, err
    assert grouped(json.loads(out)["results"]) == want


# ------------------------------------------------------------ users over HTTP (G2, G5)
def test_user_add_and_passwd_over_http_then_log_in_everywhere(cluster: Procs) -> None:
    """``user/add`` and ``user/passwd`` over HTTP (loopback): the new password logs in over
    HTTP basic and through a data client, the old one no more; a monitor is refused (403),
    a weak password and an unknown user are a clear 400 -- the same line the CLI prints
    (exit 2); the node's log never holds a password."""
    from nonstop.client import Client
    from nonstop.errors import AuthenticationFailed
    from nonstop.net.auth import Password

    first, second = "first-http-password", "second-http-password"

    def data_ping(password: str) -> Any:
        with Client([cluster.address("B")], credentials=Password("ops", password), rounds=1) as c:
            return c.ping()

    added = post(cluster, "user/add", {"name": "ops", "roles": ["operator"], "password": first})
    assert added.status_code == 200, added.text
    assert added.json() == {"user": "ops", "roles": ["operator"]}
    assert post(cluster, "cluster/status", auth=("ops", first)).status_code == 200
    assert data_ping(first)["name"] == "B"
    changed = post(cluster, "user/passwd", {"name": "ops", "password": second})
    assert changed.status_code == 200, changed.text
    wait_until(
        lambda: post(cluster, "cluster/status", auth=("ops", second)).status_code == 200,
        10,
        "the new password accepted over HTTP",
    )
    assert post(cluster, "cluster/status", auth=("ops", first)).status_code == 401
    assert data_ping(second)["name"] == "B"
    with pytest.raises(AuthenticationFailed):
        data_ping(first)

    denied = post(cluster, "user/passwd", {"name": "ops", "password": "x" * 12}, auth=MONITOR)
    assert denied.status_code == 403 and "users" in denied.json()["detail"]
    node = ["--node", cluster.address("A")]
    for body, cli_args in [
        (
            {"name": "ops", "password": "Wk7pw!q"},
            ["user", "passwd", "ops", "--password", "Wk7pw!q"],
        ),
        (
            {"name": "nobody", "password": "long-enough-1"},
            ["user", "passwd", "nobody", "--password", "long-enough-1"],
        ),
        (
            {"name": "ops", "roles": ["app"], "password": "long-enough-2"},
            ["user", "add", "ops", "--role", "app", "--password", "long-enough-2"],
        ),
    ]:
        r = post(cluster, "/".join(cli_args[:2]), body)
        code, _, err = run_cli(*cli_args, *node)
        assert r.status_code == 400 and code == 2, (r.text, err)
        assert err.strip() == f"nonstop: error: {r.json()['detail']}"
    log = "".join((cluster.nodes[n].data / "node.log").read_text() for n in ("A", "B", "C"))
    assert "runs user.add" in log and "runs user.passwd" in log
    for password in (first, second, "long-enough-1", "long-enough-2", "Wk7pw!q"):
        assert password not in log, password
