"""The standalone bulk endpoint authenticates its one user like a node does (G5)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

import nonstop
from nonstop.bulk.server import BulkServer
from nonstop.client.bulk import BulkClient
from nonstop.errors import AuthenticationFailed
from nonstop.net.auth import Password, make_verifier
from nonstop.net.challenge import Guard


@pytest.fixture
def endpoint(db: nonstop.Database) -> Iterator[str]:
    verifier = make_verifier("pw", n=2**10)
    guard = Guard(os.urandom(32), lambda user: verifier if user == "spark" else None)
    server = BulkServer(db, "127.0.0.1:0", name="solo", guard=guard)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.address
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_user_gets_in_and_nobody_else(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with BulkClient(endpoint, credentials=Password("spark", "pw")) as c:
        assert c.call("nodes")["nodes"][0]["name"] == "solo"
    for wrong in (Password("spark", "nope"), Password("other", "pw")):
        with (
            pytest.raises(AuthenticationFailed, match="unknown user or wrong password"),
            BulkClient(endpoint, credentials=wrong) as c,
        ):
            c.call("nodes")
    monkeypatch.delenv("NONSTOP_CREDENTIALS", raising=False)
    with (
        pytest.raises(AuthenticationFailed, match="requires authentication"),
        BulkClient(endpoint) as c,
    ):
        c.call("nodes")
