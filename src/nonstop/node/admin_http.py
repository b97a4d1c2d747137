"""Start the node's admin HTTP API and console (``[admin] listen``): :func:`start_admin`.

The composition of :mod:`nonstop.adminapi` for one node:

* the users: the node's bootstrap admin and the users table of the cluster log
  (``nonstop.node.access``, ``nonstop.security.users_table``), a password
  checked against the stored scrypt verifier; with ``[auth] enabled = false``
  the API is open like the node port (and says so in the log);
* session tokens signed with a key derived from the cluster secret, so a token
  from one node is good on every node of the cluster and on no other cluster;
* the commands run as the node's bootstrap admin against the node's own
  address, after the API checked the HTTP user's roles against the command's
  permission (docs/security.md "Admin HTTP API"); the application commands of
  the node's modules (``nonstop.commands.application``) are among them;
* HTTPS with the node's certificate when the node's TLS is configured;
* the console's views of this node (:func:`node_views`): a sampler task on the
  node's loop that keeps the last five minutes of metric samples
  (``metrics_samples``, from the same ``DataObserver`` as the metrics endpoint:
  one is attached if ``[metrics]`` did not), and the tail of ``log_file``
  (``log_tail``).

The password check runs in the API's worker threads (scrypt must not stall the
loop): it reads one user's record of the users table with dict lookups, and the
loop changes a record by assigning its fields (each atomic under the GIL), so a
check sees each field before or after a change, never half of one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nonstop.adminapi.app import build_app
from nonstop.adminapi.principal import Directory, verifier_matches
from nonstop.adminapi.server import AdminServer, serve_admin
from nonstop.adminapi.tokens import SessionTokens, session_key
from nonstop.adminapi.views import NodeViews
from nonstop.commands.application import application_commands
from nonstop.commands.cluster_commands import read_status
from nonstop.commands.context import CommandContext
from nonstop.commands.failure import CommandError
from nonstop.commands.registry import load_all
from nonstop.errors import Error
from nonstop.net.auth import decoy_verifier
from nonstop.net.tls import TLSConfig
from nonstop.node.access import NodeAccess, cluster_caught_up
from nonstop.node.config import NodeConfig
from nonstop.node.log_tail import tail_events
from nonstop.node.machine import users_table
from nonstop.node.metrics import attach
from nonstop.node.metrics_auth import MetricsGate
from nonstop.node.metrics_samples import INTERVAL, Reading, SampleRing, read, sample_forever
from nonstop.security.roles import ADMIN, allows

log = logging.getLogger("nonstop.node")


def node_directory(access: NodeAccess, machine: Any) -> Directory:
    """The users of this node: its bootstrap admin, then the users table (module doc)."""
    if not access.enabled:
        return Directory(lambda _u, _p: [ADMIN], lambda _u: [ADMIN], enabled=False)
    roles_of = access.roles_lookup(lambda: users_table(machine()))
    decoy_key = os.urandom(32)

    def check_password(user: str, password: str) -> list[str] | None:
        admin = access.admin
        if admin is not None and user == admin.user:
            same = hmac.compare_digest(password.encode(), admin.password.encode())
            return [ADMIN] if same else None
        table = users_table(machine())
        found = None if table is None else table.lookup(user)
        # An unknown user costs the same scrypt as a known one (no user enumeration by time).
        verifier, roles = found if found is not None else (decoy_verifier(decoy_key, user), None)
        v = verifier
        ok = verifier_matches(password, v.salt, v.n, v.r, v.p, v.stored_key)
        return list(roles) if ok and roles is not None else None

    def password_version(user: str) -> object:
        admin = access.admin
        if admin is not None and user == admin.user:
            return hashlib.sha256(admin.password.encode()).digest()
        table = users_table(machine())
        found = None if table is None else table.lookup(user)
        return None if found is None else found[0].stored_key

    def ready(user: str) -> bool:
        admin = access.admin
        return (admin is not None and user == admin.user) or cluster_caught_up(machine())

    return Directory(check_password, roles_of, password_version=password_version, ready=ready)


def self_client_options(cfg: NodeConfig, access: NodeAccess) -> dict[str, Any]:
    """Client options for this node's own tools to reach it (the admin API's commands, the
    application commands): its TLS, its bootstrap admin credential."""
    client_tls = TLSConfig(cert=cfg.tls.cert, key=cfg.tls.key, ca=cfg.tls.ca)
    options: dict[str, Any] = {"tls": client_tls if client_tls.enabled else None}
    if access.admin is not None:
        options["credentials"] = access.admin
    return options


def node_sessions(cfg: NodeConfig, access: NodeAccess) -> SessionTokens:
    """The session tokens of the cluster: signed with a key derived from its secret
    (without one, a key of this process: its tokens are good on this node only)."""
    key = session_key(access.secret) if access.secret is not None else os.urandom(32)
    return SessionTokens(key, cfg.admin.session_ttl)


def metrics_gate(runtime: Any, cfg: NodeConfig) -> MetricsGate:
    """Who may scrape this node's metrics: its users allowed ``status`` (metrics_auth)."""
    access = NodeAccess.from_config(cfg)
    return MetricsGate(node_directory(access, lambda: runtime.machine), node_sessions(cfg, access))


def node_views(
    runtime: Any, cfg: NodeConfig
) -> tuple[NodeViews, SampleRing, Callable[[], Reading]]:
    """The console's samples and logs of this node, the ring its sampler must feed and
    the reading that feeds it."""
    observer = attach(runtime, cfg.metrics.latency_buckets)
    ring = SampleRing()

    def samples(since: float) -> dict[str, Any]:
        return {
            "node": cfg.name,
            "interval": INTERVAL,
            "capacity": ring.samples.maxlen,
            "samples": ring.rows_after(since),
        }

    def logs(level: str | None, limit: int, contains: str) -> dict[str, Any]:
        return tail_events(cfg.log_file, cfg.name, level, limit, contains)

    return NodeViews(samples=samples, logs=logs), ring, lambda: read(runtime, observer)


def member_samples(context: CommandContext, node: str, since: float) -> dict[str, Any]:
    """Member ``node``'s samples after ``since``, asked over its node port (op ``samples``)
    with this node's bootstrap admin credential; :class:`CommandError` when it cannot."""
    _, status = read_status(context)
    address = next((n.get("address") for n in status.get("nodes", []) if n["name"] == node), None)
    if not address:
        raise CommandError(f"{node} is no node of this cluster", "usage")
    try:
        reply = context.ask_node(str(address), {"op": "samples", "since": since})
    except (Error, OSError) as exc:
        raise CommandError(
            f"node {node} at {address} does not answer: {exc}", "unavailable"
        ) from None
    if not isinstance(reply, dict) or "error" in reply:
        detail = reply.get("message") if isinstance(reply, dict) else repr(reply)
        raise CommandError(f"node {node}: {detail}", "unavailable")
    return reply


async def start_admin(runtime: Any, cfg: NodeConfig, cluster_id: str) -> AdminServer | None:
    """Serve the admin API on ``cfg.admin.listen`` (None: not configured); ``OSError``."""
    if cfg.admin.listen is None:
        return None
    access = NodeAccess.from_config(cfg)
    if not access.enabled:
        log.warning(
            "admin API on %s is open ([auth] enabled = false): anyone who reaches it "
            "may run any command",
            cfg.admin.listen,
        )
    options = self_client_options(cfg, access)

    def context() -> CommandContext:
        return CommandContext(
            addresses=[cfg.listen], cluster=cluster_id, timeout=3.0, options=options
        )

    views, ring, take = node_views(runtime, cfg)
    views = replace(views, samples_of=lambda node, since: member_samples(context(), node, since))
    router = getattr(runtime, "router", None)
    if router is not None and hasattr(router, "samples"):
        router.samples = views.samples  # op `samples`: other nodes' consoles chart this one
    app = build_app(
        {**load_all(), **application_commands()},
        node_directory(access, lambda: runtime.machine),
        node_sessions(cfg, access),
        context,
        allows,
        node=cfg.name,
        body_limit=cfg.admin.max_body,
        views=views,
    )
    cert = (cfg.tls.cert, cfg.tls.key) if cfg.tls.cert and cfg.tls.key else None
    admin = await serve_admin(app, cfg.admin.listen, cert)
    admin.companion(asyncio.ensure_future(sample_forever(ring, take)))
    return admin


__all__ = [
    "metrics_gate",
    "node_directory",
    "node_sessions",
    "node_views",
    "self_client_options",
    "start_admin",
]
