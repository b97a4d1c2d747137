"""The proof exchange of the handshake, sans-I/O: members, users, replays, files (G5)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from nonstop.client.credentials import (
    load_credentials,
    load_secret,
    resolve_credential,
    write_credentials,
    write_secret,
)
from nonstop.errors import AuthenticationFailed
from nonstop.net import auth
from nonstop.net.challenge import Guard, ProofError, Prover
from nonstop.net.handshake import CATCHING_UP, ROLE_CLIENT, ROLE_NODE, Hello, Rejection
from nonstop.security.roles import (
    DATA,
    MEMBERSHIP,
    NODE,
    STATUS,
    USERS,
    allows,
    check_roles,
    permission_of,
)

SECRET = os.urandom(32)
ACCEPTOR = Hello(cluster="c1", name="A", location=1, timestamp=1, role=ROLE_NODE)
FAST = {"n": 2**10, "r": 8, "p": 1}  # cheap scrypt for tests


def dialer(role: str = ROLE_NODE, name: str = "B") -> Hello:
    return Hello(cluster="c1", name=name, location=2, timestamp=2, role=role)


def exchange(
    guard: Guard, prover: Prover, tamper: Any = None
) -> tuple[auth.Principal, dict[str, Any]]:
    """Run the four frames; returns the principal and the acceptor's signed answer."""
    first = prover.first()
    theirs = Hello.from_wire(first)
    made = guard.challenge(ACCEPTOR, theirs, first)
    assert not isinstance(made, Rejection), made
    frame, state = made
    proof = prover.on_answer(frame)
    if tamper is not None:
        proof = tamper(proof)
    principal = guard.verify(state, theirs, proof)
    answer = ACCEPTOR.to_wire() | {"proto": 1}
    answer["proof"] = guard.sign(state, answer, "ok")
    prover.on_final(answer)
    return principal, answer


def test_member_proves_the_secret_both_ways() -> None:
    guard = Guard(SECRET)
    prover = Prover(dialer(), auth.NodeKey(SECRET))
    principal, _ = exchange(guard, prover)
    assert principal == auth.Principal("node", "B")
    assert prover.trusted


def test_wrong_secret_is_refused() -> None:
    with pytest.raises(ProofError, match="wrong cluster-secret proof for node 'B'"):
        exchange(Guard(SECRET), Prover(dialer(), auth.NodeKey(os.urandom(32))))


def test_a_proof_is_bound_to_its_nonces() -> None:
    """A proof recorded on one connection fails on another (the acceptor's nonce is new)."""
    guard = Guard(SECRET)
    prover = Prover(dialer(), auth.NodeKey(SECRET))
    first = prover.first()
    theirs = Hello.from_wire(first)
    frame, _state = guard.challenge(ACCEPTOR, theirs, first)  # type: ignore[misc]
    recorded = prover.on_answer(frame)
    _frame2, state2 = guard.challenge(ACCEPTOR, theirs, first)  # type: ignore[misc]
    with pytest.raises(ProofError):
        guard.verify(state2, theirs, recorded)


def test_the_proof_covers_what_the_hello_claims() -> None:
    """Another protocol range, name or role in the hello: another transcript to sign."""
    first = Prover(dialer(), auth.NodeKey(SECRET)).first()
    nonce = os.urandom(16)

    def text(hello: dict[str, Any]) -> bytes:
        return auth.transcript(hello, "c1", "A", first["nonce"], nonce)

    for change in ({"proto_min": 99, "proto_max": 99}, {"name": "C"}, {"role": "client"}):
        assert text(dict(first, **change)) != text(first)


def test_a_hello_without_proof_is_refused_before_anything() -> None:
    refusal = Guard(SECRET).challenge(ACCEPTOR, dialer(), dialer().to_wire())
    assert isinstance(refusal, Rejection) and refusal.code == "AuthenticationFailed"


def test_dialing_node_refuses_an_unproven_answer() -> None:
    prover = Prover(dialer(), auth.NodeKey(SECRET))
    prover.first()
    with pytest.raises(ProofError, match="does not prove membership"):
        prover.check_open(ACCEPTOR.to_wire() | {"proto": 1})
    guard = Guard(os.urandom(32))  # an impostor with another secret
    first = prover.first()
    frame, state = guard.challenge(ACCEPTOR, Hello.from_wire(first), first)  # type: ignore[misc]
    prover.on_answer(frame)
    answer = ACCEPTOR.to_wire() | {"proto": 1}
    answer["proof"] = guard.sign(state, answer, "ok")
    with pytest.raises(ProofError, match="does not prove"):
        prover.on_final(answer)


def test_user_password_scram_with_scrypt() -> None:
    verifier = auth.make_verifier("pw", **FAST)
    guard = Guard(SECRET, users={"alice": verifier}.get)
    prover = Prover(dialer(ROLE_CLIENT, "client-1"), auth.Password("alice", "pw"))
    principal, _ = exchange(guard, prover)
    assert principal == auth.Principal("user", "alice")
    assert prover.trusted  # the node proved it knows alice's verifier
    with pytest.raises(ProofError, match="wrong password for user 'alice'"):
        exchange(guard, Prover(dialer(ROLE_CLIENT), auth.Password("alice", "nope")))
    with pytest.raises(ProofError, match="unknown user 'bob'"):
        exchange(guard, Prover(dialer(ROLE_CLIENT), auth.Password("bob", "pw")))


def test_no_user_is_checked_while_the_node_catches_up() -> None:
    """A restarted node's users are its snapshot's until it caught up: it refuses (retryable
    ``CatchingUp``) rather than accept a user removed, or a password changed, meanwhile."""
    verifier = auth.make_verifier("pw", **FAST)
    caught_up = False
    guard = Guard(SECRET, users={"alice": verifier}.get, ready=lambda _u: caught_up)
    hello = Hello.from_wire(Prover(dialer(ROLE_CLIENT), auth.Password("alice", "pw")).first())
    refusal = guard.challenge(ACCEPTOR, hello, hello.to_wire())
    assert isinstance(refusal, Rejection) and refusal.code == CATCHING_UP
    member = Prover(dialer(), auth.NodeKey(SECRET))  # members are not users: never gated
    assert exchange(guard, member)[0] == auth.Principal("node", "B")
    caught_up = True
    prover = Prover(dialer(ROLE_CLIENT, "client-1"), auth.Password("alice", "pw"))
    assert exchange(guard, prover)[0] == auth.Principal("user", "alice")


def test_unknown_users_get_a_stable_decoy_salt() -> None:
    """The challenge does not tell an unknown user from a known one."""
    guard = Guard(SECRET, users=lambda _u: None)
    hello = Hello.from_wire(Prover(dialer(ROLE_CLIENT), auth.Password("ghost", "x")).first())
    one, _ = guard.challenge(ACCEPTOR, hello, hello.to_wire())  # type: ignore[misc]
    two, _ = guard.challenge(ACCEPTOR, hello, hello.to_wire())  # type: ignore[misc]
    assert one["salt"] == two["salt"] and one["kdf"] == [auth.KDF_N, auth.KDF_R, auth.KDF_P]


def test_verifier_does_not_hold_the_password_and_round_trips() -> None:
    verifier = auth.make_verifier("hunter2", **FAST)
    wire = verifier.to_wire()
    assert b"hunter2" not in b"".join(v for v in wire.values() if isinstance(v, bytes))
    assert auth.Verifier.from_wire(wire) == verifier
    with pytest.raises(ValueError):
        auth.Verifier.from_wire({**wire, "kdf": [2**30, 8, 1]})  # would exhaust memory


def test_credential_files_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "credentials.json"
    write_credentials(path, "alice", "pw")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credentials(path) == auth.Password("alice", "pw")
    secret = tmp_path / "cluster.secret"
    write_secret(secret)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(load_secret(secret)) == 32
    path.chmod(0o644)
    with pytest.raises(AuthenticationFailed, match="may be read by others"):
        load_credentials(path)
    path.chmod(0o600)
    monkeypatch.setenv("NONSTOP_CREDENTIALS", str(path))
    assert resolve_credential() == auth.Password("alice", "pw")
    assert resolve_credential("bob", "x") == auth.Password("bob", "x")
    monkeypatch.delenv("NONSTOP_CREDENTIALS")
    assert resolve_credential(folder=tmp_path) == auth.Password("alice", "pw")
    assert resolve_credential(folder=tmp_path / "none") is None


def test_op_matrix() -> None:
    assert permission_of("propose") == NODE and permission_of("run") == NODE
    assert permission_of("bulk.overwrite.commit") == NODE
    assert permission_of("bulk.upsert") == DATA and permission_of("tx.commit") == DATA
    assert permission_of("leave") == MEMBERSHIP and permission_of("user.add") == USERS
    assert permission_of("status") == STATUS and permission_of("anything.new") == "admin"
    assert not any(allows([r], NODE) for r in ("monitor", "app", "operator", "admin"))
    assert allows(["monitor"], STATUS) and not allows(["monitor"], DATA)
    assert allows(["app"], DATA) and not allows(["app"], MEMBERSHIP)
    assert allows(["operator"], MEMBERSHIP) and not allows(["operator"], USERS)
    assert allows(["admin"], USERS) and not allows(["billing"], STATUS)
    assert check_roles(["app", "billing", "app"]) == ["app", "billing"]
    with pytest.raises(ValueError):
        check_roles([])
    with pytest.raises(ValueError):
        check_roles(["Bad Role"])
