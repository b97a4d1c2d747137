"""Where a client's credential comes from, and the files that hold credentials.

A client proves a user's password (or, for a node asking to join, the cluster
secret) when it connects (:mod:`nonstop.net.challenge`).  Which credential, first
found wins:

1. ``user=`` and ``password=`` given to ``nonstop.connect``/``Client``;
2. ``credentials=``: a credentials file (or a :class:`~nonstop.net.auth.Password`);
3. the file named by the ``NONSTOP_CREDENTIALS`` environment variable;
4. the local cluster folder's ``credentials.json`` when the client found its
   addresses there (``nonstop.connect()`` with no address, the CLI's ``--dir``);
5. a credential this process read for those addresses before: a local cluster
   folder opened in this process (``nonstop.admin.local``, the demos and
   benchmarks) remembers its admin credential for its nodes' addresses.

None found: the client offers no proof, and a node that authenticates refuses it
with :class:`~nonstop.errors.AuthenticationFailed` naming these places.

A credentials file is JSON ``{"user": ..., "password": ...}`` readable only by
its owner (written with mode 0600 here; a file others may read is refused).  The
cluster secret is a separate file of hex text (``cluster.secret``, 0600).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

from nonstop.errors import AuthenticationFailed
from nonstop.net.auth import Credential, NodeKey, Password

CREDENTIALS_ENV = "NONSTOP_CREDENTIALS"
CREDENTIALS_FILE = "credentials.json"
"""The admin credential of a local cluster folder (``nonstop local up`` writes it)."""
SECRET_FILE = "cluster.secret"
"""The cluster secret of a local cluster folder."""


def write_private(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` readable only by its owner (0600), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _read_private(path: str | Path, what: str) -> str:
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthenticationFailed(
                f"{what} {path} may be read by others (mode {stat.S_IMODE(mode):o}): "
                f"chmod 600 {path}"
            )
        return path.read_text()
    except OSError as exc:
        raise AuthenticationFailed(f"cannot read {what} {path}: {exc.strerror}") from None


def new_password() -> str:
    return secrets.token_urlsafe(24)


def write_credentials(path: str | Path, user: str, password: str) -> None:
    write_private(path, json.dumps({"user": user, "password": password}) + "\n")


def load_credentials(path: str | Path) -> Password:
    """The user and password of a credentials file; ``AuthenticationFailed`` if unusable."""
    text = _read_private(path, "credentials file")
    try:
        data = json.loads(text)
        user, password = data["user"], data["password"]
    except (ValueError, KeyError, TypeError):
        raise AuthenticationFailed(
            f"credentials file {path} is not JSON with 'user' and 'password'"
        ) from None
    if not isinstance(user, str) or not isinstance(password, str) or not user:
        raise AuthenticationFailed(f"credentials file {path}: 'user' and 'password' are strings")
    return Password(user, password)


def new_secret() -> str:
    return secrets.token_hex(32)


def write_secret(path: str | Path, secret: str | None = None) -> None:
    write_private(path, (secret or new_secret()) + "\n")


def load_secret(path: str | Path) -> bytes:
    """The cluster secret in ``path`` (hex text, at least 16 bytes)."""
    text = _read_private(path, "cluster secret file").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise AuthenticationFailed(f"cluster secret file {path} is not hex text") from None
    if len(secret) < 16:
        raise AuthenticationFailed(f"cluster secret in {path} is shorter than 16 bytes")
    return secret


_REMEMBERED: dict[str, Credential] = {}


def remember_credential(addresses: list[str], credential: Credential) -> None:
    """Use ``credential`` by default for clients of these node addresses (this process)."""
    for address in addresses:
        _REMEMBERED[address] = credential


def resolve_credential(
    user: str | None = None,
    password: str | None = None,
    credentials: str | Path | Credential | None = None,
    folder: str | Path | None = None,
    addresses: list[str] | None = None,
) -> Credential | None:
    """The credential a client proves (module doc for the order); None: none found."""
    if user is not None or password is not None:
        if user is None or password is None:
            raise ValueError("give both user and password (or a credentials file)")
        return Password(user, password)
    if isinstance(credentials, Password | NodeKey):
        return credentials
    if credentials is not None:
        return load_credentials(credentials)
    env = os.environ.get(CREDENTIALS_ENV)
    if env:
        return load_credentials(env)
    if folder is not None:
        path = Path(folder) / CREDENTIALS_FILE
        if path.exists():
            return load_credentials(path)
    for address in addresses or ():
        if address in _REMEMBERED:
            return _REMEMBERED[address]
    return None


__all__ = [
    "CREDENTIALS_ENV",
    "CREDENTIALS_FILE",
    "SECRET_FILE",
    "load_credentials",
    "load_secret",
    "new_password",
    "new_secret",
    "remember_credential",
    "resolve_credential",
    "write_credentials",
    "write_private",
    "write_secret",
]
