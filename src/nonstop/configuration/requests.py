"""Configuration requests of clients, sans-I/O: ``{"op": "config", "do": ...}``.

Reads (ops ``config.list``, ``config.show`` and ``config.effective``, which a monitor may send) are
answered at once from the table as applied on this node.  Changes are checked
here -- the file parsed against its type, the life-cycle rules and every audit
run on the table as applied here -- and a
change that passes becomes one entry of the log (:func:`change_entry`), whose
reply waits until the entry is applied here: the changes, or the reason it was
refused (another change overtook it).  The entry is resent every ``retry``
seconds while unanswered and the reply is a timeout after ``timeout`` seconds,
as for the partition operators (:mod:`nonstop.ha.operator`).

Requests::

    {"op": "config.list"}
    {"op": "config.show", "type", "name", "version"?}
    {"op": "config.effective", "type"?}      (the active versions that apply to this node)
    {"op": "config", "do": "load", "files": [{"file": name, "text": toml}], "activate"?: bool,
     "applies_to"?: group name | [node, ...]} (for the files that do not say)
    {"op": "config", "do": "activate" | "remove", "type", "name", "version"}
    {"op": "config", "do": "deactivate", "type", "name", "version"?}
    {"op": "config", "do": "apply", "ops": [op, ...], "label"?}   (components)

A refusal is ``{"error": "Rejected", "message": <one line naming the culprit>}``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from nonstop.cluster.tables import REQUESTER
from nonstop.configuration.files import ConfigFileError, parse
from nonstop.configuration.scope import BadScope, describe, scope_of
from nonstop.configuration.state import ACTIVATE, DEACTIVATE, LOAD, REMOVE, Refused, plan
from nonstop.configuration.table import ConfigTable, change_entry
from nonstop.runtime.interface import Action, Notify, Reply

OP = "config"
"""The client op of changes (``{"op": "config", "do": ...}``): the ``admin`` permission."""
READ_OPS = {"config.list": "list", "config.show": "show", "config.effective": "effective"}
"""The client ops of reads, ``status`` permission (monitor role): op → ``do``."""
READS = ("list", "show", "effective")
CHANGES = ("load", ACTIVATE, DEACTIVATE, REMOVE, "apply")


def rejected(message: str) -> dict[str, Any]:
    return {"error": "Rejected", "message": message}


def _text(payload: dict[str, Any], key: str) -> str:
    value = payload.get(key)
    if not isinstance(value, str) or not value:
        raise Refused(f"{payload.get('do')} needs a configuration {key}")
    return value


def ops_of(payload: dict[str, Any], table: ConfigTable) -> list[dict[str, Any]]:
    """The operations a change request asks for; :class:`Refused` naming what is wrong."""
    do = payload.get("do")
    if do == "load":
        files = payload.get("files")
        if not isinstance(files, list) or not files:
            raise Refused("load needs at least one file")
        try:
            given = scope_of(payload.get("applies_to"))
        except BadScope as exc:
            raise Refused(str(exc)) from None
        ops: list[dict[str, Any]] = []
        for item in files:
            if not isinstance(item, dict):
                raise Refused("load: a file is {file, text}")
            name, text = item.get("file"), item.get("text")
            if not isinstance(name, str) or not isinstance(text, str):
                raise Refused("load: a file is {file, text}")
            try:
                cfg = parse(text, name, table.types)
            except ConfigFileError as exc:
                raise Refused(str(exc)) from None
            key = {"type": cfg.type, "name": cfg.name, "version": cfg.version}
            scope = cfg.applies_to if cfg.applies_to is not None else given
            if given is not None and scope != given:
                raise Refused(
                    f"{name}: the file applies to {describe(cfg.applies_to)}, the command "
                    f"to {describe(given)}; say it once"
                )
            load = {"do": LOAD, **key, "data": cfg.data, "file": cfg.file}
            if scope is not None:
                load["applies_to"] = scope
            ops.append(load)
            if payload.get("activate"):
                ops.append({"do": ACTIVATE, **key})
        return ops
    if do == "apply":
        given = payload.get("ops")
        if not isinstance(given, list) or not given or not all(isinstance(o, dict) for o in given):
            raise Refused("apply needs a list of operations")
        return [dict(o) for o in given]
    op: dict[str, Any] = {
        "do": do,
        "type": _text(payload, "type"),
        "name": _text(payload, "name"),
    }
    version = payload.get("version")
    if version is not None or do != DEACTIVATE:
        if isinstance(version, int) and not isinstance(version, bool):
            version = str(version)
        if not isinstance(version, str) or not version:
            raise Refused(f"{do} needs a version")
        op["version"] = version
    return [op]


@dataclass(slots=True)
class _InFlight:
    request_id: int
    q: int
    what: str
    entry: dict[str, Any]
    deadline: float
    resend_at: float


class ConfigRequests:
    """Configuration requests of clients and of the node itself (module doc)."""

    def __init__(
        self, table: ConfigTable, me: str, retry: float = 0.5, timeout: float = 5.0
    ) -> None:
        self.table = table
        self.me = me
        self.retry = retry
        self.timeout = timeout
        self._next_q = 1
        self._waiting: dict[int, _InFlight] = {}

    def read(self, request_id: int, payload: dict[str, Any]) -> Reply:
        if payload.get("do") == "list":
            return Reply(request_id, {"node": self.me, "configurations": self.table.rows()})
        if payload.get("do") == "effective":
            wanted = payload.get("type")
            if wanted is not None and not isinstance(wanted, str):
                return Reply(request_id, rejected("config.effective: type is a string"))
            effective = self.table.effective(wanted)
            return Reply(request_id, {"node": self.me, "configurations": effective})
        try:
            type_name, name = _text(payload, "type"), _text(payload, "name")
        except Refused as exc:
            return Reply(request_id, rejected(str(exc)))
        version = payload.get("version")
        versions = self.table.show(type_name, name, str(version) if version else None)
        if not versions:
            what = f"{type_name}/{name}" + (f" version {version}" if version else "")
            return Reply(request_id, rejected(f"no configuration {what} is loaded"))
        return Reply(request_id, {"node": self.me, "versions": versions})

    def start(
        self,
        now: float,
        request_id: int,
        payload: dict[str, Any],
        index: int,
        quorum: str | None = None,
    ) -> tuple[dict[str, Any] | None, Reply | None]:
        """The entry to submit for a change, or the reply refusing it at once.

        ``quorum`` is why this node cannot submit now (no quorum), None when it
        can: a change the file, life cycle or audits refuse is refused first.
        """
        do = payload.get("do")
        try:
            ops = ops_of(payload, self.table)
            _, changes = plan(self.table.state, ops, index + 1, self.table.types)
        except Refused as exc:
            return None, Reply(request_id, rejected(str(exc)))
        if not changes:
            return None, Reply(request_id, {"ok": True, "changes": []})  # nothing to do
        if quorum is not None:
            return None, Reply(request_id, rejected(quorum))
        q = self._next_q
        self._next_q += 1
        label = payload.get("label")
        label = label if isinstance(label, str) else ""
        entry = change_entry(q, ops, self.table.state, label)
        what = f"{do} " + ", ".join(f"{o['type']}/{o['name']}" for o in ops[:3])
        self._waiting[q] = _InFlight(
            request_id, q, what, dict(entry), now + self.timeout, now + self.retry
        )
        return entry, None

    def answers(self, actions: Iterable[Action], incarnation: int) -> list[Reply]:
        """Replies to the requests whose entry was applied (or refused) among ``actions``."""
        if not self._waiting:
            return []
        me = [self.me, incarnation]
        out: list[Reply] = []
        for action in actions:
            if not isinstance(action, Notify) or action.kind not in ("cfg.changed", "cfg.rejected"):
                continue
            data = action.data
            if data.get("by") != me:
                continue
            req = self._waiting.pop(data.get("q"), None)  # type: ignore[arg-type]
            if req is None:
                continue
            if action.kind == "cfg.rejected":
                out.append(Reply(req.request_id, rejected(str(data.get("reason")))))
            else:
                out.append(Reply(req.request_id, {"ok": True, "changes": data["changes"]}))
        return out

    def due(self, now: float) -> tuple[list[dict[str, Any]], list[Reply]]:
        """Entries to resend now, and timeouts to answer."""
        resend: list[dict[str, Any]] = []
        replies: list[Reply] = []
        for q, req in list(self._waiting.items()):
            if now >= req.deadline:
                del self._waiting[q]
                message = (
                    f"{req.what} was not applied within {self.timeout:g}s "
                    "(no leader or no quorum?); try again"
                )
                replies.append(Reply(req.request_id, {"error": "Timeout", "message": message}))
            elif now >= req.resend_at:
                req.resend_at = now + self.retry
                resend.append({k: v for k, v in req.entry.items() if k != REQUESTER})
        return resend, replies

    def __len__(self) -> int:
        return len(self._waiting)


__all__ = ["CHANGES", "OP", "READS", "READ_OPS", "ConfigRequests", "ops_of", "rejected"]
