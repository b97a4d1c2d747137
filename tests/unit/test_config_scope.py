"""Configuration per group or per node (G3): ``applies_to``, stored everywhere, seen by some.

Two tables, as two nodes A and B hold them: every entry is applied to both
(the cluster log), each with its own node name; each has its own notifier.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from nonstop.configuration.files import ConfigFileError, parse
from nonstop.configuration.groups import GROUP_TYPE, Group
from nonstop.configuration.requests import ConfigRequests
from nonstop.configuration.state import ConfigState
from nonstop.configuration.table import TABLE, ConfigTable
from nonstop.configuration.types import Change, ConfigTypes
from nonstop.runtime.interface import Reply


class Rates(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    eur: float


Seen = list[tuple[str, str, str]]


def node_types(seen: Seen) -> ConfigTypes:
    types = ConfigTypes()
    types.declare(GROUP_TYPE, Group)
    rates = types.declare("rates", Rates)

    @rates.notifier
    def record(change: Change) -> None:
        seen.append((change.kind, change.name, change.version))

    return types


class Cluster:
    """Tables of nodes A and B fed the same entries; requests go through A."""

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {"A": [], "B": []}
        self.tables = {n: ConfigTable(node_types(self.seen[n]), n) for n in ("A", "B")}
        self.requests = ConfigRequests(self.tables["A"], "A")
        self.index = 0

    def ask(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.index += 1
        entry, refusal = self.requests.start(0.0, self.index, payload, self.index - 1)
        if refusal is not None:
            refused: dict[str, Any] = refusal.payload
            return refused
        assert entry is not None and entry[TABLE] == "change"
        entry["r"] = ["A", 1]
        actions = self.tables["A"].apply(self.index, entry)
        self.tables["B"].apply(self.index, dict(entry))
        replies = self.requests.answers(actions, 1)
        assert isinstance(replies[0], Reply)
        answer: dict[str, Any] = replies[0].payload
        return answer

    def load(self, *texts: str, activate: bool = True, **more: Any) -> dict[str, Any]:
        files = [{"file": f"f{i}.toml", "text": t} for i, t in enumerate(texts)]
        return self.ask({"do": "load", "files": files, "activate": activate, **more})

    def effective(self, node: str) -> list[tuple[str, str]]:
        return [(c["name"], c["version"]) for c in self.tables[node].effective("rates")]


def rates(name: str, version: str, applies_to: str = "") -> str:
    head = f"applies_to = {applies_to}\n" if applies_to else ""
    return f'type = "rates"\nname = "{name}"\nversion = "{version}"\n{head}eur = 1.5\n'


def group(name: str, version: str, nodes: list[str]) -> str:
    listed = ", ".join(f'"{n}"' for n in nodes)
    return f'type = "{GROUP_TYPE}"\nname = "{name}"\nversion = "{version}"\nnodes = [{listed}]\n'


def test_the_header_names_a_group_or_nodes() -> None:
    types = node_types([])
    assert parse(rates("fx", "1", '"east"'), "f", types).applies_to == {"group": "east"}
    assert parse(rates("fx", "1", '["A", "B"]'), "f", types).applies_to == {"nodes": ["A", "B"]}
    assert parse(rates("fx", "1", '"all"'), "f", types).applies_to is None
    assert parse(rates("fx", "1"), "f", types).applies_to is None
    for bad, message in [
        ("3", "f:4: applies_to is a group name or a list of node names, not int"),
        ("[]", "f:4: applies_to: name 1 to 1024 nodes"),
        ('["A", "A"]', "f:4: applies_to: a node is listed twice"),
        ('"e/../x"', "f:4: applies_to: bad group name 'e/../x'"),
        ('["A b"]', "f:4: applies_to: bad node name 'A b'"),
    ]:
        with pytest.raises(ConfigFileError) as caught:
            parse(rates("fx", "1", bad), "f", types)
        assert str(caught.value) == message


def test_a_version_for_a_group_is_stored_everywhere_and_seen_by_its_nodes() -> None:
    c = Cluster()
    refused = c.load(rates("fx", "1", '"east"'))
    assert refused["error"] == "Rejected"
    assert "unknown group 'east' (active groups: none)" in refused["message"]
    assert c.tables["A"].rows() == []  # nothing applied

    assert c.load(group("east", "1", ["A"]))["ok"]
    reply = c.load(rates("fx", "1", '"east"'))
    assert [ch.get("applies_to") for ch in reply["changes"]] == [{"group": "east"}] * 2
    assert c.tables["A"].rows() == c.tables["B"].rows()  # stored cluster-wide
    assert c.tables["B"].rows()[-1]["applies_to"] == {"group": "east"}
    assert c.seen == {"A": [("load", "fx", "1"), ("activate", "fx", "1")], "B": []}
    assert c.effective("A") == [("fx", "1")] and c.effective("B") == []

    # The group now names B instead: A hears the version go, B hears it come.
    assert c.load(group("east", "2", ["B"]))["ok"]
    assert c.seen["A"][-1] == ("deactivate", "fx", "1")
    assert c.seen["B"] == [("activate", "fx", "1")]
    assert c.effective("A") == [] and c.effective("B") == [("fx", "1")]

    # The group cannot go while an active version applies to it.
    refused = c.ask({"do": "deactivate", "type": GROUP_TYPE, "name": "east"})
    assert "active rates/fx version 1 applies to group east; deactivate it first" in str(
        refused["message"]
    )
    heard_by_a = list(c.seen["A"])
    assert c.ask({"do": "deactivate", "type": "rates", "name": "fx"})["ok"]
    assert c.seen["B"][-1] == ("deactivate", "fx", "1") and c.seen["A"] == heard_by_a
    assert c.ask({"do": "deactivate", "type": GROUP_TYPE, "name": "east"})["ok"]
    refused = c.ask({"do": "activate", "type": "rates", "name": "fx", "version": "1"})
    assert "unknown group 'east'" in str(refused["message"])


def test_a_replace_across_scopes_is_half_a_change_where_only_half_applies() -> None:
    c = Cluster()
    assert c.load(rates("fx", "1"))["ok"]
    assert c.load(rates("fx", "2"), applies_to=["A"], activate=False)["ok"]
    c.seen["A"].clear()
    c.seen["B"].clear()
    assert c.ask({"do": "activate", "type": "rates", "name": "fx", "version": "2"})["ok"]
    assert c.seen == {"A": [("replace", "fx", "2")], "B": [("deactivate", "fx", "1")]}
    assert c.effective("A") == [("fx", "2")] and c.effective("B") == []


def test_the_command_scope_and_the_files_scope_must_agree() -> None:
    c = Cluster()
    refused = c.load(rates("fx", "1", '["B"]'), applies_to=["A"])
    assert refused["message"] == (
        "f0.toml: the file applies to nodes B, the command to nodes A; say it once"
    )
    assert c.load(rates("fx", "1", '["A"]'), applies_to=["A"])["ok"]
    assert "bad group name" in str(c.load(rates("g", "1"), applies_to="a b")["message"])


def test_a_scoped_load_overtaken_by_its_group_change_is_refused() -> None:
    c = Cluster()
    assert c.load(group("east", "1", ["A"]))["ok"]
    files = [{"file": "fx.toml", "text": rates("fx", "1", '"east"')}]
    at = c.index
    load, _ = c.requests.start(0.0, 100, {"do": "load", "files": files}, at)
    drop, _ = c.requests.start(
        0.0, 101, {"do": "deactivate", "type": GROUP_TYPE, "name": "east"}, at
    )
    assert load is not None and drop is not None
    for entry in (drop, load):
        entry["r"] = ["A", 1]
    replies = c.requests.answers(
        c.tables["A"].apply(at + 1, drop) + c.tables["A"].apply(at + 2, load), 1
    )
    assert replies[0].payload["ok"] is True
    assert (
        "nonstop.group/east changed while the request was checked" in replies[1].payload["message"]
    )


def test_snapshots_keep_the_scope_and_a_restore_tells_only_its_nodes() -> None:
    c = Cluster()
    c.load(group("east", "1", ["B"]))
    c.load(rates("fx", "1", '"east"'), rates("all", "1"))
    snap = c.tables["A"].snapshot()
    for node, want in (("A", [("all", "1")]), ("B", [("all", "1"), ("fx", "1")])):
        seen: Seen = []
        again = ConfigTable(node_types(seen), node)
        again.restore(snap)
        assert again.restored_actions() == []
        assert sorted(seen) == [("activate", n, v) for n, v in want]
        assert again.rows() == c.tables["A"].rows()
    # A snapshot written before scopes existed (seven fields a version) applies everywhere.
    old = {"c": [["rates", "fx", "1", "Active", {"eur": 1.0}, "f", 3]], "x": [], "r": []}
    assert ConfigState.from_plain(old).configs[("rates", "fx")]["1"].scope is None


def test_load_arguments_say_group_or_nodes_not_both_in_the_schema_too() -> None:
    """The OpenAPI description carries the rule the validator applies (the fuzz sends
    what the schema allows and expects it accepted)."""
    import pydantic

    from nonstop.commands.config_commands import LoadArguments

    rule = LoadArguments.model_json_schema()["not"]
    assert set(rule["required"]) == {"group", "nodes"}
    assert rule["properties"] == {"group": {"type": "string"}, "nodes": {"type": "array"}}
    files = [{"file": "a.toml", "text": "x"}]
    with pytest.raises(pydantic.ValidationError, match="not both"):
        LoadArguments.model_validate({"files": files, "group": "east", "nodes": ["A"]})
    for one in (
        {"files": files, "group": "east"},
        {"files": files, "nodes": ["A"]},
        {"files": files, "group": None, "nodes": ["A"]},  # null: allowed by the schema too
    ):
        LoadArguments.model_validate(one)
