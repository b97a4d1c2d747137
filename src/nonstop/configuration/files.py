"""Configuration files: TOML text → a checked :class:`ConfigFile` or one clear error.

A file holds one version of one configuration::

    type = "rates"        # the configuration type (declared by the application)
    name = "fx"           # the configuration's name within its type
    version = "2"         # this version's name (a string or an integer)

    applies_to = "east"   # optional: a group, or ["A", "B"]; absent: every node (scope.py)

    eur = 1.1             # everything else is the data, checked by the type's model
    usd = 1.0

A file that is not TOML, lacks a header key, names an unknown type, or whose
data has a value of the wrong type or an unknown key is a :class:`ConfigFileError`
naming the file, the line and key, and the problem -- nothing is loaded.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from nonstop.configuration.scope import HEADER_KEY, BadScope, Scope, scope_of
from nonstop.configuration.types import ConfigTypes

HEADER = ("type", "name", "version")
"""The keys that say which configuration and version a file is."""


class ConfigFileError(Exception):
    """A configuration file that cannot be loaded; the message is one line."""


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """One version of one configuration, as read from a file and checked."""

    type: str
    name: str
    version: str
    data: dict[str, Any]
    """The data as the type's model dumps it (JSON-able, msgpack-able)."""
    file: str
    applies_to: Scope = None
    """The nodes it applies to (``nonstop.configuration.scope``); None: every node."""


def parse(text: str, file: str, types: ConfigTypes) -> ConfigFile:
    """Read and check a configuration file's ``text`` (``file`` names it in errors)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"{file}: not valid TOML: {exc}") from None
    header: dict[str, str] = {}
    for key in HEADER:
        value = raw.pop(key, None)
        if isinstance(value, int) and not isinstance(value, bool) and key == "version":
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            where = _line_of(text, [key])
            got = "missing" if value is None else f"got {value!r}"
            raise ConfigFileError(f"{file}{where}: key {key!r} must be a non-empty string ({got})")
        header[key] = value.strip()
    try:
        applies_to = scope_of(raw.pop(HEADER_KEY, None))
    except BadScope as exc:
        raise ConfigFileError(f"{file}{_line_of(text, [HEADER_KEY])}: {exc}") from None
    declared = types.get(header["type"])
    if declared is None:
        known = ", ".join(types.names()) or "none: load the application's modules (--app)"
        raise ConfigFileError(
            f"{file}{_line_of(text, ['type'])}: unknown configuration type "
            f"{header['type']!r} (known: {known})"
        )
    return ConfigFile(
        header["type"],
        header["name"],
        header["version"],
        check_data(declared.model, raw, file, text),
        file,
        applies_to,
    )


def check_data(
    model: type[BaseModel], data: dict[str, Any], file: str, text: str | None = None
) -> dict[str, Any]:
    """``data`` validated by ``model`` and dumped back; :class:`ConfigFileError` naming the key."""
    try:
        return model.model_validate(data).model_dump(mode="json")
    except ValidationError as exc:
        problems = [_explain(model, error, file, text) for error in exc.errors()]
        raise ConfigFileError("; ".join(problems)) from None


def _explain(model: type[BaseModel], error: Any, file: str, text: str | None) -> str:
    loc = [str(part) for part in error["loc"]]
    key = ".".join(loc) or "(the data)"
    where = _line_of(text, loc) if text is not None else ""
    if error["type"] == "extra_forbidden":
        valid = list(model.model_fields) if len(loc) == 1 else []
        close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{file}{where}: unknown key {key!r}{hint}"
    if error["type"] == "missing":
        return f"{file}: key {key!r} is missing"
    return f"{file}{where}: key {key!r}: {error['msg']}, got {error.get('input')!r}"


def _line_of(text: str | None, loc: list[str]) -> str:
    """``:LINE`` where key ``loc`` is set in ``text`` (best effort), or empty."""
    if not text or not loc:
        return ""
    table, key = loc[:-1], loc[-1]
    section: list[str] = []
    assign = re.compile(rf"^\s*(?:\"{re.escape(key)}\"|{re.escape(key)})\s*=")
    for number, line in enumerate(text.splitlines(), start=1):
        header = re.match(r"^\s*\[+\s*([^\]]+?)\s*\]+", line)
        if header:
            section = [part.strip().strip('"') for part in header.group(1).split(".")]
            continue
        if section == table and assign.match(line):
            return f":{number}"
    return ""


__all__ = ["HEADER", "ConfigFile", "ConfigFileError", "check_data", "parse"]
