"""``--nonstop-option KEY=VALUE``: the node configuration of a benchmark's local cluster.

The syntax of ``nonstop local up --option`` (the value is JSON, else a plain string),
plus dotted keys for nested tables, so that a benchmark can select a configuration
without code::

    --nonstop-option ha.data=partitions --nonstop-option ha.policies.default.replicas=1

gives ``{"ha": {"data": "partitions", "policies": {"default": {"replicas": 1}}}}``.
Options are merged in order (a table given whole and one of its keys given dotted
combine; one key given twice is an error), then checked against the node
configuration schema before any process starts: an unknown key or a bad value is a
:class:`ValueError` that names it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from nonstop.node.config import ConfigError, check_options


def parse_nonstop_options(items: Iterable[str]) -> dict[str, Any]:
    """The options ``items`` (``KEY=VALUE`` strings) select, checked; ``{}`` for none."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        path = [part.strip() for part in key.split(".")]
        if not eq or not all(path):
            raise ValueError(
                f"--nonstop-option {item!r} is not KEY=VALUE (e.g. ha.data=partitions)"
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        for part in reversed(path):
            value = {part: value}
        _merge(out, value, item, [])
    try:
        check_options(out)
    except ConfigError as exc:
        raise ValueError(f"--nonstop-option: {exc}") from None
    return out


def _merge(into: dict[str, Any], new: dict[str, Any], item: str, at: list[str]) -> None:
    for key, value in new.items():
        old = into.get(key)
        if key not in into:
            into[key] = value
        elif isinstance(old, dict) and isinstance(value, dict):
            _merge(old, value, item, [*at, key])
        else:
            raise ValueError(f"--nonstop-option {item!r}: {'.'.join([*at, key])} is set twice")


def describe(items: Iterable[str]) -> str:
    """The options as the report shows them: the command-line words, or the default."""
    given = [f"`{item}`" for item in items]
    return ", ".join(given) if given else "the defaults (no `--nonstop-option`)"
