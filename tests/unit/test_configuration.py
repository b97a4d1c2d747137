"""Versioned configuration (F1): files, life cycle, audits, the log table, snapshots."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from nonstop.configuration.files import ConfigFileError, parse
from nonstop.configuration.requests import ConfigRequests
from nonstop.configuration.state import ACTIVE, INACTIVE, ConfigState, Refused, plan
from nonstop.configuration.table import TABLE, ConfigTable
from nonstop.configuration.types import ConfigTypes, Veto
from nonstop.runtime.interface import Reply
from nonstop.security.roles import (
    ADMIN_OPS,
    MONITOR,
    OPERATOR,
    STATUS,
    allows,
    permission_of,
)


class Rates(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    eur: float
    usd: float = 1.0


def make_types(seen: list[tuple[str, str, str | None]] | None = None) -> ConfigTypes:
    types = ConfigTypes()
    rates = types.declare("rates", Rates)

    @rates.audit
    def positive(change: Any) -> None:
        if isinstance(change.data, Rates) and change.kind != "remove" and change.data.eur <= 0:
            raise Veto(f"eur must be positive, got {change.data.eur}")

    if seen is not None:

        @rates.notifier
        def record(change: Any) -> None:
            seen.append((change.kind, change.version, change.old_version))

    return types


def text(version: str, eur: float = 1.1, extra: str = "") -> str:
    return f'type = "rates"\nname = "fx"\nversion = "{version}"\neur = {eur}\n{extra}'


def load_op(types: ConfigTypes, version: str, eur: float = 1.1) -> dict[str, Any]:
    cfg = parse(text(version, eur), f"fx-{version}.toml", types)
    return {
        "do": "load",
        "type": "rates",
        "name": "fx",
        "version": version,
        "data": cfg.data,
        "file": cfg.file,
    }


def op(do: str, version: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"do": do, "type": "rates", "name": "fx"}
    if version is not None:
        out["version"] = version
    return out


def states(state: ConfigState) -> dict[str, str]:
    return {v: r.state for v, r in state.configs.get(("rates", "fx"), {}).items()}


# ------------------------------------------------------------ files
def test_file_is_read_and_checked() -> None:
    cfg = parse(text("1"), "fx.toml", make_types())
    assert (cfg.type, cfg.name, cfg.version, cfg.file) == ("rates", "fx", "1", "fx.toml")
    assert cfg.data == {"eur": 1.1, "usd": 1.0}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (text("1", extra="usdd = 2.0\n"), r"fx\.toml:5: unknown key 'usdd'; did you mean 'usd'\?"),
        (text("1").replace("eur = 1.1", 'eur = "high"'), r"fx\.toml:4: key 'eur': .*'high'"),
        ('name = "fx"\nversion = "1"\neur = 1.0\n', r"fx\.toml: key 'type' must be .*missing"),
        (
            text("1").replace('"rates"', '"ratez"'),
            r"fx\.toml:1: unknown configuration type 'ratez'",
        ),
        ("type = [\n", r"fx\.toml: not valid TOML"),
        ('type = "rates"\nname = "fx"\nversion = "1"\n', r"fx\.toml: key 'eur' is missing"),
    ],
)
def test_bad_files_name_file_line_and_key(body: str, message: str) -> None:
    with pytest.raises(ConfigFileError, match=message):
        parse(body, "fx.toml", make_types())


# ------------------------------------------------------------ life cycle
def test_life_cycle_load_activate_replace_deactivate_remove() -> None:
    types = make_types()
    state = ConfigState()
    state, changes = plan(state, [load_op(types, "1"), load_op(types, "2", 2.2)], 1, types)
    assert states(state) == {"1": INACTIVE, "2": INACTIVE}
    state, _ = plan(state, [op("activate", "1")], 2, types)
    assert states(state) == {"1": ACTIVE, "2": INACTIVE}
    # Replacing is one step: never two active versions, never none in between.
    state, changes = plan(state, [op("activate", "2")], 3, types)
    assert states(state) == {"1": INACTIVE, "2": ACTIVE}
    assert changes == [
        {"kind": "replace", "type": "rates", "name": "fx", "version": "2", "old_version": "1"}
    ]
    with pytest.raises(Refused, match="version 2 is active; deactivate it first"):
        plan(state, [op("remove", "2")], 4, types)
    state, _ = plan(state, [op("deactivate")], 4, types)
    assert states(state) == {"1": INACTIVE, "2": INACTIVE}
    with pytest.raises(Refused, match="deactivate rates/fx: no version is active"):
        plan(state, [op("deactivate")], 5, types)
    state, _ = plan(state, [op("remove", "1")], 5, types)
    assert states(state) == {"2": INACTIVE}
    with pytest.raises(Refused, match="version 1 was removed; load its file again"):
        plan(state, [op("activate", "1")], 6, types)
    with pytest.raises(Refused, match=r"unknown version 9 \(loaded: 2\)"):
        plan(state, [op("activate", "9")], 6, types)
    # Loading the same file twice is a no-op; other data under the same version is refused.
    assert plan(state, [load_op(types, "2", 2.2)], 6, types)[1] == []
    with pytest.raises(Refused, match="loaded already with other data"):
        plan(state, [load_op(types, "2", 3.3)], 6, types)
    # Operations sent as such (``apply``) are checked like files: the type must be declared.
    alien = {**load_op(types, "7"), "type": "alien"}
    with pytest.raises(Refused, match="unknown configuration type 'alien' \\(known: rates\\)"):
        plan(state, [alien], 6, types)


def test_audit_veto_refuses_and_leaves_state_as_it_was() -> None:
    types = make_types()
    state, _ = plan(ConfigState(), [load_op(types, "1"), op("activate", "1")], 1, types)
    before = state.to_plain()
    bad = load_op(make_types(), "2", 2.0)
    bad["data"] = {"eur": -1.0, "usd": 1.0}
    with pytest.raises(Refused, match="load of rates/fx version 2 vetoed by the audit: eur must"):
        plan(state, [bad, op("activate", "2")], 2, types)
    assert state.to_plain() == before
    # Without types (the log's replay) only the life cycle is checked.
    replayed, _ = plan(state, [bad, op("activate", "2")], 2, None)
    assert states(replayed) == {"1": INACTIVE, "2": ACTIVE}


def test_a_batch_is_all_or_nothing() -> None:
    types = make_types()
    state, _ = plan(ConfigState(), [load_op(types, "1")], 1, types)
    with pytest.raises(Refused, match="unknown version 7"):
        plan(state, [load_op(types, "2"), op("activate", "2"), op("activate", "7")], 2, types)
    assert states(state) == {"1": INACTIVE}


# ------------------------------------------------------------ the table
def apply_request(
    table: ConfigTable, requests: ConfigRequests, index: int, payload: dict[str, Any]
) -> tuple[list[Any], Reply | None]:
    entry, refusal = requests.start(0.0, index, payload, index - 1)
    if refusal is not None:
        return [], refusal
    assert entry is not None and entry[TABLE] == "change"
    entry["r"] = ["A", 1]
    actions = table.apply(index, entry)
    replies = requests.answers(actions, 1)
    return actions, replies[0] if replies else None


def test_table_applies_answers_and_notifies() -> None:
    seen: list[tuple[str, str, str | None]] = []
    table = ConfigTable(make_types(seen))
    requests = ConfigRequests(table, "A")
    files = [{"file": "fx-1.toml", "text": text("1")}]
    _, reply = apply_request(table, requests, 1, {"do": "load", "files": files, "activate": True})
    assert reply is not None and reply.payload["ok"] is True
    assert [c["kind"] for c in reply.payload["changes"]] == ["load", "activate"]
    assert seen == [("load", "1", None), ("activate", "1", None)]
    files2 = [{"file": "fx-2.toml", "text": text("2", 2.0)}]
    apply_request(table, requests, 2, {"do": "load", "files": files2})
    _, reply = apply_request(
        table, requests, 3, {"do": "activate", "type": "rates", "name": "fx", "version": "2"}
    )
    assert reply is not None and reply.payload["changes"][0]["kind"] == "replace"
    assert seen[-1] == ("replace", "2", "1")
    assert [(r["version"], r["state"]) for r in table.rows()] == [("1", INACTIVE), ("2", ACTIVE)]
    # A veto is refused at once, before the log: the reply names the culprit.
    bad = [{"file": "fx-3.toml", "text": text("3", -2.0)}]
    actions, reply = apply_request(table, requests, 4, {"do": "load", "files": bad})
    assert actions == [] and reply is not None
    assert reply.payload == {
        "error": "Rejected",
        "message": "load of rates/fx version 3 vetoed by the audit: eur must be positive, got -2.0",
    }
    assert len(table.rows()) == 2


def test_overtaken_request_is_refused_when_applied() -> None:
    table = ConfigTable(make_types())
    requests = ConfigRequests(table, "A")
    files = [{"file": "fx-1.toml", "text": text("1")}]
    apply_request(table, requests, 1, {"do": "load", "files": files})
    first, _ = requests.start(
        0.0, 10, {"do": "activate", "type": "rates", "name": "fx", "version": "1"}, 1
    )
    second, _ = requests.start(
        0.0, 11, {"do": "remove", "type": "rates", "name": "fx", "version": "1"}, 1
    )
    assert first is not None and second is not None
    for entry in (first, second):
        entry["r"] = ["A", 1]
    replies = requests.answers(table.apply(2, first) + table.apply(3, second), 1)
    assert replies[0].payload["ok"] is True
    assert replies[1].payload["error"] == "Rejected"
    assert "rates/fx changed while the request was checked" in replies[1].payload["message"]
    assert table.rows()[0]["state"] == ACTIVE


def test_snapshot_round_trip_and_notifiers_on_restore() -> None:
    seen: list[tuple[str, str, str | None]] = []
    table = ConfigTable(make_types(seen))
    requests = ConfigRequests(table, "A")
    files = [
        {"file": "fx-1.toml", "text": text("1")},
        {"file": "g.toml", "text": text("1").replace('"fx"', '"g"')},
    ]
    apply_request(table, requests, 1, {"do": "load", "files": files, "activate": True})
    snap = table.snapshot()
    again = ConfigTable(make_types(seen))
    seen.clear()
    again.restore(snap)
    assert again.rows() == table.rows() and again.state.revs == table.state.revs
    assert again.restored_actions() == [] and sorted(seen) == [("activate", "1", None)] * 2
    again.restore(None)
    assert again.rows() == []


def test_request_shapes_are_refused_in_one_line() -> None:
    table = ConfigTable(make_types())
    requests = ConfigRequests(table, "A")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"do": "activate", "type": "rates", "name": "fx"}, "activate needs a version"),
        ({"do": "load", "files": []}, "load needs at least one file"),
        (
            {"do": "activate", "type": "rates", "name": "fx", "version": "1"},
            "activate rates/fx: unknown version 1 (loaded: none)",
        ),
    ]
    for payload, message in cases:
        entry, reply = requests.start(0.0, 1, payload, 0)
        assert entry is None and reply is not None
        assert reply.payload == {"error": "Rejected", "message": message}
    assert requests.read(2, {"do": "show", "type": "rates", "name": "fx"}).payload == {
        "error": "Rejected",
        "message": "no configuration rates/fx is loaded",
    }
    assert table.forwarded("B", {TABLE: "change", "q": "x", "ops": [], "revs": []}) is None


def test_reads_are_monitor_ops_and_changes_admin_ones() -> None:
    assert permission_of("config.list") == permission_of("config.show") == STATUS
    assert permission_of("config") == ADMIN_OPS
    assert allows([MONITOR], STATUS) and not allows([MONITOR, OPERATOR], ADMIN_OPS)
