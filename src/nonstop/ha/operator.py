"""Operators' partition commands, sans-I/O: ``define``, ``enable``, ``disable`` (ha.md section 2).

A client request ``{"op": "partition", "do": "define"|"enable"|"disable", "p": name,
"nodes": [[node, style], ...], "policy": name}`` becomes one entry of the
partition table, submitted by *this* node (the table's requester: enable and
disable change this node's own status, D7).  The reply waits for the entry to
be applied here: the partition as described afterwards, or the table's
rejection reason (one line naming the culprit).  The entry is resent every
``retry`` seconds while unanswered (a request can be dropped on its way to the
leader) and the reply is a timeout after ``timeout`` seconds.

:class:`OperatorRequests` keeps the requests in flight; the cluster node feeds
it the table's notifications and asks it what to resend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nonstop.cluster.tables import REQUESTER
from nonstop.ha.partition_table import (
    DEFINE,
    DISABLE,
    ENABLE,
    define_entry,
    disable_entry,
    enable_entry,
)
from nonstop.ha.policies import DistributionError, PartitionDef, check_node_list
from nonstop.runtime.interface import Action, Notify, Reply

OP = "partition"
"""The client op (``{"op": "partition", ...}``)."""
OPERATOR_POLICY = "operator"
"""The policy recorded for a partition an operator defines without naming one."""
DOS = (DEFINE, ENABLE, DISABLE)


def rejected(message: str) -> dict[str, Any]:
    return {"error": "Rejected", "message": message}


@dataclass(slots=True)
class _InFlight:
    request_id: int
    kind: str
    name: str
    entry: dict[str, Any]
    deadline: float
    resend_at: float


class OperatorRequests:
    """Operator requests waiting for their entry to be applied (module doc)."""

    def __init__(
        self,
        me: str,
        describe: Callable[[str], dict[str, Any] | None],
        retry: float = 0.5,
        timeout: float = 5.0,
    ) -> None:
        self.me = me
        self.describe = describe
        self.retry = retry
        self.timeout = timeout
        self._waiting: list[_InFlight] = []

    def start(
        self, now: float, request_id: int, payload: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, Reply | None]:
        """The entry to submit for a request, or the reply refusing it at once."""
        kind, name = payload.get("do"), payload.get("p")
        if kind not in DOS:
            return None, Reply(request_id, rejected(f"do must be one of {', '.join(DOS)}"))
        if not isinstance(name, str) or not name:
            return None, Reply(request_id, rejected(f"{kind} needs a partition name"))
        if kind == DEFINE:
            nodes = payload.get("nodes")
            policy = payload.get("policy") or OPERATOR_POLICY
            try:
                if not isinstance(nodes, list):
                    raise DistributionError(f"partition {name!r}: nodes must be a list")
                check_node_list(name, nodes)
            except DistributionError as exc:
                return None, Reply(request_id, rejected(str(exc)))
            if not isinstance(policy, str):
                return None, Reply(request_id, rejected("policy must be a name"))
            pairs = tuple((str(n), str(s)) for n, s in nodes)
            entry = define_entry(PartitionDef(name, pairs, policy))
        elif kind == ENABLE:
            entry = enable_entry(name)
        else:
            entry = disable_entry(name)
        self._waiting.append(
            _InFlight(request_id, kind, name, dict(entry), now + self.timeout, now + self.retry)
        )
        return entry, None

    def answers(self, actions: Iterable[Action]) -> list[Reply]:
        """Replies to the requests whose entry was applied (or rejected) among ``actions``."""
        if not self._waiting:
            return []
        out: list[Reply] = []
        for action in actions:
            if not isinstance(action, Notify) or action.kind not in ("pt.changed", "pt.rejected"):
                continue
            data = action.data
            if data.get("by") != self.me:
                continue
            for req in [w for w in self._waiting if (w.kind, w.name) == (data["kind"], data["p"])]:
                self._waiting.remove(req)
                if action.kind == "pt.rejected":
                    out.append(Reply(req.request_id, rejected(str(data.get("reason")))))
                else:
                    out.append(
                        Reply(req.request_id, {"ok": True, "partition": self.describe(req.name)})
                    )
        return out

    def due(self, now: float) -> tuple[list[dict[str, Any]], list[Reply]]:
        """Entries to resend now, and timeouts to answer."""
        resend: list[dict[str, Any]] = []
        replies: list[Reply] = []
        for req in list(self._waiting):
            if now >= req.deadline:
                self._waiting.remove(req)
                replies.append(
                    Reply(
                        req.request_id,
                        {
                            "error": "Timeout",
                            "message": f"{req.kind} of {req.name!r} was not applied within "
                            f"{self.timeout:g}s (no leader or no quorum?); try again",
                        },
                    )
                )
            elif now >= req.resend_at:
                req.resend_at = now + self.retry
                resend.append({k: v for k, v in req.entry.items() if k != REQUESTER})
        return resend, replies

    def __len__(self) -> int:
        return len(self._waiting)


__all__ = ["OP", "OPERATOR_POLICY", "OperatorRequests", "rejected"]
