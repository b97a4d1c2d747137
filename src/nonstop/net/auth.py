"""Proof of who is at the other end of a connection: cluster members and users (G5).

Sans-I/O: values in, frames out; :mod:`nonstop.net.connection` and the
blocking client channel move the frames.  Two schemes, chosen by the dialer in
its hello (``auth``) and answered by the acceptor's *challenge*:

* ``node`` -- a member proves it holds the **cluster secret** (a file every
  node of the cluster has): HMAC-SHA256 with the secret over the transcript
  (both nonces, the cluster id, both names and everything the dialer's hello
  claims).  The acceptor answers with its own HMAC over the same transcript,
  so the dialer knows it reached a member too.
* ``user`` -- a user proves the password without sending it, SCRAM-style
  (RFC 5802/7677) with ``hashlib.scrypt`` as the slow hash: the node stores
  per user a salt, the scrypt parameters, ``StoredKey = SHA256(ClientKey)`` and
  ``ServerKey`` (:class:`Verifier`; neither lets anyone log in), sends the salt
  and parameters in its challenge, and checks ``ClientProof = ClientKey XOR
  HMAC(StoredKey, transcript)``.  The slow hash runs on the client (once per
  process and password: :func:`salted_password` is cached); a node only
  computes HMACs, so a flood of logins cannot make it hash.

Every comparison is :func:`hmac.compare_digest`.  The acceptor's nonce is new
for every connection, so a recorded proof is worth nothing on another one.
Nothing a dialer says before its proof is checked changes any state: the
acceptor answers a hello with a challenge only (see ``connection.accept``).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Any

from nonstop.net.plain import pack

NONCE_BYTES = 16
SCHEME_NODE = "node"
SCHEME_USER = "user"
SCHEMES = (SCHEME_NODE, SCHEME_USER)

KDF_N = 2**14
KDF_R = 8
KDF_P = 1
"""scrypt cost: 16 MiB of memory and ~50-90 ms per hash here (RFC 7914's interactive
setting); stored with every verifier, so raising it later keeps old users working."""
KDF_MAXMEM = 64 * 1024 * 1024
SALT_BYTES = 16
KEY_BYTES = 32


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


# ------------------------------------------------------------------ principals
@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection proved to be: a cluster member (``node``) or a user (``user``).

    ``open`` is a connection to a node that does not authenticate (``[auth]
    enabled = false``): every op is allowed, as before authentication existed.
    """

    kind: str
    name: str


OPEN = Principal("open", "")


# ------------------------------------------------------------------ credentials
@dataclass(frozen=True, slots=True)
class NodeKey:
    """The cluster secret: what a member (or a node asking to join) proves it holds."""

    secret: bytes

    def __repr__(self) -> str:  # never print the secret
        return "NodeKey(<secret>)"


@dataclass(frozen=True, slots=True)
class Password:
    """A user's name and password (the password never leaves this process)."""

    user: str
    password: str

    def __repr__(self) -> str:
        return f"Password(user={self.user!r}, password=<hidden>)"


Credential = NodeKey | Password


# ------------------------------------------------------------------ verifiers
@dataclass(frozen=True, slots=True)
class Verifier:
    """What a node keeps of a user's password: enough to check a proof, not to make one."""

    salt: bytes
    n: int
    r: int
    p: int
    stored_key: bytes
    server_key: bytes

    def to_wire(self) -> dict[str, Any]:
        return {
            "salt": self.salt,
            "kdf": [self.n, self.r, self.p],
            "stored": self.stored_key,
            "server": self.server_key,
        }

    @classmethod
    def from_wire(cls, value: Any) -> Verifier:
        """Parse :meth:`to_wire`; ``ValueError`` when it is not one."""
        try:
            n, r, p = (int(x) for x in value["kdf"])
            out = cls(bytes(value["salt"]), n, r, p, bytes(value["stored"]), bytes(value["server"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed password verifier: {exc!r}") from None
        check_kdf(n, r, p)
        if len(out.stored_key) != KEY_BYTES or len(out.server_key) != KEY_BYTES:
            raise ValueError("malformed password verifier: key length")
        return out


def check_kdf(n: int, r: int, p: int) -> None:
    """Refuse scrypt parameters that are weak or that would exhaust a client's memory."""
    if n < 2**10 or n & (n - 1) or not 1 <= r <= 32 or not 1 <= p <= 16:
        raise ValueError(f"scrypt parameters out of range: n={n} r={r} p={p}")
    if 128 * n * r > KDF_MAXMEM // 2:
        raise ValueError(f"scrypt parameters need too much memory: n={n} r={r}")


@functools.lru_cache(maxsize=64)
def salted_password(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    """scrypt(password, salt): the slow part, cached so a client's reconnects stay cheap."""
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=KDF_MAXMEM, dklen=KEY_BYTES
    )


def make_verifier(
    password: str, *, n: int = KDF_N, r: int = KDF_R, p: int = KDF_P, salt: bytes | None = None
) -> Verifier:
    """A new verifier for ``password`` with a fresh random salt."""
    check_kdf(n, r, p)
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    salted = salted_password(password, salt, n, r, p)
    client_key = _mac(salted, b"Client Key")
    return Verifier(salt, n, r, p, hashlib.sha256(client_key).digest(), _mac(salted, b"Server Key"))


def decoy_verifier(key: bytes, user: str) -> Verifier:
    """A verifier for an unknown user: same salt every time, so the challenge does not tell
    an unknown user from a known one; no proof matches it."""
    salt = _mac(key, b"decoy salt " + user.encode("utf-8"))[:SALT_BYTES]
    return Verifier(salt, KDF_N, KDF_R, KDF_P, os.urandom(KEY_BYTES), os.urandom(KEY_BYTES))


# ------------------------------------------------------------------ transcript
def transcript(
    hello: dict[str, Any], cluster: str, acceptor: str, dialer_nonce: bytes, acceptor_nonce: bytes
) -> bytes:
    """What both proofs sign: everything the dialer claimed, who answered, both nonces."""
    claimed = [
        str(hello.get(k, ""))
        for k in ("auth", "role", "name", "user", "location", "timestamp", "proto_min", "proto_max")
    ]
    return pack(["nonstop-auth-1", cluster, acceptor, *claimed, dialer_nonce, acceptor_nonce])


def answer_fields(answer: dict[str, Any], code: str) -> bytes:
    """The acceptor's own claims in its final frame (identity, version, outcome)."""
    fields = ("name", "location", "timestamp", "proto_min", "proto_max", "proto")
    return pack([code, *(str(answer.get(k, "")) for k in fields)])


def node_proof(secret: bytes, side: bytes, text: bytes) -> bytes:
    """A member's proof: HMAC-SHA256(secret, side || transcript)."""
    return _mac(secret, side + b"\0" + text)


def user_proof(salted: bytes, text: bytes) -> bytes:
    """SCRAM ClientProof: ClientKey XOR HMAC(StoredKey, transcript)."""
    client_key = _mac(salted, b"Client Key")
    signature = _mac(hashlib.sha256(client_key).digest(), text)
    return bytes(a ^ b for a, b in zip(client_key, signature, strict=True))


def check_user_proof(verifier: Verifier, text: bytes, proof: Any) -> bool:
    if not isinstance(proof, bytes) or len(proof) != KEY_BYTES:
        return False
    signature = _mac(verifier.stored_key, text)
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), verifier.stored_key)


def user_server_proof(server_key: bytes, text: bytes) -> bytes:
    """SCRAM ServerSignature: the node proves it knows the user's verifier."""
    return _mac(server_key, b"acceptor\0" + text)


def server_key_of(salted: bytes) -> bytes:
    return _mac(salted, b"Server Key")


__all__ = [
    "KDF_N",
    "KDF_P",
    "KDF_R",
    "NONCE_BYTES",
    "OPEN",
    "SCHEMES",
    "SCHEME_NODE",
    "SCHEME_USER",
    "Credential",
    "NodeKey",
    "Password",
    "Principal",
    "Verifier",
    "answer_fields",
    "check_kdf",
    "check_user_proof",
    "decoy_verifier",
    "make_verifier",
    "new_nonce",
    "node_proof",
    "salted_password",
    "server_key_of",
    "transcript",
    "user_proof",
    "user_server_proof",
]
