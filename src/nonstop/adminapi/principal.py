"""Who is asking: the one place that turns HTTP credentials into a user and roles.

:class:`Directory` is what the node gives the admin API (``nonstop.node.admin_http``)
and the metrics endpoint (``nonstop.node.metrics_auth``): the users of the
cluster (the users table and the node's bootstrap admin, ``nonstop.node.access``).
A password is checked against the user's stored verifier (scrypt,
:mod:`nonstop.net.auth`), never stored or cached here.  :func:`authenticate` is
the framework-free check both use: HTTP basic or a session token → a
:class:`Principal`, else :class:`NotAuthenticated`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from nonstop.adminapi.tokens import BadToken, SessionTokens


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
    password_version: Callable[[str], object] = lambda _user: None
    """Something that changes when the user's password changes (its stored key):
    what lets a cache of a successful check (the metrics endpoint's) notice it."""
    ready: Callable[[str], bool] = lambda _user: True
    """Whether this user's entry can be trusted yet: False on a node that restarted
    and has not caught up with the cluster log (``ClusterNode.caught_up``)."""


class NotAuthenticated(Exception):
    """No, or a bad, credential; the message says which (for the log, and the 401)."""

    status = 401


class CatchingUp(NotAuthenticated):
    """The node cannot check this user yet (it is catching up with the cluster log): 503."""

    status = 503


def _ready(directory: Directory, user: str) -> None:
    if not directory.ready(user):
        raise CatchingUp(
            "this node is catching up with the cluster log since its start and checks "
            f"no user yet (user {user!r}): retry in a moment, or ask another node"
        )


def authenticate(
    directory: Directory,
    tokens: SessionTokens,
    basic: tuple[str, str] | None,
    bearer: str | None,
) -> Principal:
    """Basic ``(user, password)`` or a bearer token → :class:`Principal`; else
    :class:`NotAuthenticated`.  The bearer token wins when both are given."""
    if not directory.enabled:
        return Principal("anonymous", ("admin",), "open")
    if bearer is not None:
        try:
            user = tokens.verify(bearer)
        except BadToken as exc:
            raise NotAuthenticated(str(exc)) from None
        _ready(directory, user)
        roles = directory.roles_of(user)
        if roles is None:
            raise NotAuthenticated(f"user {user!r} of the token no longer exists")
        return Principal(user, tuple(roles), "token")
    if basic is not None:
        _ready(directory, basic[0])
        roles = directory.check_password(*basic)
        if roles is None:
            raise NotAuthenticated(f"bad user or password (user {basic[0]!r})")
        return Principal(basic[0], tuple(roles), "basic")
    raise NotAuthenticated("authentication required (HTTP basic, or a Bearer token from login)")


def parse_authorization(header: str | None) -> tuple[tuple[str, str] | None, str | None]:
    """An ``Authorization`` header → ``(basic, bearer)``, each None when absent or
    unreadable (then :func:`authenticate` answers "authentication required")."""
    scheme, _, value = (header or "").strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer" and value:
        return None, value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None, None
        user, sep, password = decoded.partition(":")
        if sep:
            return (user, password), None
    return None, None


def verifier_matches(password: str, salt: bytes, n: int, r: int, p: int, stored_key: bytes) -> bool:
    """SCRAM's check of a plain password: H(HMAC(scrypt(password), "Client Key")) = StoredKey."""
    salted = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=2**28, dklen=32
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key)


__all__ = [
    "Directory",
    "NotAuthenticated",
    "Principal",
    "authenticate",
    "parse_authorization",
    "verifier_matches",
]
