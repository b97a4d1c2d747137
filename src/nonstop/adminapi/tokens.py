"""Session tokens of the admin API: signed, expiring, bound to one cluster.

A token is ``v1.<payload>.<mac>``: the payload is base64url JSON
``{"u": user, "exp": unix seconds}``, the MAC is HMAC-SHA256 over ``v1.<payload>``
with the cluster's session key (:func:`session_key`: derived from the cluster
secret, so every node of the cluster accepts a token any node issued, and a
token of another cluster is forged here).  Roles are *not* in the token: they
are looked up at every request, so a role taken away takes effect at once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time

VERSION = "v1"
MAX_TOKEN = 1024


class BadToken(Exception):
    """The token is malformed, forged (wrong MAC) or expired; the message says which."""


def session_key(cluster_secret: bytes) -> bytes:
    """The key tokens are signed with: a function of the cluster secret, used for nothing else."""
    return hmac.new(cluster_secret, b"nonstop admin session key v1", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionTokens:
    def __init__(self, key: bytes, ttl: float) -> None:
        self._key = key
        self.ttl = ttl

    def _mac(self, signed: str) -> str:
        return _b64(hmac.new(self._key, signed.encode("ascii"), hashlib.sha256).digest())

    def issue(self, user: str, now: float | None = None) -> tuple[str, float]:
        """A token for ``user`` and when it expires (unix seconds)."""
        expires = (time.time() if now is None else now) + self.ttl
        payload = _b64(json.dumps({"u": user, "exp": int(expires)}).encode())
        signed = f"{VERSION}.{payload}"
        return f"{signed}.{self._mac(signed)}", float(int(expires))

    def verify(self, token: str, now: float | None = None) -> str:
        """The user of a valid token; :class:`BadToken` otherwise."""
        if len(token) > MAX_TOKEN or token.count(".") != 2:
            raise BadToken("malformed token")
        version, payload, mac = token.split(".")
        if version != VERSION:
            raise BadToken("malformed token")
        if not hmac.compare_digest(mac, self._mac(f"{version}.{payload}")):
            raise BadToken("forged token (bad signature)")
        try:
            claims = json.loads(_unb64(payload))
            user, expires = claims["u"], claims["exp"]
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise BadToken("malformed token") from None
        if not isinstance(user, str) or not isinstance(expires, int):
            raise BadToken("malformed token")
        if (time.time() if now is None else now) >= expires:
            raise BadToken("expired token")
        return user


__all__ = ["BadToken", "SessionTokens", "session_key"]
