"""Versioned configuration (F1) on real node processes: every node agrees, restarts keep it.

Three nodes import ``tests.configmodel`` (the ``rates`` type, its audit and
notifier).  Changes go to one node through ``nonstop config``; every node
answers ``config list --json`` with the same versions.  Snapshots are taken
every few entries, so a restart of every node rebuilds the table from a
snapshot plus the entries after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nonstop.admin.local import LocalError
from nonstop.client import Client
from nonstop.errors import AuthenticationFailed, NotAuthorized
from nonstop.net.auth import Password, make_verifier
from nonstop.node.datadir import pid_alive
from nonstop.node.log_events import read_events
from tests.cluster.conftest import REAL_CLUSTER, Procs, app_cluster, wait_until
from tests.cluster.conftest import run_cli_here as run_cli

pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(not REAL_CLUSTER, reason="the configuration table is the real node's"),
]


def rates(path: Path, version: str, eur: str = "1.1", extra: str = "") -> str:
    path.write_text(f'type = "rates"\nname = "fx"\nversion = "{version}"\neur = {eur}\n{extra}')
    return str(path)


def listed(p: Procs, name: str) -> list[dict[str, Any]]:
    code, out, err = run_cli("config", "list", "--json", "--node", p.address(name))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["node"] == name
    rows: list[dict[str, Any]] = doc["configurations"]
    return rows


def effective(p: Procs, name: str, type_name: str = "rates") -> list[tuple[str, str]]:
    """The (name, version) of the active ``type_name`` versions that apply to node ``name``."""
    code, out, err = run_cli("config", "effective", type_name, "--node", p.address(name))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["node"] == name
    return [(c["name"], c["version"]) for c in doc["configurations"]]


def heard(p: Procs, name: str) -> list[str]:
    """What the ``rates`` notifier of node ``name`` logged (tests.configmodel)."""
    lines = (p.nodes[name].data / "node.log").read_text().splitlines()
    return [e.message for e in read_events(lines, name) if e.logger == "tests.configmodel"]


def same_everywhere(p: Procs, want: list[tuple[str, str]]) -> None:
    """Every node lists exactly ``want`` (version, state), in the same rows."""

    def agree() -> bool:
        tables = [listed(p, n) for n in p.nodes]
        return (
            all(t == tables[0] for t in tables)
            and [(r["version"], r["state"]) for r in tables[0]] == want
        )

    wait_until(agree, 15, f"every node to list {want}")


def test_configuration_life_cycle_on_three_nodes(tmp_path: Path) -> None:
    options = {"app": ["tests.configmodel"], "snapshot_every": 4}
    with app_cluster(tmp_path / "c", 3, options) as p:
        a, b, c = (p.address(n) for n in sorted(p.nodes))
        v1, v2 = rates(tmp_path / "fx1.toml", "1"), rates(tmp_path / "fx2.toml", "2", "2.5")

        code, out, err = run_cli("config", "load", v1, "--activate", "--node", a)
        assert code == 0, err
        assert "activate rates/fx version 1" in out
        # A change is checked on the node it is sent to: wait until B has applied the
        # previous one (else B refuses it as "changed while the request was checked").
        same_everywhere(p, [("1", "Active")])
        code, _, err = run_cli("config", "load", v2, "--node", b)
        assert code == 0, err
        same_everywhere(p, [("1", "Active"), ("2", "Inactive")])

        # Replace: one entry, the old version Inactive as the new one is Active.
        code, out, err = run_cli("config", "activate", "rates", "fx", "2", "--node", c)
        assert code == 0, err
        assert "replace rates/fx version 2 (replaces 1)" in out
        same_everywhere(p, [("1", "Inactive"), ("2", "Active")])

        # Refusals: one line naming the culprit, exit 2, nothing applied anywhere.
        veto = rates(tmp_path / "fx3.toml", "3", "-1.0")
        wrong = rates(tmp_path / "fx4.toml", "4", '"high"')
        unknown = rates(tmp_path / "fx5.toml", "5", extra="usdd = 2.0\n")
        for args, message in [
            (["load", veto, "--activate"], "vetoed by the audit: eur must be positive, got -1.0"),
            (["load", wrong], f"{wrong}:4: key 'eur'"),
            (["load", unknown], f"{unknown}:5: unknown key 'usdd'; did you mean 'usd'?"),
            (["activate", "rates", "fx", "9"], "unknown version 9 (loaded: 1, 2)"),
            (["remove", "rates", "fx", "2"], "version 2 is active; deactivate it first"),
        ]:
            code, out, err = run_cli("config", *args, "--node", a)
            assert code == 2, (args, out, err)
            assert message in err and len(err.strip().splitlines()) == 1, err
        code, _, err = run_cli("config", "remove", "rates", "fx", "1", "--node", a)
        assert code == 0, err
        same_everywhere(p, [("2", "Active")])
        code, _, err = run_cli("config", "activate", "rates", "fx", "1", "--node", b)
        assert code == 2 and "version 1 was removed; load its file again" in err
        code, _, err = run_cli("config", "deactivate", "rates", "fx", "--node", b)
        assert code == 0, err
        same_everywhere(p, [("2", "Inactive")])
        code, _, err = run_cli("config", "activate", "rates", "fx", "2", "--node", a)
        assert code == 0, err
        same_everywhere(p, [("2", "Active")])
        code, out, err = run_cli("config", "show", "rates", "fx", "--node", c)
        assert code == 0, err
        assert json.loads(out)[0]["data"] == {"eur": 2.5, "note": "", "usd": 1.0}

        # Roles: a monitor reads the configuration but may not change it.
        with Client([a], timeout=10, rounds=1) as admin:
            added = admin.request(
                {
                    "op": "user.add",
                    "user": "watcher",
                    "roles": ["monitor"],
                    "verifier": make_verifier("pw-monitor").to_wire(),
                }
            )
        assert added.get("ok"), added
        watcher = Password("watcher", "pw-monitor")

        def known_on_c() -> bool:
            try:
                with Client([c], credentials=watcher, rounds=1) as probe:
                    return bool(probe.status())
            except AuthenticationFailed:
                return False  # the user's entry is not applied on C yet

        wait_until(known_on_c, 10, "the monitor user on C")
        with Client([c], credentials=watcher) as monitor:
            rows = monitor.call({"op": "config.list"})["configurations"]
            assert [(r["version"], r["state"]) for r in rows] == [("2", "Active")]
            assert monitor.call({"op": "config.show", "type": "rates", "name": "fx"})["versions"]
            with pytest.raises(NotAuthorized, match="watcher"):
                monitor.call({"op": "config", "do": "deactivate", "type": "rates", "name": "fx"})
        same_everywhere(p, [("2", "Active")])

        # Configuration for a group (G3): C is down when a version for group "east"
        # (A and C) is loaded and activated; it is in the cluster log, so C gets it when
        # it returns; B stores it too but does not see it as its own.
        first, second, third = sorted(p.nodes)
        p.kill(third)
        east = tmp_path / "east.toml"
        east.write_text(
            f'type = "nonstop.group"\nname = "east"\nversion = "1"\n'
            f'nodes = ["{first}", "{third}"]\n'
        )
        code, _, err = run_cli("config", "load", str(east), "--activate", "--node", a)
        assert code == 0, err
        wait_until(lambda: effective(p, second, "nonstop.group"), 10, "the group on B")
        fx_east = tmp_path / "east-fx.toml"
        fx_east.write_text('type = "rates"\nname = "east-fx"\nversion = "1"\neur = 3.0\n')
        code, out, err = run_cli(
            "config", "load", str(fx_east), "--activate", "--group", "east", "--node", b
        )
        assert code == 0, err
        assert "activate rates/east-fx version 1 for group east" in out
        wait_until(lambda: ("east-fx", "1") in effective(p, first), 10, "east-fx on A")
        assert effective(p, second) == [("fx", "2")]  # stored on B, not B's configuration
        assert ("east-fx", "1") in [(r["name"], r["version"]) for r in listed(p, second)]
        code, out, err = run_cli("config", "list", "--node", b)
        assert code == 0, err
        assert [line.split()[4:6] for line in out.splitlines() if " east-fx " in line] == [
            ["group", "east"]
        ], out
        code, _, err = run_cli("config", "load", str(fx_east), "--group", "west", "--node", a)
        assert code == 2 and "unknown group 'west' (active groups: east)" in err, err
        p.start(third)
        wait_until(lambda: ("east-fx", "1") in effective(p, third), 20, "east-fx on C")
        assert effective(p, third) == [("east-fx", "1"), ("fx", "2")]
        assert "rates notifier: activate east-fx 1" in heard(p, third)
        assert "rates notifier: activate east-fx 1" in heard(p, first)
        assert not any("east-fx" in line for line in heard(p, second))

        # A restart of every node keeps the table (snapshot + the entries after it).
        for name in list(p.pids):
            p.kill(name)
        p.start_all()
        p.wait_quorum(list(p.nodes), "Active", 30)
        same_everywhere(p, [("1", "Active"), ("1", "Active"), ("2", "Active")])
        assert effective(p, second) == [("fx", "2")]


def start_with_apps(p: Procs, name: str, apps: list[str]) -> int:
    """Start ``name`` with its own ``app`` list (the other nodes keep theirs)."""
    options = p.layout.setdefault("options", {})
    before = options.get("app")
    options["app"] = apps
    try:
        return p.start(name)
    finally:
        options["app"] = before


def test_component_activation_is_one_transaction(tmp_path: Path) -> None:
    with app_cluster(tmp_path / "c", 3, {"app": ["tests.configmodel"]}) as p:
        a, b, c = sorted(p.nodes)
        p.kill(c)
        # The second component's file is vetoed: nothing of the first one is applied either,
        # and the node stops saying why.
        why = (
            "component activation rolled back, nothing activated: load of rates/bad version 1 "
            "vetoed by the audit: eur must be positive, got -3.0"
        )
        apps = ["tests.configmodel", "tests.components.good", "tests.components.vetoed"]
        try:
            pid = start_with_apps(p, c, apps)
        except LocalError as exc:  # it stopped before its start was seen: the one line
            assert str(exc) == why
        else:
            wait_until(lambda: not pid_alive(pid), 30, f"{c} to stop")
        assert why in (p.nodes[c].data / "node.log").read_text()
        assert listed(p, a) == [] and listed(p, b) == []
        # Without the bad component the node starts, and the good one's file is Active everywhere.
        start_with_apps(p, c, ["tests.configmodel", "tests.components.good"])
        p.wait_quorum([a, b, c], "Active", 30)
        wait_until(
            lambda: all(
                [(r["name"], r["version"], r["state"]) for r in listed(p, n)]
                == [("desk", "shipped", "Active")]
                for n in (a, b, c)
            ),
            20,
            "the component's configuration on every node",
        )
