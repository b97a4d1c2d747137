"""Application modules (F2): the code a node (or a client) activates at start.

``nonstop node start --app bank.model`` (repeatable; ``app = [...]`` in the
node's config) imports the modules before the store opens, so every node knows
the application's managed types, their methods and their triggers.  A client
imports the same modules.  A module that cannot be imported stops the start
with one line naming it and why.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class AppLoadError(Exception):
    """An application module cannot be imported; the message is one line."""


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
            # One line: the module's own exception, without the traceback.
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise AppLoadError(
                f"cannot load application module {name!r}: {type(exc).__name__}: {reason}"
            ) from exc
    return modules


__all__ = ["AppLoadError", "load_apps", "parse_apps"]
