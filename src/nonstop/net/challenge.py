"""The proof exchange of the handshake, both sides, sans-I/O (``docs/design/wire.md``).

When the accepting node authenticates (it has a :class:`Guard`), a connection opens
in four frames instead of two::

    dialer   → hello      {..., "auth": "node"|"user", "user", "nonce"}
    acceptor → challenge  {"t": "challenge", "cluster", "name", "nonce"[, "salt", "kdf"]}
    dialer   → auth       {"t": "auth", "proof"}
    acceptor → hello      (its answer with ``proto``) + "proof"     -- or a reject

Until the dialer's proof is checked the acceptor has said nothing but its name,
the cluster id and a nonce, and changed nothing: a refusal before the proof
(wrong cluster, no or bad proof) is never handed to the failure detector.  The
acceptor's last frame carries its own proof over the same transcript and its
answer (a reject too), so the dialer learns whether a *member* refused it: only
then may a refusal (a protocol range, a duplicate location) classify the peer
(C3).  A node that does not authenticate answers the hello at once, as before
(``[auth] enabled = false``); a dialing *node* refuses such a peer.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from nonstop.net import auth
from nonstop.net.handshake import (
    AUTHENTICATION_FAILED,
    CATCHING_UP,
    ROLE_NODE,
    Hello,
    Rejection,
)


class ProofError(Exception):
    """The other side's proof is missing or wrong (``reason`` says what)."""


# ===================================================================== acceptor
@dataclass(slots=True)
class Challenge:
    """What the acceptor remembers between its challenge and the dialer's proof."""

    scheme: str
    text: bytes
    verifier: auth.Verifier | None = None
    known_user: bool = False


@dataclass
class Guard:
    """The accepting side: the cluster secret and where users' verifiers come from."""

    secret: bytes
    users: Callable[[str], auth.Verifier | None] = field(default=lambda _user: None)
    ready: Callable[[str], bool] = field(default=lambda _user: True)
    """Whether ``users`` is current enough to check this user's proof (``CATCHING_UP``)."""
    decoy_key: bytes = field(default_factory=lambda: os.urandom(32))

    def __repr__(self) -> str:
        return "Guard(<secret>)"

    def challenge(
        self, ours: Hello, theirs: Hello, first: dict[str, Any]
    ) -> tuple[dict[str, Any], Challenge] | Rejection:
        """The challenge frame for a parsed hello, or a refusal (no usable scheme)."""
        scheme = theirs.auth
        if scheme not in auth.SCHEMES:
            what = "a member" if theirs.role == ROLE_NODE else "a client"
            return Rejection(
                AUTHENTICATION_FAILED,
                f"node {ours.name} requires authentication and {what} at the other end "
                "offered none (a user and password, or the cluster secret)",
            )
        if scheme == auth.SCHEME_USER and not theirs.user:
            return Rejection(AUTHENTICATION_FAILED, "a user proof needs a user name")
        if scheme == auth.SCHEME_USER and not self.ready(theirs.user):
            return Rejection(
                CATCHING_UP,
                f"node {ours.name} is catching up with the cluster log since its start "
                "and checks no user yet: retry (or ask another node)",
            )
        nonce = auth.new_nonce()
        text = auth.transcript(first, ours.cluster, ours.name, theirs.nonce, nonce)
        frame: dict[str, Any] = {
            "t": "challenge",
            "cluster": ours.cluster,
            "name": ours.name,
            "nonce": nonce,
        }
        state = Challenge(scheme, text)
        if scheme == auth.SCHEME_USER:
            verifier = self.users(theirs.user)
            state.known_user = verifier is not None
            if verifier is None:
                verifier = auth.decoy_verifier(self.decoy_key, theirs.user)
            state.verifier = verifier
            frame["salt"] = verifier.salt
            frame["kdf"] = [verifier.n, verifier.r, verifier.p]
        return frame, state

    def verify(self, state: Challenge, theirs: Hello, frame: Any) -> auth.Principal:
        """The principal the dialer proved to be; :class:`ProofError` otherwise."""
        proof = frame.get("proof") if isinstance(frame, dict) and frame.get("t") == "auth" else None
        if not isinstance(proof, bytes):
            raise ProofError("no proof after the challenge")
        if state.scheme == auth.SCHEME_NODE:
            expected = auth.node_proof(self.secret, b"dialer", state.text)
            if not hmac.compare_digest(proof, expected):
                raise ProofError(f"wrong cluster-secret proof for node {theirs.name!r}")
            return auth.Principal(auth.SCHEME_NODE, theirs.name)
        assert state.verifier is not None
        if not state.known_user:
            # Checked anyway (same work as a known user), then refused.
            auth.check_user_proof(state.verifier, state.text, proof)
            raise ProofError(f"unknown user {theirs.user!r}")
        if not auth.check_user_proof(state.verifier, state.text, proof):
            raise ProofError(f"wrong password for user {theirs.user!r}")
        return auth.Principal(auth.SCHEME_USER, theirs.user)

    def sign(self, state: Challenge, answer: dict[str, Any], code: str) -> bytes:
        """The acceptor's proof over the transcript and its answer (``code``: "ok" or a reject)."""
        text = state.text + auth.answer_fields(answer, code)
        if state.scheme == auth.SCHEME_NODE:
            return auth.node_proof(self.secret, b"acceptor", text)
        assert state.verifier is not None
        return auth.user_server_proof(state.verifier.server_key, text)


# ======================================================================= dialer
class Prover:
    """The dialing side: what to send, and whether the acceptor's answer is a member's.

    ``credential`` None: prove nothing (a node that does not authenticate still
    answers).  A :class:`~nonstop.net.auth.NodeKey` also *requires* the acceptor
    to prove membership: a node never takes an unproven peer for a member.
    """

    def __init__(self, hello: Hello, credential: auth.Credential | None) -> None:
        self.credential = credential
        scheme, user = "", ""
        if isinstance(credential, auth.NodeKey):
            scheme = auth.SCHEME_NODE
        elif isinstance(credential, auth.Password):
            scheme, user = auth.SCHEME_USER, credential.user
        self.hello = replace(hello, auth=scheme, user=user, nonce=auth.new_nonce())
        self._sent = self.hello.to_wire()
        self._text = b""
        self._key = b""
        self.trusted = credential is None
        """May the acceptor's hello (answer or reject) be believed? True once it proved
        itself, or when no proof is asked for (then nothing is believed more than before)."""

    def first(self) -> dict[str, Any]:
        return self._sent

    @property
    def requires_proof(self) -> bool:
        return isinstance(self.credential, auth.NodeKey)

    def on_answer(self, answer: Any) -> dict[str, Any] | None:
        """The frame to send for the acceptor's first answer (None: the handshake is done)."""
        if not (isinstance(answer, dict) and answer.get("t") == "challenge"):
            return None
        if self.credential is None:
            name = answer.get("name")
            raise ProofError(
                f"node {name} requires authentication: pass user and password (or a "
                "credentials file, NONSTOP_CREDENTIALS), none was found"
            )
        nonce, cluster, name = answer.get("nonce"), answer.get("cluster"), answer.get("name")
        if not (isinstance(nonce, bytes) and isinstance(cluster, str) and isinstance(name, str)):
            raise ProofError("malformed challenge")
        self._text = auth.transcript(self._sent, cluster, name, self.hello.nonce, nonce)
        if isinstance(self.credential, auth.NodeKey):
            self._key = self.credential.secret
            proof = auth.node_proof(self._key, b"dialer", self._text)
        else:
            kdf = answer.get("kdf")
            salt = answer.get("salt")
            try:
                n, r, p = (int(x) for x in kdf)  # type: ignore[union-attr]
                auth.check_kdf(n, r, p)
            except (TypeError, ValueError) as exc:
                raise ProofError(f"unusable challenge: {exc}") from None
            if not isinstance(salt, bytes):
                raise ProofError("malformed challenge: salt")
            salted = auth.salted_password(self.credential.password, salt, n, r, p)
            self._key = auth.server_key_of(salted)
            proof = auth.user_proof(salted, self._text)
        return {"t": "auth", "proof": proof}

    def on_final(self, answer: Any) -> None:
        """Check the acceptor's proof on its last frame (an answer or a reject).

        Sets :attr:`trusted`; a welcome without a valid proof raises :class:`ProofError`
        (an impostor, or a node of another cluster secret).
        """
        if not isinstance(answer, dict):
            return
        if answer.get("t") == "reject":
            body, code = answer.get("hello"), str(answer.get("code"))
        else:
            body, code = answer, "ok"
        proof = answer.get("proof")
        if isinstance(body, dict) and isinstance(proof, bytes) and self._text:
            text = self._text + auth.answer_fields(body, code)
            if isinstance(self.credential, auth.NodeKey):
                expected = auth.node_proof(self._key, b"acceptor", text)
            else:
                expected = auth.user_server_proof(self._key, text)
            self.trusted = hmac.compare_digest(proof, expected)
        if code == "ok" and not self.trusted:
            raise ProofError("the node's answer does not prove it knows the credential")

    def check_open(self, answer: Any) -> None:
        """An answer without a challenge: refused when we require a member's proof."""
        if self.requires_proof and isinstance(answer, dict) and answer.get("t") == "hello":
            raise ProofError(f"node {answer.get('name')} does not prove membership")


__all__ = ["Challenge", "Guard", "ProofError", "Prover"]
