"""The configuration table as a table of the cluster log: :class:`ConfigTable`.

Every change of configuration -- loads, activations, deactivations, removals,
or several at once (a component's files, ``config load --activate``) -- is one
entry of the cluster log, applied on every node in log order, all or nothing::

    {"cfg": "change", "q": 7, "ops": [{"do": "load", "type", "name", "version",
     "data", "file"}, {"do": "activate", ...}], "revs": [[type, name, rev], ...],
     "r": [node, incarnation]}

``revs`` is the precondition: each configuration the entry touches at the
revision (log index of its last change) the requester audited it at.  The
requester ran the types' audits (:func:`~nonstop.configuration.state.plan`
with the types); applying re-checks only the life-cycle rules and the
precondition -- a function of the log alone, so every node reaches the same
state whatever application code it runs (configuration.md).

Applying notifies ``cfg.changed`` (``by`` = the entry's ``r``, ``q``, the
changes) or ``cfg.rejected`` (``by``, ``q``, ``reason``), and calls the
notifiers of the types this node declares.  Its state is in every snapshot
under ``"cfg"``; a node that restores a snapshot tells the notifiers of each
active version (``activate``), so a restarted node's application learns its
configuration.

A version may apply to some nodes only (``applies_to``, :mod:`scope`): it is
stored on every node all the same, but a node's notifiers hear only of the
versions that apply to it, and :meth:`ConfigTable.effective` lists only those.
When a group's active version changes its nodes, the nodes that enter or
leave a version's scope hear ``activate`` or ``deactivate`` of it.
"""

from __future__ import annotations

from typing import Any

from nonstop.cluster.tables import REQUESTER
from nonstop.configuration.groups import GROUP_TYPE
from nonstop.configuration.scope import applies
from nonstop.configuration.state import (
    ConfigState,
    Key,
    Refused,
    change_for_notifiers,
    plan,
    scoped_group,
)
from nonstop.configuration.types import TYPES, Change, ConfigTypes, run_notifiers
from nonstop.runtime.interface import Action, Log, NodeId, Notify

TABLE = "cfg"
"""The table's name: the tag of its entries, its message kind and its snapshot key."""
CHANGE = "change"


def change_entry(
    q: int, ops: list[dict[str, Any]], state: ConfigState, label: str = ""
) -> dict[str, Any]:
    """The log entry for ``ops`` audited against ``state`` (module doc).

    A version applied to a group also carries the group's revision, so that a change
    of the group in between (deactivated: the version would apply to no node) refuses it.
    """
    touched = {(str(op["type"]), str(op["name"])) for op in ops}
    for op in ops:
        scope = op.get("applies_to")
        group = scope.get("group") if isinstance(scope, dict) else None
        if op.get("do") == "activate":
            versions = state.configs.get((str(op["type"]), str(op["name"])), {})
            group = scoped_group(versions.get(str(op.get("version"))))
        if isinstance(group, str):
            touched.add((GROUP_TYPE, group))
    keys = sorted(touched)
    entry: dict[str, Any] = {
        TABLE: CHANGE,
        "q": q,
        "ops": ops,
        "revs": [[t, n, state.rev((t, n))] for t, n in keys],
    }
    if label:
        entry["label"] = label
    return entry


def well_formed(entry: dict[str, Any]) -> bool:
    ops, revs, q = entry.get("ops"), entry.get("revs"), entry.get("q")
    return (
        entry.get(TABLE) == CHANGE
        and isinstance(q, int)
        and isinstance(ops, list)
        and bool(ops)
        and all(isinstance(op, dict) for op in ops)
        and isinstance(revs, list)
        and all(
            isinstance(r, list)
            and len(r) == 3
            and isinstance(r[0], str)
            and isinstance(r[1], str)
            and isinstance(r[2], int)
            for r in revs
        )
    )


class ConfigTable:
    """The configuration versions applied from the cluster log (module doc)."""

    def __init__(self, types: ConfigTypes | None = None, me: str | None = None) -> None:
        self.types = types if types is not None else TYPES
        self.me = me
        """This node's name: its notifiers hear of the versions that apply to it (None:
        every version, a table read outside a node)."""
        self.state = ConfigState()
        self.version = 0
        """+1 whenever the table changed here (an applied change, a snapshot installed)."""

    @property
    def name(self) -> str:
        return TABLE

    # ------------------------------------------------------------ LogTable
    def forwarded(self, sender: NodeId, entry: dict[str, Any]) -> dict[str, Any] | None:
        return dict(entry) if well_formed(entry) else None

    def request_key(self, entry: dict[str, Any]) -> tuple[Any, ...]:
        return (entry.get(TABLE), entry.get("q"))

    def snapshot(self) -> dict[str, Any]:
        return self.state.to_plain()

    def restore(self, state: Any) -> None:
        self.state = ConfigState.from_plain(state)
        self.version += 1

    def restored_actions(self) -> list[Action]:
        """Tell the notifiers of every active version (after a snapshot was installed)."""
        out: list[Action] = []
        for t, n in sorted(self.state.configs):
            v = self._effective_version(self.state, (t, n))
            if v is not None:
                change = {"kind": "activate", "type": t, "name": n, "version": v}
                out += self._notify(change, self.state)
        return out

    def apply(self, index: int, entry: dict[str, Any]) -> list[Action]:
        by, q = entry.get(REQUESTER), entry.get("q")
        if not well_formed(entry):
            return [Log("error", f"configuration table: bad entry {entry!r:.80}")]
        try:
            for t, n, rev in entry["revs"]:
                now = self.state.rev((t, n))
                if now != rev:
                    raise Refused(
                        f"{t}/{n} changed while the request was checked (revision {rev}, "
                        f"now {now}); try again"
                    )
            new, changes = plan(self.state, entry["ops"], index)
        except Refused as exc:
            return [Notify("cfg.rejected", {"by": by, "q": q, "reason": str(exc)})]
        before, self.state = self.state, new
        if changes:
            self.version += 1
        actions: list[Action] = [
            Notify("cfg.changed", {"by": by, "q": q, "changes": changes, "index": index})
        ]
        for change in self._changes_here(changes, before):
            actions += self._notify(change, before)
        return actions

    # ------------------------------------------------------------ this node's view
    def _applies(self, state: ConfigState, key: Key, version: str | None) -> bool:
        record = state.configs.get(key, {}).get(version) if version is not None else None
        if record is None:
            return False
        return self.me is None or applies(record.scope, state, self.me)

    def _effective_version(self, state: ConfigState, key: Key) -> str | None:
        """The active version of ``key`` if it applies to this node."""
        active = state.active(key)
        return active if self._applies(state, key, active) else None

    def _changes_here(
        self, changes: list[dict[str, Any]], before: ConfigState
    ) -> list[dict[str, Any]]:
        """``changes`` as this node sees them (module doc): those of versions that apply
        here, a replace across scopes as the half that does, then the configurations whose
        active version entered or left this node's scope because a group changed."""
        out: list[dict[str, Any]] = []
        touched: set[Key] = set()
        for change in changes:
            key = (change["type"], change["name"])
            touched.add(key)
            kind, v, old_v = change["kind"], change["version"], change.get("old_version")
            if kind in ("load", "activate"):
                here = self._applies(self.state, key, v)
            elif kind in ("deactivate", "remove"):
                here = self._applies(before, key, v)
            else:  # replace
                new_here, old_here = (
                    self._applies(self.state, key, v),
                    self._applies(before, key, old_v),
                )
                if new_here != old_here:
                    kind = "activate" if new_here else "deactivate"
                    change = {**change, "kind": kind, "old_version": None}
                    if not new_here:
                        change["version"] = old_v
                here = new_here or old_here
            if here:
                out.append(change)
        if self.me is None:
            return out
        for key in sorted((set(before.configs) | set(self.state.configs)) - touched):
            was, now = (
                self._effective_version(before, key),
                self._effective_version(self.state, key),
            )
            if was != now:
                kind, v = ("activate", now) if now is not None else ("deactivate", was)
                out.append({"kind": kind, "type": key[0], "name": key[1], "version": v})
        return out

    def _notify(self, change: dict[str, Any], before: ConfigState) -> list[Action]:
        declared = self.types.get(change["type"])
        if declared is None or not declared.notifiers:
            return []
        seen: Change | None = change_for_notifiers(change, self.state, before, self.types)
        if seen is None:
            return [Log("warning", f"configuration {change['type']}: data does not fit the type")]
        return [
            Log("warning", f"configuration notifier of {change['type']} failed: {failure}")
            for failure in run_notifiers(declared, seen)
        ]

    # ------------------------------------------------------------ reading
    def rows(self) -> list[dict[str, Any]]:
        return self.state.rows()

    def effective(self, type_name: str | None = None) -> list[dict[str, Any]]:
        """The active versions that apply to this node (of one type), with their data."""
        return [
            {
                "type": t,
                "name": n,
                "version": v,
                "applies_to": self.state.configs[(t, n)][v].scope,
                "data": self.state.configs[(t, n)][v].data,
            }
            for (t, n) in sorted(self.state.configs)
            if type_name is None or t == type_name
            for v in [self._effective_version(self.state, (t, n))]
            if v is not None
        ]

    def show(self, type_name: str, name: str, version: str | None) -> list[dict[str, Any]]:
        """The versions of one configuration (or one version) with their data."""
        versions = self.state.configs.get((type_name, name), {})
        return [
            {
                "type": type_name,
                "name": name,
                "version": v,
                "state": r.state,
                "file": r.file,
                "loaded_at": r.loaded_at,
                "applies_to": r.scope,
                "data": r.data,
            }
            for v, r in sorted(versions.items())
            if version is None or v == version
        ]


__all__ = ["CHANGE", "TABLE", "ConfigTable", "change_entry", "well_formed"]
