"""Configuration types (F1): a schema, an audit and notifiers per type name.

An application declares a configuration type with a pydantic model; its
files are checked against it (a wrong type or an unknown key is an error,
nothing is loaded).  It may add one *audit* -- a function that vetoes a state
change by raising :class:`Veto` with a reason -- and any number of
*notifiers*, called after a change was applied::

    from pydantic import BaseModel
    from nonstop.configuration import config_type, Veto

    class Rates(BaseModel):
        eur: float
        usd: float = 1.0

    rates = config_type("rates", Rates)

    @rates.audit
    def _check(change):
        if change.data is not None and change.data.eur <= 0:
            raise Veto("eur must be positive")

    @rates.notifier
    def _on(change):
        print(change.kind, change.version)

Audits run where the change is *applied*: on every node, at the change's
position in the cluster log (configuration.md, "Where audits run").  They
must therefore be deterministic: a pure function of the :class:`Change` (no
clock, no randomness, no node-local state), so that every node reaches the
same verdict.  Every node of a cluster must declare the same types (load the
same application modules), as it registers the same log tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict

ChangeKind = Literal["load", "activate", "replace", "deactivate", "remove"]
"""The audited state transitions (seed 000, table 9.1)."""


class Veto(Exception):
    """Raised by an audit to refuse a change; the message is the reason (one line)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One state change of a configuration version, as audits and notifiers see it.

    ``data`` is the version the change is about (validated by the type's
    model), ``old`` the version it replaces (``replace`` only), ``old_version``
    its version name.
    """

    kind: ChangeKind
    type: str
    name: str
    version: str
    data: BaseModel | None
    old: BaseModel | None = None
    old_version: str | None = None


Audit = Callable[[Change], None]
Notifier = Callable[[Change], None]


class _Free(BaseModel):
    """The schema of a type declared without a model: any table of values."""

    model_config = ConfigDict(extra="allow")


@dataclass
class ConfigType:
    """A declared configuration type: its model, its audit, its notifiers."""

    name: str
    model: type[BaseModel]
    audits: list[Audit] = field(default_factory=list)
    notifiers: list[Notifier] = field(default_factory=list)

    def audit(self, fn: Audit) -> Audit:
        """Decorator: add an audit (raise :class:`Veto` to refuse a change)."""
        self.audits.append(fn)
        return fn

    def notifier(self, fn: Notifier) -> Notifier:
        """Decorator: add a notifier, called after a change was applied."""
        self.notifiers.append(fn)
        return fn


class ConfigTypes:
    """The configuration types a process knows, by name."""

    def __init__(self) -> None:
        self._types: dict[str, ConfigType] = {}

    def declare(self, name: str, model: type[BaseModel] | None = None) -> ConfigType:
        """Declare type ``name`` (idempotent for the same model: a module imported twice)."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise ValueError(f"a configuration type needs a name, not {name!r}")
        model = model or _Free
        known = self._types.get(name)
        if known is not None:
            if known.model is not model:
                raise ValueError(f"configuration type {name!r} is declared already")
            return known
        declared = ConfigType(name, model)
        self._types[name] = declared
        return declared

    def get(self, name: str) -> ConfigType | None:
        return self._types.get(name)

    def names(self) -> list[str]:
        return sorted(self._types)

    def __iter__(self) -> Iterator[ConfigType]:
        return iter(self._types.values())

    def discard(self, name: str) -> None:
        """Forget a type (tests, and a component's activation rolled back)."""
        self._types.pop(name, None)


TYPES = ConfigTypes()
"""The types of this process: application modules declare theirs here at import."""


def config_type(name: str, model: type[BaseModel] | None = None) -> ConfigType:
    """Declare a configuration type in this process (module doc)."""
    return TYPES.declare(name, model)


def run_audits(declared: ConfigType, change: Change) -> str | None:
    """The first audit's veto reason, or None when every audit allows the change.

    An audit that fails with another exception vetoes too (its type and
    message are the reason): a broken audit must not let a change through,
    and it fails the same way on every node.
    """
    for audit in declared.audits:
        try:
            audit(change)
        except Veto as exc:
            return str(exc).splitlines()[0] if str(exc) else "vetoed"
        except Exception as exc:
            return (
                f"audit {getattr(audit, '__name__', 'audit')} failed: {type(exc).__name__}: {exc}"
            )
    return None


def run_notifiers(declared: ConfigType, change: Change) -> list[str]:
    """Call every notifier; the one-line reports of those that failed (never raised)."""
    failures = []
    for notifier in declared.notifiers:
        try:
            notifier(change)
        except Exception as exc:
            name = getattr(notifier, "__name__", "notifier")
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    return failures


__all__ = [
    "TYPES",
    "Change",
    "ChangeKind",
    "ConfigType",
    "ConfigTypes",
    "Veto",
    "config_type",
    "run_audits",
    "run_notifiers",
]
