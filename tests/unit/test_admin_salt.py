"""The bootstrap admin's verifier has one salt per cluster, not one per node start.

A random salt on every node start made a client process run scrypt once per node
it reached (each Spark Python worker paid ~0.1 s of CPU per node): with the salt
derived from the cluster secret, one scrypt per process and password suffices.
"""

from __future__ import annotations

from pathlib import Path

from nonstop.client.credentials import write_credentials, write_secret
from nonstop.net import auth
from nonstop.node.access import NodeAccess
from nonstop.node.config import NodeConfig


def access(data: Path, secret: Path, admin: Path) -> NodeAccess:
    cfg = NodeConfig()
    cfg.data = str(data)
    cfg.auth.secret_file = str(secret)
    cfg.auth.admin_file = str(admin)
    return NodeAccess.from_config(cfg)


def test_every_node_and_restart_gets_the_same_admin_salt(tmp_path: Path) -> None:
    secret, other, admin = tmp_path / "s", tmp_path / "o", tmp_path / "admin.json"
    write_secret(secret)
    write_secret(other)
    write_credentials(admin, "admin", "pw")
    a, b = access(tmp_path / "A", secret, admin), access(tmp_path / "B", secret, admin)
    again = access(tmp_path / "A", secret, admin)
    assert a.admin_verifier is not None and b.admin_verifier is not None
    assert a.admin_verifier == b.admin_verifier == again.admin_verifier
    # Another cluster (secret) salts differently; the password still proves itself.
    c = access(tmp_path / "C", other, admin)
    assert c.admin_verifier is not None and c.admin_verifier.salt != a.admin_verifier.salt
    assert auth.make_verifier("pw", salt=a.admin_verifier.salt) == a.admin_verifier
