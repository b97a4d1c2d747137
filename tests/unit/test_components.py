"""Components (F2): hooks in order, undone in reverse on a failure; files checked first."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from nonstop.configuration.state import ConfigState, Refused, plan
from nonstop.configuration.types import ConfigTypes, Veto
from nonstop.node.apps import (
    ComponentError,
    component_ops,
    components_of,
    start_components,
    stop_components,
)


def module(
    name: str, calls: list[str], fail: bool = False, files: tuple[str, ...] = ()
) -> ModuleType:
    mod = ModuleType(name)

    def activate_component() -> None:
        if fail:
            raise RuntimeError("no database")
        calls.append(f"+{name}")

    def deactivate_component() -> None:
        calls.append(f"-{name}")

    mod.activate_component = activate_component  # type: ignore[attr-defined]
    mod.deactivate_component = deactivate_component  # type: ignore[attr-defined]
    mod.CONFIGURATION_FILES = files  # type: ignore[attr-defined]
    return mod


def test_hooks_run_in_order_and_a_failure_undoes_the_earlier_ones_in_reverse() -> None:
    calls: list[str] = []
    mods = [module("a", calls), module("b", calls), module("c", calls, fail=True)]
    with pytest.raises(ComponentError, match="component c failed to activate: RuntimeError: no"):
        start_components(components_of(mods))
    assert calls == ["+a", "+b", "-b", "-a"]
    calls.clear()
    started = start_components(components_of(mods[:2]))
    assert stop_components(started) == [] and calls == ["+a", "+b", "-b", "-a"]


def test_component_files_become_one_all_or_nothing_change(tmp_path: Path) -> None:
    types = ConfigTypes()
    kind = types.declare("limits")

    @kind.audit
    def no_zero(change: object) -> None:
        if getattr(change, "version", "") == "0":
            raise Veto("version 0 is reserved")

    (tmp_path / "ok.toml").write_text('type = "limits"\nname = "x"\nversion = "1"\nmax = 3\n')
    (tmp_path / "zero.toml").write_text('type = "limits"\nname = "y"\nversion = "0"\nmax = 1\n')
    (tmp_path / "broken.toml").write_text('type = "limits"\nname = "z"\n')
    first = module("first", [], files=("ok.toml",))
    first.__file__ = str(tmp_path / "first.py")
    second = module("second", [], files=("zero.toml",))
    second.__file__ = str(tmp_path / "second.py")
    ops = component_ops(components_of([first, second]), types)
    assert [(o["do"], o["name"]) for o in ops] == [
        ("load", "x"),
        ("activate", "x"),
        ("load", "y"),
        ("activate", "y"),
    ]
    with pytest.raises(Refused, match="load of limits/y version 0 vetoed by the audit"):
        plan(ConfigState(), ops, 1, types)
    state, changes = plan(ConfigState(), ops[:2], 1, types)
    assert [c["kind"] for c in changes] == ["load", "activate"]
    # An operator's active version stays: the shipped one is only loaded.
    state, _ = plan(
        state,
        [
            {
                "do": "load",
                "type": "limits",
                "name": "x",
                "version": "2",
                "data": {"max": 9},
                "file": "op.toml",
            },
            {"do": "activate", "type": "limits", "name": "x", "version": "2"},
        ],
        2,
        types,
    )
    assert plan(state, ops[:2], 3, types)[1] == []
    broken = module("broken", [], files=("broken.toml",))
    broken.__file__ = str(tmp_path / "broken.py")
    with pytest.raises(ComponentError, match=r"component broken: .*broken\.toml: key 'version'"):
        component_ops(components_of([broken]), types)
    missing = module("missing", [], files=("nope.toml",))
    with pytest.raises(ComponentError, match=r"component missing: cannot read .*nope\.toml"):
        component_ops(components_of([missing]), types)
