"""Who may scrape the node's metrics: :class:`MetricsGate` (docs/security.md "Metrics endpoint").

A scrape needs a user whose roles grant ``status`` (``monitor`` or above,
``nonstop.security.roles``): HTTP basic (Prometheus' ``basic_auth``) or
``Authorization: Bearer <token>`` from the admin API's login, checked by the
admin API's own :func:`nonstop.adminapi.principal.authenticate`.  Refusals are
logged with who and from where, as the admin API logs its own.

Why a cache: a basic credential costs one scrypt (tens of milliseconds of CPU)
per check, and Prometheus sends the same one every 15 s.  A successful check is
remembered for :data:`CACHE_SECONDS`, keyed by an HMAC (a random key of this
process) of user and password, so the cache holds no password nor a hash an
attacker could test guesses against offline.  A hit is still checked against
the users table: the user's roles are read afresh (a removed user or a revoked
role is refused at once) and the user's password version must be the one seen
at the check (a changed password drops the entry).  Failures are never cached.

The scrypt check runs in a worker thread, not on the node's event loop
(``nonstop.node.admin_http`` says why reading the users table there is safe).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from nonstop.adminapi.principal import (
    Directory,
    NotAuthenticated,
    Principal,
    authenticate,
    parse_authorization,
)
from nonstop.adminapi.tokens import SessionTokens
from nonstop.security.roles import STATUS, allows

log = logging.getLogger("nonstop.metrics")

CACHE_SECONDS = 60.0
CACHE_ENTRIES = 64
"""Bound on remembered credentials (a scraper or two per node); full: start afresh."""


class Refused(Exception):
    """A scrape refused: ``status`` 401 (who are you) or 403 (not allowed)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


@dataclass(frozen=True)
class _Remembered:
    user: str
    password_version: object
    expires: float


class MetricsGate:
    """Admits or refuses one scrape from its ``Authorization`` header (module doc)."""

    def __init__(
        self,
        directory: Directory,
        tokens: SessionTokens,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.tokens = tokens
        self.clock = clock
        self.scrypt_checks = 0
        self._key = os.urandom(32)
        self._cache: dict[bytes, _Remembered] = {}

    @property
    def open(self) -> bool:
        return not self.directory.enabled

    async def admit(self, authorization: str | None, peer: str) -> Principal:
        """The scraping principal; :class:`Refused` (logged) when it may not scrape."""
        basic, bearer = parse_authorization(authorization)
        try:
            principal = self._remembered(basic) if bearer is None else None
            if principal is None:
                principal = await self._check(basic, bearer)
        except NotAuthenticated as exc:
            self._log(peer, None, str(exc))
            raise Refused(exc.status, str(exc)) from None
        if not allows(principal.roles, STATUS):
            detail = f"roles {','.join(principal.roles)} do not grant {STATUS}"
            self._log(peer, principal, detail)
            raise Refused(403, detail)
        return principal

    async def _check(self, basic: tuple[str, str] | None, bearer: str | None) -> Principal:
        if basic is None or bearer is not None or self.open:
            return authenticate(self.directory, self.tokens, basic, bearer)
        self.scrypt_checks += 1
        version = self.directory.password_version(basic[0])
        principal = await asyncio.to_thread(authenticate, self.directory, self.tokens, basic, None)
        if len(self._cache) >= CACHE_ENTRIES:
            self._cache.clear()
        self._cache[self._cache_key(basic)] = _Remembered(
            basic[0], version, self.clock() + CACHE_SECONDS
        )
        return principal

    def _remembered(self, basic: tuple[str, str] | None) -> Principal | None:
        if basic is None or self.open:
            return None
        key = self._cache_key(basic)
        entry = self._cache.get(key)
        if entry is None:
            return None
        roles = self.directory.roles_of(entry.user)
        if (
            entry.expires <= self.clock()
            or roles is None
            or self.directory.password_version(entry.user) != entry.password_version
        ):
            del self._cache[key]
            return None
        return Principal(entry.user, tuple(roles), "basic")

    def _cache_key(self, basic: tuple[str, str]) -> bytes:
        user, password = basic
        message = user.encode() + b"\0" + password.encode()
        return hmac.new(self._key, message, hashlib.sha256).digest()

    @staticmethod
    def _log(peer: str, principal: Principal | None, detail: str) -> None:
        user = principal.user if principal else "anonymous"
        log.warning("metrics: refused a scrape for %s@%s: %s", user, peer, detail)


__all__ = ["CACHE_SECONDS", "MetricsGate", "Refused"]
