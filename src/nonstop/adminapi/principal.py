"""Who is asking: the one place the admin API turns credentials into a user and roles.

:class:`Directory` is what the node gives the API (``nonstop.node.admin_http``):
the users of the cluster (the users table and the node's bootstrap admin,
``nonstop.node.access``).  A password is checked against the user's stored
verifier (scrypt, :mod:`nonstop.net.auth`), never stored or cached here.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    user: str
    roles: tuple[str, ...]
    how: str
    """``basic``, ``token``, or ``open`` (authentication is off on this node)."""


@dataclass
class Directory:
    """The users an admin API knows.

    ``check_password(user, password)``: the user's roles when the password is
    right, else None (unknown user or wrong password: the same answer and about
    the same time).  ``roles_of(user)``: the roles of a user named by a valid
    session token (None: the user was removed since).  ``enabled`` False: the
    node runs without authentication (``[auth] enabled = false``) and every
    request is an anonymous admin, as on its node port.
    """

    check_password: Callable[[str, str], list[str] | None]
    roles_of: Callable[[str], list[str] | None]
    enabled: bool = True


def verifier_matches(password: str, salt: bytes, n: int, r: int, p: int, stored_key: bytes) -> bool:
    """SCRAM's check of a plain password: H(HMAC(scrypt(password), "Client Key")) = StoredKey."""
    salted = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=2**28, dklen=32
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)


__all__ = ["Directory", "Principal", "verifier_matches"]
