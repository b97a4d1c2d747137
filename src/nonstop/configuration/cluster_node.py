"""The node's cluster node with the configuration table: :class:`ConfiguredClusterNode`.

:class:`~nonstop.ha.cluster_node.HaClusterNode` plus the
:class:`~nonstop.configuration.table.ConfigTable` registered as a table of its
log, and ``{"op": "config"}`` (changes), ``config.list``, ``config.show`` and ``config.effective``
requests (:mod:`nonstop.configuration.requests`).
``{"op": "status"}`` gains ``"configurations"`` (the versions, without data).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from nonstop.cluster.node import ClusterConfig
from nonstop.configuration.requests import CHANGES, OP, READ_OPS, ConfigRequests, rejected
from nonstop.configuration.table import TABLE, ConfigTable
from nonstop.configuration.types import ConfigTypes
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.failover import PromoterConfig
from nonstop.ha.lease import LeaseConfig
from nonstop.ha.policies import PartitionDef
from nonstop.runtime.interface import Action, ClientRequest, Event, Notify, Reply


class ConfiguredClusterNode(HaClusterNode):
    """HaClusterNode + the configuration table (module doc)."""

    def __init__(
        self,
        config: ClusterConfig,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        layout: Sequence[PartitionDef] = (),
        promoter: PromoterConfig | None = None,
        lease: LeaseConfig | None = None,
        types: ConfigTypes | None = None,
    ) -> None:
        super().__init__(config, rng, recovered, layout, promoter, lease)
        self.config_table = ConfigTable(types, self.name)
        self.register_table(self.config_table)
        self.config_requests = ConfigRequests(
            self.config_table, self.name, retry=(promoter or PromoterConfig()).retry
        )

    def handle(self, event: Event) -> list[Action]:
        now = event.now
        payload = event.payload if isinstance(event, ClientRequest) else None
        op = payload.get("op") if isinstance(payload, dict) else None
        out: list[Action]
        if isinstance(event, ClientRequest) and isinstance(payload, dict) and op in READ_OPS:
            out = [self.config_requests.read(event.request_id, {**payload, "do": READ_OPS[op]})]
        elif isinstance(event, ClientRequest) and isinstance(payload, dict) and op == OP:
            out = self._config_request(now, event.request_id, payload)
        else:
            out = super().handle(event)
        out += self._restored(out)
        out += self.config_requests.answers(out, self.incarnation)
        if len(self.config_requests):
            resend, replies = self.config_requests.due(now)
            out += replies
            for entry in resend:
                more = self.submit(now, TABLE, entry)
                out += more
                out += self.config_requests.answers(more, self.incarnation)
        return out

    def _restored(self, actions: list[Action]) -> list[Action]:
        """Tell the notifiers the active versions after a snapshot was installed here."""
        for action in actions:
            if (
                isinstance(action, Notify)
                and action.kind == "applied"
                and action.data.get("kind") == "snapshot"
            ):
                return self.config_table.restored_actions()
        return []

    def _config_request(self, now: float, request_id: int, payload: dict[str, Any]) -> list[Action]:
        do = payload.get("do")
        if do not in CHANGES:
            reads = ", ".join(f"op {op}" for op in READ_OPS)
            message = f"config: do must be one of {', '.join(CHANGES)} (reads: {reads})"
            return [Reply(request_id, rejected(message))]
        disabled = None if self.enabled else f"node {self.name} has no quorum (Disabled)"
        entry, refusal = self.config_requests.start(
            now, request_id, payload, self.applied_index, disabled
        )
        if refusal is not None:
            return [refusal]
        assert entry is not None
        return self.submit(now, TABLE, entry)

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["configurations"] = self.config_table.rows()
        return status


__all__ = ["ConfiguredClusterNode"]
