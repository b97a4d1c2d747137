"""A node's authentication material: the cluster secret and the bootstrap admin (G5).

Read from the ``[auth]`` keys of the configuration when the node starts
(docs/security.md):

* the **cluster secret** (``auth.secret_file``, default ``DATA/cluster.secret``):
  what members prove to each other.  A node that joins no one and has none gets a
  new one; a node told to join others must be given the cluster's (the same file
  on every node), else it could never prove membership -- refused at start;
* the **bootstrap admin** (``auth.admin_file``, default
  ``DATA/admin.credentials.json``): a credentials file whose user has the ``admin``
  role on this node whatever the users table says, so a fresh cluster can be
  administered (and a forgotten table cannot lock the operator out).  Written
  (0600) when the default file is missing: a copy of ``$NONSTOP_CREDENTIALS`` when
  the node's environment names one, else a generated password.  Its verifier is
  computed once here, with a salt derived from the cluster secret (:func:`admin_salt`).

Every other user comes from the users table of the cluster log
(:mod:`nonstop.security.users_table`), looked up at each handshake and request.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nonstop.client.credentials import (
    CREDENTIALS_ENV,
    load_credentials,
    load_secret,
    new_password,
    write_credentials,
    write_secret,
)
from nonstop.errors import AuthenticationFailed
from nonstop.net.auth import SALT_BYTES, Password, Verifier, make_verifier
from nonstop.net.challenge import Guard
from nonstop.node.config import ConfigError, NodeConfig
from nonstop.security.roles import ADMIN

log = logging.getLogger("nonstop.node")

DEFAULT_SECRET = "cluster.secret"
DEFAULT_ADMIN = "admin.credentials.json"


@dataclass
class NodeAccess:
    """The secret and the bootstrap admin of one node (None when authentication is off)."""

    secret: bytes | None = None
    admin: Password | None = None
    admin_verifier: Verifier | None = None

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    @classmethod
    def from_config(cls, cfg: NodeConfig) -> NodeAccess:
        if not cfg.auth.enabled:
            log.warning(
                "authentication is off ([auth] enabled = false): anyone who reaches %s "
                "may do anything",
                cfg.listen,
            )
            return cls()
        data = Path(cfg.data)
        try:
            secret = load_secret(_secret_path(cfg, data))
            admin = load_credentials(_admin_path(cfg, data))
        except AuthenticationFailed as exc:
            raise ConfigError(str(exc)) from None
        return cls(secret, admin, make_verifier(admin.password, salt=admin_salt(secret, admin)))

    def guard(
        self, table: Callable[[], Any], caught_up: Callable[[], bool] = lambda: True
    ) -> Guard | None:
        """The runtime's :class:`~nonstop.net.challenge.Guard`; users from ``table()``.

        ``caught_up()`` says whether the node applied the cluster log as far as a
        leader has it since the node started: until then the table may still hold
        a user removed (or a password changed) while the node was down, so only
        the bootstrap admin of the node's own configuration is checked.
        """
        if self.secret is None:
            return None

        def verifier_of(user: str) -> Verifier | None:
            if self.admin is not None and user == self.admin.user:
                return self.admin_verifier
            users = table()
            found = None if users is None else users.lookup(user)
            return None if found is None else found[0]

        def ready(user: str) -> bool:
            return (self.admin is not None and user == self.admin.user) or caught_up()

        return Guard(self.secret, verifier_of, ready)

    def roles_lookup(self, table: Callable[[], Any]) -> Callable[[str], list[str] | None]:
        def roles_of(user: str) -> list[str] | None:
            if self.admin is not None and user == self.admin.user:
                return [ADMIN]
            users = table()
            found = None if users is None else users.lookup(user)
            return None if found is None else found[1]

        return roles_of


def cluster_caught_up(machine: Any) -> bool:
    """``ClusterNode.caught_up`` of a node's machine (True for one without a cluster log)."""
    cluster = getattr(machine, "cluster", machine)
    return bool(getattr(cluster, "caught_up", True))


def admin_salt(secret: bytes, admin: Password) -> bytes:
    """The bootstrap admin verifier's salt: the same on every node of a cluster and across
    restarts (derived from the cluster secret).  A random salt per node start made every
    client process run scrypt (~0.1 s of CPU) once per node it reaches -- each Spark
    Python worker, for every node -- where one per process and password suffices."""
    mac = hmac.new(secret, b"nonstop/bootstrap-admin-salt/" + admin.user.encode(), "sha256")
    return mac.digest()[:SALT_BYTES]


def _secret_path(cfg: NodeConfig, data: Path) -> Path:
    if cfg.auth.secret_file:
        path = Path(cfg.auth.secret_file)
        if not path.exists():
            raise ConfigError(f"auth.secret_file {path} does not exist")
        return path
    path = data / DEFAULT_SECRET
    if not path.exists():
        if cfg.join:
            raise ConfigError(
                "a node that joins others needs the cluster's secret: set auth.secret_file "
                "to a copy of the file the other nodes use (or auth.enabled = false)"
            )
        data.mkdir(parents=True, exist_ok=True)
        write_secret(path)
        log.info("new cluster secret written to %s (copy it to every node of the cluster)", path)
    return path


def _admin_path(cfg: NodeConfig, data: Path) -> Path:
    if cfg.auth.admin_file:
        path = Path(cfg.auth.admin_file)
        if not path.exists():
            raise ConfigError(f"auth.admin_file {path} does not exist")
        return path
    path = data / DEFAULT_ADMIN
    if not path.exists():
        data.mkdir(parents=True, exist_ok=True)
        # Like `local up`: the operator's own credential when it names one.
        env = os.environ.get(CREDENTIALS_ENV)
        given = load_credentials(env) if env else Password("admin", new_password())
        write_credentials(path, given.user, given.password)
        log.info("bootstrap admin credentials (user %s) written to %s", given.user, path)
    return path


__all__ = ["NodeAccess"]
