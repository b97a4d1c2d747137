"""A standalone bulk endpoint: one store, served to Spark over the client wire protocol.

``python -m nonstop.bulk.server --data DIR --listen HOST:PORT [--app MODULE]``
(or ``nonstop pipeline serve``) opens the store at ``DIR`` and answers the
requests a Spark job sends (``nodes``, ``ping`` and every ``bulk.*`` op of
:mod:`nonstop.bulk.handlers`) with the same frames, hello and replies as a cluster
node (wire.md, data-path.md §3, §6).  It is how a single-node user — or a test —
runs the Spark pipeline against an embedded store; a cluster node serves the
same ops from its data service, so a job does not know which it talks to.

One thread per connection; handlers block on LMDB, which is what threads are for.

Authentication: a client proves the password of the endpoint's one user
(``--credentials FILE``, default ``$NONSTOP_CREDENTIALS``; with neither a new
credentials file is written next to the store directory, 0600, and its path
logged), in the same four-frame handshake as a node's (``net/challenge.py``).
``--no-auth`` serves anyone who reaches the port.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import socketserver
import sys
import threading
from typing import Any

import nonstop
from nonstop.bulk.handlers import HANDLERS, BulkContext
from nonstop.errors import BadArgument
from nonstop.model import wire
from nonstop.net.auth import make_verifier
from nonstop.net.challenge import Challenge, Guard, ProofError
from nonstop.net.frames import FrameDecoder, FrameError, encode
from nonstop.net.handshake import AUTHENTICATION_FAILED, ROLE_NODE, Hello, Rejection, check

MAX_FRAME = 256 * 1024 * 1024
"""Bulk replies carry whole ranges: allow frames far above the node default."""

log = logging.getLogger("nonstop.bulk_server")


class BulkServer(socketserver.ThreadingTCPServer):
    """Serves ``bulk.*`` on one open :class:`~nonstop.Database`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        db: nonstop.Database,
        listen: str,
        *,
        name: str = "",
        cluster: str = "",
        peers: list[tuple[str, str]] | None = None,
        guard: Guard | None = None,
    ):
        self.guard = guard
        """Who may connect (None: anyone)."""
        host, _, port = listen.rpartition(":")
        super().__init__((host.strip("[]"), int(port)), _Handler)
        self.db = db
        self.cluster = cluster
        self.name = name or f"bulk-{os.getpid()}"
        self.ctx = BulkContext(db, self.name)
        # Other endpoints to announce in `nodes` (name, address): a job then spreads
        # over several stores as over a cluster's nodes.
        self.peers = list(peers or [])

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host!s}:{port}"

    def hello(self, proto: int | None) -> Hello:
        return Hello(
            cluster=self.cluster,
            name=self.name,
            location=self.db.location,
            timestamp=self.db.engine.store.timestamp,
            role=ROLE_NODE,
            address=self.address,
            pid=os.getpid(),
            proto=proto,
        )

    def answer(self, payload: Any) -> Any:
        """One request → its reply (errors as ``{"error", "message"}``)."""
        try:
            if not isinstance(payload, dict):
                raise BadArgument("a request is a map with an 'op'")
            op = payload.get("op")
            if op == "ping":
                return {"name": self.name, "cluster": self.cluster, "pid": os.getpid()}
            if op == "nodes":
                # "transactions": False — no data service here (no tx.* ops): a
                # Spark overwrite then swaps each store in its own transaction.
                me = {"name": self.name, "address": self.address, "up": True, "transactions": False}
                others = [
                    {"name": n, "address": a, "up": True, "transactions": False}
                    for n, a in self.peers
                ]
                return {"nodes": [{**me, "location": self.db.location}, *others]}
            handler = HANDLERS.get(op) if isinstance(op, str) else None
            if handler is None:
                raise BadArgument(f"this bulk endpoint does not serve op {op!r}")
            return handler(self.ctx, payload)
        except Exception as exc:
            if not isinstance(exc, nonstop.Error):
                log.exception("bulk op failed")
            return wire.error_out(exc)


class _Handler(socketserver.BaseRequestHandler):
    server: BulkServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        decoder = FrameDecoder(MAX_FRAME)
        pending: list[Any] = []
        greeted = False
        theirs: Hello | None = None
        challenge: Challenge | None = None
        guard = self.server.guard
        try:
            while True:
                while not pending:
                    data = sock.recv(1 << 20)
                    if not data:
                        return
                    pending.extend(decoder.feed(data))
                value = pending.pop(0)
                if not greeted and theirs is None:
                    theirs = Hello.from_wire(value)
                    if guard is not None:
                        made = guard.challenge(self.server.hello(None), theirs, value)
                        if isinstance(made, Rejection):
                            self._refuse(sock, made.code, made.reason, made.reason)
                            return
                        frame, challenge = made
                        sock.sendall(encode(frame, MAX_FRAME))
                        continue
                if not greeted:
                    assert theirs is not None
                    if guard is not None and challenge is not None:
                        try:
                            guard.verify(challenge, theirs, value)
                        except ProofError as exc:
                            told = "unknown user or wrong password"
                            self._refuse(sock, AUTHENTICATION_FAILED, str(exc), told)
                            return
                    ours = self.server.hello(None)
                    version, rejection = check(ours, theirs)
                    if rejection is not None:
                        sock.sendall(encode(rejection.to_wire(ours), MAX_FRAME))
                        return
                    answer = self.server.hello(version).to_wire()
                    if guard is not None and challenge is not None:
                        answer["proof"] = guard.sign(challenge, answer, "ok")
                    sock.sendall(encode(answer, MAX_FRAME))
                    greeted = True
                    continue
                if not (isinstance(value, dict) and value.get("t") == "req"):
                    continue
                reply = self.server.answer(value.get("p"))
                sock.sendall(encode({"t": "rep", "id": value.get("id"), "p": reply}, MAX_FRAME))
        except (OSError, FrameError, ValueError) as exc:
            log.info("connection from %s closed: %s", self.client_address, exc)

    def _refuse(self, sock: socket.socket, code: str, why: str, told: str) -> None:
        """Log why (who claimed what), tell the client ``told``."""
        log.warning("rejected connection from %s: %s: %s", self.client_address, code, why)
        sock.sendall(encode(Rejection(code, told).to_wire(), MAX_FRAME))


def endpoint_guard(data: str, credentials: str | None) -> Guard:
    """The endpoint's one user: ``credentials``, else ``$NONSTOP_CREDENTIALS``, else a new
    credentials file next to the store directory (logged)."""
    from pathlib import Path

    from nonstop.client.credentials import (
        CREDENTIALS_ENV,
        load_credentials,
        new_password,
        write_credentials,
    )

    path = credentials or os.environ.get(CREDENTIALS_ENV)
    if not path:
        store = Path(data).resolve()
        generated = store.with_name(store.name + ".credentials.json")
        if not generated.exists():
            write_credentials(generated, "admin", new_password())
        log.warning("bulk endpoint credentials: %s", generated)
        path = str(generated)
    user = load_credentials(path)
    verifier = make_verifier(user.password)
    return Guard(os.urandom(32), lambda name: verifier if name == user.user else None)


def main(argv: list[str] | None = None) -> None:
    """Command line: serve a store until SIGTERM/SIGINT; prints ``listening <addr>``."""
    p = argparse.ArgumentParser(prog="nonstop-bulk-server", description=__doc__)
    p.add_argument("--data", required=True, help="store directory")
    p.add_argument("--listen", default="127.0.0.1:7201", help="host:port (port 0: any)")
    p.add_argument("--app", action="append", default=[], help="module defining managed types")
    p.add_argument("--name", default="", help="node name announced in the hello")
    p.add_argument("--peer", action="append", default=[], help="name@host:port of another one")
    p.add_argument("--durability", default="fsync", choices=["fsync", "none"])
    p.add_argument("--credentials", help="credentials file of the one user who may connect")
    p.add_argument("--no-auth", action="store_true", help="serve anyone who reaches the port")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for module in args.app:
        importlib.import_module(module)
    db = nonstop.open(args.data, durability=args.durability)
    peers = [tuple(p.split("@", 1)) for p in args.peer]
    guard = None if args.no_auth else endpoint_guard(args.data, args.credentials)
    server = BulkServer(db, args.listen, name=args.name, peers=peers, guard=guard)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    print(f"listening {server.address}", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    thread.join()
    db.close()
    sys.exit(0)


if __name__ == "__main__":
    main()
