"""The versions of every configuration and the rules of their life cycle (F1), pure.

State: for each configuration (type, name), its versions, each ``Inactive`` or
``Active`` (``Loaded`` and ``Removed`` are transient: a loaded version is
Inactive once its load applied, a removed one is gone, remembered only so that
activating it again says it was removed).  At most one version per
configuration is Active.

:func:`plan` applies a list of operations to a copy of the state -- all of
them or none (one refusal, one line naming the culprit, leaves the state as it
was).  The requesting node runs it *with* the types' audits to decide; every
node runs it again, *without* them, when the entry is applied from the log
(configuration.md, "Where audits run").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ValidationError

from nonstop.configuration.groups import GROUP_TYPE
from nonstop.configuration.scope import BadScope, Scope, checked, describe, group_nodes
from nonstop.configuration.types import Change, ChangeKind, ConfigTypes, run_audits

INACTIVE = "Inactive"
ACTIVE = "Active"
LOAD, ACTIVATE, DEACTIVATE, REMOVE = "load", "activate", "deactivate", "remove"
OPS = (LOAD, ACTIVATE, DEACTIVATE, REMOVE)

Key = tuple[str, str]
"""A configuration: (type, name)."""


class Refused(Exception):
    """A change the life cycle or an audit refuses; the message is one line."""


@dataclass(frozen=True, slots=True)
class Version:
    state: str
    data: dict[str, Any]
    file: str
    loaded_at: int
    """Log index of the entry that loaded it."""
    scope: Scope = None
    """The nodes it applies to (``scope.py``); None: every node."""


@dataclass
class ConfigState:
    """Every configuration's versions (module doc)."""

    configs: dict[Key, dict[str, Version]] = field(default_factory=dict)
    removed: set[tuple[str, str, str]] = field(default_factory=set)
    revs: dict[Key, int] = field(default_factory=dict)
    """Log index of each configuration's last change (the precondition of a request)."""

    def copy(self) -> ConfigState:
        return ConfigState(
            {k: dict(v) for k, v in self.configs.items()}, set(self.removed), dict(self.revs)
        )

    def rev(self, key: Key) -> int:
        return self.revs.get(key, 0)

    def active(self, key: Key) -> str | None:
        return next((v for v, r in self.configs.get(key, {}).items() if r.state == ACTIVE), None)

    # ------------------------------------------------------------ snapshot form
    def to_plain(self) -> dict[str, Any]:
        return {
            "c": [
                [t, n, v, r.state, r.data, r.file, r.loaded_at, r.scope]
                for (t, n), versions in sorted(self.configs.items())
                for v, r in sorted(versions.items())
            ],
            "x": sorted([list(k) for k in self.removed]),
            "r": sorted([t, n, i] for (t, n), i in self.revs.items()),
        }

    @classmethod
    def from_plain(cls, plain: Any) -> ConfigState:
        state = cls()
        if not plain:
            return state
        for row in plain.get("c", []):
            # Snapshots written before scopes existed have 7 fields (every node).
            t, n, v, st, data, file, at = row[:7]
            scope = checked(row[7]) if len(row) > 7 else None
            state.configs.setdefault((t, n), {})[v] = Version(st, dict(data), file, int(at), scope)
        state.removed = {(t, n, v) for t, n, v in plain.get("x", [])}
        state.revs = {(t, n): int(i) for t, n, i in plain.get("r", [])}
        return state

    def rows(self) -> list[dict[str, Any]]:
        """Every version, sorted: what ``config list --json`` prints."""
        return [
            {
                "type": t,
                "name": n,
                "version": v,
                "state": r.state,
                "file": r.file,
                "applies_to": r.scope,
            }
            for (t, n), versions in sorted(self.configs.items())
            for v, r in sorted(versions.items())
        ]


def _model(types: ConfigTypes | None, type_name: str) -> type[BaseModel] | None:
    declared = types.get(type_name) if types is not None else None
    return declared.model if declared is not None else None


def _instance(types: ConfigTypes | None, type_name: str, data: dict[str, Any]) -> BaseModel | None:
    model = _model(types, type_name)
    if model is None:
        return None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise Refused(f"{type_name}: data does not match the type: {exc.errors()[0]['msg']}")


def plan(
    state: ConfigState,
    ops: list[dict[str, Any]],
    index: int,
    types: ConfigTypes | None = None,
) -> tuple[ConfigState, list[dict[str, Any]]]:
    """Apply ``ops`` to a copy of ``state``: (new state, the changes) or :class:`Refused`.

    With ``types`` every change is also checked against its type (the data
    validates, every audit allows it) -- the requester's decision; without,
    only the life-cycle rules -- the log's replay.  ``index`` stamps loads
    and the configurations' revisions.
    """
    new = state.copy()
    changes: list[dict[str, Any]] = []
    for op in ops:
        change = _one(new, op, index, types)
        if change is not None:
            changes.append(change)
    return new, changes


def _audit(types: ConfigTypes | None, change: Change) -> None:
    declared = types.get(change.type) if types is not None else None
    if declared is None:
        return
    reason = run_audits(declared, change)
    if reason is not None:
        raise Refused(
            f"{change.kind} of {change.type}/{change.name} version {change.version} "
            f"vetoed by the audit: {reason}"
        )


def _one(
    state: ConfigState, op: dict[str, Any], index: int, types: ConfigTypes | None
) -> dict[str, Any] | None:
    """One operation on ``state`` (in place); the change it made, None for a no-op."""
    kind, t, n, v = op.get("do"), op.get("type"), op.get("name"), op.get("version")
    if kind not in OPS:
        raise Refused(f"unknown configuration operation {kind!r}")
    if not isinstance(t, str) or not isinstance(n, str) or not t or not n:
        raise Refused(f"{kind} needs a configuration type and name")
    if v is not None and not isinstance(v, str):
        raise Refused(f"{kind}: a version is a string, not {v!r}")
    key = (t, n)
    what = f"{t}/{n}"
    versions = state.configs.setdefault(key, {})
    active = state.active(key)
    audit_kind: ChangeKind
    if kind == DEACTIVATE:
        if active is None or (v is not None and v != active):
            raise Refused(f"deactivate {what}: {'version ' + v if v else 'no version'} is active")
        v = active
    if v is None:
        raise Refused(f"{kind} {what} needs a version")
    record = versions.get(v)
    if kind == LOAD:
        data = op.get("data")
        if not isinstance(data, dict):
            raise Refused(f"load {what} version {v}: no data")
        if types is not None and types.get(t) is None:
            known = ", ".join(types.names()) or "none"
            raise Refused(
                f"load {what} version {v}: unknown configuration type {t!r} (known: {known})"
            )
        scope = _scope_of_load(state, op, what, v, types)
        if record is not None:
            if record.data == data and record.scope == scope:
                return None  # the same file again (a retry): nothing to do
            raise Refused(
                f"load {what} version {v}: that version is loaded already with other data "
                f"(from {record.file}); give the file a new version"
            )
        _audit(types, Change("load", t, n, v, _instance(types, t, data)))
        versions[v] = Version(INACTIVE, data, str(op.get("file", "")), index, scope)
        state.removed.discard((t, n, v))
        state.revs[key] = index
        return _scoped({"kind": "load", "type": t, "name": n, "version": v}, scope)
    if record is None:
        if not versions:
            state.configs.pop(key, None)
        if (t, n, v) in state.removed:
            raise Refused(f"{kind} {what}: version {v} was removed; load its file again")
        known = ", ".join(sorted(versions)) or "none"
        raise Refused(f"{kind} {what}: unknown version {v} (loaded: {known})")
    if kind == ACTIVATE:
        if record.state == ACTIVE:
            return None  # already the active version (a retry): nothing to do
        if op.get("unless_active") and active is not None:
            return None  # a component's default: the version an operator activated stays
        if types is not None:
            _group_exists(state, record.scope, f"activate {what} version {v}")
        old = versions.get(active) if active is not None else None
        audit_kind = "replace" if old is not None else "activate"
        _audit(
            types,
            Change(
                audit_kind,
                t,
                n,
                v,
                _instance(types, t, record.data),
                _instance(types, t, old.data) if old is not None else None,
                active,
            ),
        )
        # One entry, one step: the old version goes Inactive as the new one goes Active.
        if old is not None and active is not None:
            versions[active] = replace(old, state=INACTIVE)
        versions[v] = replace(record, state=ACTIVE)
        state.revs[key] = index
        change = {"kind": audit_kind, "type": t, "name": n, "version": v, "old_version": active}
        return _scoped(change, record.scope)
    if kind == DEACTIVATE:
        if types is not None and t == GROUP_TYPE:
            _group_unused(state, n)
        _audit(types, Change("deactivate", t, n, v, _instance(types, t, record.data)))
        versions[v] = replace(record, state=INACTIVE)
        state.revs[key] = index
        return {"kind": "deactivate", "type": t, "name": n, "version": v}
    # REMOVE
    if record.state == ACTIVE:
        raise Refused(f"remove {what}: version {v} is active; deactivate it first")
    _audit(types, Change("remove", t, n, v, _instance(types, t, record.data)))
    del versions[v]
    if not versions:
        del state.configs[key]
    state.removed.add((t, n, v))
    state.revs[key] = index
    return {"kind": "remove", "type": t, "name": n, "version": v}


def _scoped(change: dict[str, Any], scope: Scope) -> dict[str, Any]:
    """``change`` naming the nodes it is for, when not every node (older readers see none)."""
    return change if scope is None else {**change, "applies_to": scope}


def _scope_of_load(
    state: ConfigState, op: dict[str, Any], what: str, v: str, types: ConfigTypes | None
) -> Scope:
    """The checked scope of a load op; with ``types`` (the requester) its group must exist."""
    try:
        scope = checked(op.get("applies_to"))
    except BadScope as exc:
        raise Refused(f"load {what} version {v}: {exc}") from None
    if scope is not None and op.get("type") == GROUP_TYPE:
        raise Refused(f"load {what} version {v}: a group applies to no nodes but its own")
    if types is not None:
        _group_exists(state, scope, f"load {what} version {v}")
    return scope


def _group_exists(state: ConfigState, scope: Scope, doing: str) -> None:
    """Refuse a scope naming a group without an active version (it would apply to no node)."""
    if scope is None or "group" not in scope or group_nodes(state, scope["group"]) is not None:
        return
    groups = sorted(n for (t, n) in state.configs if t == GROUP_TYPE and state.active((t, n)))
    known = ", ".join(groups) or "none"
    raise Refused(
        f"{doing}: unknown group {scope['group']!r} (active groups: {known}); load and "
        f"activate a {GROUP_TYPE} configuration of that name first, or name the nodes"
    )


def _group_unused(state: ConfigState, group: str) -> None:
    """Refuse deactivating a group an active version applies to (it would apply to none)."""
    for (t, n), versions in sorted(state.configs.items()):
        for v, record in sorted(versions.items()):
            if record.state == ACTIVE and record.scope == {"group": group}:
                raise Refused(
                    f"deactivate {GROUP_TYPE}/{group}: active {t}/{n} version {v} applies to "
                    f"{describe(record.scope)}; deactivate it first"
                )


def scoped_group(record: Version | None) -> str | None:
    """The group a version applies to (None: every node or named nodes)."""
    if record is None or record.scope is None:
        return None
    group = record.scope.get("group")
    return str(group) if group is not None else None


def change_for_notifiers(
    change: dict[str, Any], state: ConfigState, before: ConfigState, types: ConfigTypes
) -> Change | None:
    """The :class:`Change` notifiers of a locally declared type get (None: not declared)."""
    t, n, v = change["type"], change["name"], change["version"]
    model = _model(types, t)
    if model is None:
        return None
    record = state.configs.get((t, n), {}).get(v) or before.configs.get((t, n), {}).get(v)
    old_v = change.get("old_version")
    old = before.configs.get((t, n), {}).get(old_v) if old_v else None
    try:
        data = model.model_validate(record.data) if record is not None else None
        old_data = model.model_validate(old.data) if old is not None else None
    except ValidationError:
        return None
    return Change(change["kind"], t, n, v, data, old_data, old_v)


__all__ = [
    "ACTIVATE",
    "ACTIVE",
    "DEACTIVATE",
    "INACTIVE",
    "LOAD",
    "OPS",
    "REMOVE",
    "ConfigState",
    "Refused",
    "Version",
    "change_for_notifiers",
    "plan",
    "scoped_group",
]
