"""Application modules and components (F2): the code a node activates at start.

``nonstop node start --app bank.model`` (repeatable; ``app = [...]`` in the
node's config) imports the modules before the store opens, so every node knows
the application's managed types, their methods, their triggers and their
configuration types.  A client imports the same modules.  A module that
cannot be imported stops the start with one line naming it and why.

Components
----------
Every application module is a *component*: its code, plus the configuration
files it ships, plus two optional hooks, activated together at node start in
the order of ``app``::

    CONFIGURATION_FILES = ("rates.toml",)  # files next to the module: loaded, activated
    def activate_component() -> None: ...    # first, in order (before the configuration)
    def deactivate_component() -> None: ...  # at node stop, in reverse order

Activation is one transaction (:func:`start_components`, then one change of
the configuration table holding every file's load and activation): the hooks
run in order; the first failure deactivates those already activated, in
reverse, and nothing is submitted; then every component's files are loaded and
activated by *one* entry of the cluster log -- all of them or, if an audit
vetoes one or a file is bad, none.  The node then reports why in one line and
stops.  A file's version is activated only if no version of its configuration
is active yet: the version an operator activated stays across restarts.  At
node stop the hooks of the activated components run in reverse order; the
configuration stays (it is the cluster's, and the other nodes use it).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from nonstop.configuration.files import ConfigFileError, parse
from nonstop.configuration.types import TYPES, ConfigTypes


class AppLoadError(Exception):
    """An application module cannot be imported; the message is one line."""


class ComponentError(Exception):
    """A component cannot be activated; the message is one line naming it."""


def parse_apps(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """``"a.b, c"`` or a list → module names, blanks dropped, order and duplicates kept once."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise AppLoadError(f"an application module is a dotted name, not {item!r:.40}")
        name = item.strip()
        if name and name not in names:
            names.append(name)
    return names


def load_apps(names: list[str]) -> list[ModuleType]:
    """Import every module of ``names`` in order; :class:`AppLoadError` on the first failure."""
    modules = []
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise AppLoadError(f"application module {name!r} is not a dotted module name")
        try:
            modules.append(importlib.import_module(name))
        except Exception as exc:
            raise AppLoadError(
                f"cannot load application module {name!r}: {_one_line(exc)}"
            ) from exc
    return modules


def _one_line(exc: BaseException) -> str:
    # The exception's own message, without the traceback.
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {reason}"


# ------------------------------------------------------------ components
@dataclass(frozen=True, slots=True)
class Component:
    """An application module as a component (module doc)."""

    module: ModuleType
    files: tuple[Path, ...]

    @property
    def name(self) -> str:
        return self.module.__name__

    def hook(self, name: str) -> Callable[[], Any] | None:
        fn = getattr(self.module, name, None)
        return fn if callable(fn) else None


def components_of(modules: list[ModuleType]) -> list[Component]:
    """The modules as components, in order, with their files resolved next to the module."""
    out = []
    for module in modules:
        shipped = getattr(module, "CONFIGURATION_FILES", ())
        if isinstance(shipped, str) or not all(isinstance(f, str) for f in shipped):
            raise ComponentError(
                f"component {module.__name__}: CONFIGURATION_FILES must be a list of file names"
            )
        where = Path(getattr(module, "__file__", None) or ".").parent
        out.append(Component(module, tuple(where / f for f in shipped)))
    return out


def component_ops(
    components: list[Component], types: ConfigTypes | None = None
) -> list[dict[str, Any]]:
    """Every component's files as configuration operations: load, then activate (module doc)."""
    ops: list[dict[str, Any]] = []
    for component in components:
        for path in component.files:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ComponentError(
                    f"component {component.name}: cannot read {path}: {_one_line(exc)}"
                ) from None
            try:
                cfg = parse(text, str(path), types if types is not None else TYPES)
            except ConfigFileError as exc:
                raise ComponentError(f"component {component.name}: {exc}") from None
            key = {"type": cfg.type, "name": cfg.name, "version": cfg.version}
            ops.append({"do": "load", **key, "data": cfg.data, "file": cfg.file})
            ops.append({"do": "activate", **key, "unless_active": True})
    return ops


def start_components(components: list[Component]) -> list[Component]:
    """Call every ``activate_component`` hook in order; a failure undoes the earlier ones.

    Returns the components activated (all of them); raises :class:`ComponentError`.
    """
    done: list[Component] = []
    for component in components:
        hook = component.hook("activate_component")
        try:
            if hook is not None:
                hook()
        except Exception as exc:
            stop_components(done)
            raise ComponentError(
                f"component {component.name} failed to activate: {_one_line(exc)}"
            ) from exc
        done.append(component)
    return done


def stop_components(components: list[Component]) -> list[str]:
    """Call every ``deactivate_component`` hook in reverse order; the failures (one line each)."""
    failures = []
    for component in reversed(components):
        hook = component.hook("deactivate_component")
        try:
            if hook is not None:
                hook()
        except Exception as exc:
            failures.append(f"component {component.name} failed to deactivate: {_one_line(exc)}")
    return failures


__all__ = [
    "AppLoadError",
    "Component",
    "ComponentError",
    "component_ops",
    "components_of",
    "load_apps",
    "parse_apps",
    "start_components",
    "stop_components",
]
