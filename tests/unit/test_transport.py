"""The real runtime's transport in one process, on 127.0.0.1: handshake, bad input, TLS.

Each test runs its own event loop (``asyncio.run``) with runtimes driving the
probe machine; sockets are real, ports are picked by the kernel.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nonstop.client.handle import AsyncClient, Client
from nonstop.errors import ProtocolError, Unavailable
from nonstop.net.connection import HandshakeRejected, dial
from nonstop.net.discovery import DiscoveryConfig
from nonstop.net.frames import encode
from nonstop.net.handshake import (
    ROLE_CLIENT,
    ROLE_NODE,
    UNSUPPORTED_PROTOCOL,
    WRONG_CLUSTER,
    Hello,
    check,
    location_code,
    negotiate,
)
from nonstop.net.tls import TLSConfig
from nonstop.runtime.probe import ProbeMachine
from nonstop.runtime.real import RealRuntime, RuntimeConfig, new_rng
from nonstop.runtime.storage import ClusterStore

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hello_for(name: str, port: int, proto: tuple[int, int] = (1, 1), cluster: str = "t") -> Hello:
    return Hello(
        cluster=cluster,
        name=name,
        location=location_code(name),
        timestamp=hash(name) & 0xFFFFFFFF,
        proto_min=proto[0],
        proto_max=proto[1],
        role=ROLE_NODE,
        address=f"127.0.0.1:{port}",
        pid=1,
    )


@asynccontextmanager
async def node(
    tmp: Path,
    name: str,
    *,
    proto: tuple[int, int] = (1, 1),
    join: list[str] | None = None,
    members: tuple[str, ...] = (),
    tls: TLSConfig | None = None,
    max_frame: int = 1 << 20,
    cluster: str = "t",
    port: int | None = None,
    discovery: DiscoveryConfig | None = None,
) -> AsyncIterator[RealRuntime]:
    port = port or free_port()
    store = ClusterStore(str(tmp / name), sync=False)
    rt = RealRuntime(
        hello=hello_for(name, port, proto, cluster),
        store=store,
        machine_factory=lambda rec: ProbeMachine(
            name, rec, new_rng(), interval=0.05, timeout=0.5, members=members, protocol=proto
        ),
        config=RuntimeConfig(
            listen=f"127.0.0.1:{port}",
            join=join or [],
            tls=tls or TLSConfig(),
            max_frame=max_frame,
            discovery=discovery or DiscoveryConfig(),
        ),
    )
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()
        store.close()


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def client_hello(cluster: str = "") -> Hello:
    return Hello(cluster=cluster, name="c", location=0, timestamp=0, role=ROLE_CLIENT)


# ------------------------------------------------------------- negotiation
def test_highest_common_version() -> None:
    assert negotiate(1, 3, 2, 5) == 3
    assert negotiate(1, 1, 1, 2) == 1
    assert negotiate(1, 1, 2, 3) is None


@given(st.integers(1, 20), st.integers(0, 5), st.integers(1, 20), st.integers(0, 5))
def test_negotiate_picks_highest_common(lo_a: int, span_a: int, lo_b: int, span_b: int) -> None:
    hi_a, hi_b = lo_a + span_a, lo_b + span_b
    common = set(range(lo_a, hi_a + 1)) & set(range(lo_b, hi_b + 1))
    assert negotiate(lo_a, hi_a, lo_b, hi_b) == (max(common) if common else None)
    assert negotiate(lo_a, hi_a, lo_b, hi_b) == negotiate(lo_b, hi_b, lo_a, hi_a)


def test_check_rejects_wrong_cluster_and_duplicates() -> None:
    a = hello_for("A", 1)
    assert check(a, hello_for("B", 2, cluster="other"))[1].code == WRONG_CLUSTER  # type: ignore[union-attr]
    assert check(a, hello_for("B", 2, proto=(2, 3)))[1].code == UNSUPPORTED_PROTOCOL  # type: ignore[union-attr]
    assert check(a, hello_for("A", 2))[1].code == "DuplicateName"  # type: ignore[union-attr]
    assert check(a, hello_for("B", 2, proto=(1, 4))) == (1, None)
    # an anonymous client may talk to any cluster
    assert check(a, client_hello()) == (1, None)


def test_version_negotiated_between_nodes(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, "A", proto=(1, 1)) as a:
            host, port = a.config.listen.split(":")
            conn = await dial(host, int(port), hello_for("N", 9, proto=(1, 3)))
            assert conn.version == 1
            assert conn.peer is not None and conn.peer.name == "A"
            await conn.aclose()

    asyncio.run(main())


def test_unsupported_protocol_reported_to_machine(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, "A", proto=(1, 1), members=("A", "B")) as a:
            async with node(tmp_path, "B", proto=(2, 3), join=[a.config.listen]) as b:
                # B dials A: A refuses and both sides classify the other.
                machine_b = b.machine
                assert isinstance(machine_b, ProbeMachine)
                await wait_for(lambda: machine_b.state.get("A") == "UnsupportedProtocol")
                machine_a = a.machine
                assert isinstance(machine_a, ProbeMachine)
                await wait_for(lambda: machine_a.state.get("B") == "UnsupportedProtocol")
            # A keeps serving clients.
            async with AsyncClient([a.config.listen]) as c:
                assert (await c.ping())["name"] == "A"

    asyncio.run(main())


def test_wrong_cluster_rejected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with node(tmp_path, "A") as a:
            host, port = a.config.listen.split(":")
            with pytest.raises(HandshakeRejected) as info:
                await dial(host, int(port), hello_for("X", 9, cluster="other"))
            assert info.value.code == WRONG_CLUSTER

    with caplog.at_level(logging.WARNING, logger="nonstop.runtime"):
        asyncio.run(main())
    assert any("WrongCluster" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------- bad input
async def raw_send(address: str, data: bytes) -> bytes:
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    try:
        got = await asyncio.wait_for(reader.read(), 3)
    finally:
        writer.close()
    return got


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(struct.pack(">I", 50 << 20) + b"x" * 100, id="oversized"),
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http"),
        pytest.param(bytes(range(255, -1, -1)) * 4, id="garbage"),
        pytest.param(struct.pack(">I", 16) + bytes(range(16)), id="garbage-body"),
        pytest.param(encode({"t": "nope"}), id="not-a-hello"),
        pytest.param(struct.pack(">I", 3) + b"\xc1\xc1\xc1", id="bad-msgpack"),
    ],
)
def test_bad_bytes_close_connection_node_keeps_serving(tmp_path: Path, data: bytes) -> None:
    async def main() -> None:
        async with node(tmp_path, "A") as a:
            await raw_send(a.config.listen, data)  # returns when the node closed it
            async with AsyncClient([a.config.listen]) as c:
                assert (await c.ping())["name"] == "A"

    asyncio.run(main())


def test_bad_frames_after_handshake(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with node(tmp_path, "A", max_frame=4096) as a:
            host, port = a.config.listen.split(":")
            hello = encode(hello_for("N", 9).to_wire())
            for tail in (
                struct.pack(">I", 1 << 20),  # oversized after the hello
                encode({"t": "what"}),  # unknown message type
            ):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(hello + tail)
                await writer.drain()
                await asyncio.wait_for(reader.read(), 3)  # until closed
                writer.close()
            with Client([a.config.listen]) as c:
                # the blocking client in a thread: the loop must keep running
                reply = await asyncio.to_thread(c.ping)
                assert reply["name"] == "A"

    with caplog.at_level(logging.WARNING, logger="nonstop.runtime"):
        asyncio.run(main())
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "exceeds the maximum" in text
    assert "unknown message type" in text


# ------------------------------------------------------------ two runtimes
def test_two_nodes_see_each_other_and_group_commit(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            node(tmp_path, "A", members=("A", "B")) as a,
            node(tmp_path, "B", join=[a.config.listen], members=("A", "B")) as b,
        ):
            ma, mb = a.machine, b.machine
            assert isinstance(ma, ProbeMachine) and isinstance(mb, ProbeMachine)
            await wait_for(lambda: ma.state.get("B") == "Up" and mb.state.get("A") == "Up")
            async with AsyncClient([a.config.listen]) as c:
                before = a.stats["commits"]
                assert (await c.call({"op": "persist", "n": 200})) == {"ok": True}
                commits = a.stats["commits"] - before
                assert 1 <= commits < 20, commits  # 200 persists, few fsyncs
                status = await c.status()
                pids = {n["name"]: n["pid"] for n in status["nodes"]}
                assert pids["A"] and pids["B"]

    asyncio.run(main())


def test_client_fails_over_and_reports_unavailable(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        # balance="first": the dead address is the primary, so the ping must fail over.
        async with (
            node(tmp_path, "A") as a,
            AsyncClient([dead, a.config.listen], timeout=1, balance="first") as c,
        ):
            assert (await c.ping())["name"] == "A"

    asyncio.run(main())
    with pytest.raises(Unavailable), Client([dead], timeout=0.5, rounds=1) as c:
        c.ping()


# --------------------------------------------------------------------- TLS
def make_certs(folder: Path) -> TLSConfig:
    """A CA and one certificate for 127.0.0.1 signed by it, with the openssl CLI."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "node.key", "-out", "node.csr")  # fmt: skip
    run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", "ext.cnf", "-out", "node.pem")  # fmt: skip
    return TLSConfig(
        cert=str(folder / "node.pem"), key=str(folder / "node.key"), ca=str(folder / "ca.pem")
    )


def test_tls_round_trip(tmp_path: Path) -> None:
    tls = make_certs(tmp_path)

    async def main() -> None:
        async with node(tmp_path, "A", tls=tls, members=("A", "B")) as a:
            async with node(tmp_path, "B", tls=tls, join=[a.config.listen], members=("A", "B")):
                ma = a.machine
                assert isinstance(ma, ProbeMachine)
                await wait_for(lambda: ma.state.get("B") == "Up")
            async with AsyncClient([a.config.listen], tls=tls) as c:
                assert (await c.ping())["name"] == "A"
            # a plain-TCP client cannot talk to a TLS node
            with pytest.raises((Unavailable, ProtocolError)):
                async with AsyncClient([a.config.listen], timeout=1, rounds=1) as c:
                    await c.ping()
            # a TLS client without a certificate is refused (mutual TLS)
            anon = TLSConfig(ca=tls.ca)
            with pytest.raises((Unavailable, ProtocolError)):
                async with AsyncClient([a.config.listen], tls=anon, timeout=1, rounds=1) as c:
                    await c.ping()

    asyncio.run(main())


def named_cert(folder: Path, tls: TLSConfig, name: str) -> TLSConfig:
    """A certificate of the CA of ``tls`` that names node ``name`` (and 127.0.0.1)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    (folder / f"{name}.cnf").write_text(f"subjectAltName=IP:127.0.0.1,DNS:{name}\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
        "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
    run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "1", "-extfile", f"{name}.cnf",
        "-out", f"{name}.pem")  # fmt: skip
    return TLSConfig(
        cert=str(folder / f"{name}.pem"),
        key=str(folder / f"{name}.key"),
        ca=tls.ca,
        member_names=True,
    )


def test_tls_member_names(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With ``member_names`` a node's certificate must name it: a node presenting another
    member's certificate is refused, both ways."""
    ca = make_certs(tmp_path)
    cert_a, cert_b = named_cert(tmp_path, ca, "A"), named_cert(tmp_path, ca, "B")

    async def main() -> None:
        async with node(tmp_path, "A", tls=cert_a, members=("A", "B", "C")) as a:
            async with node(tmp_path, "B", tls=cert_b, join=[a.config.listen]):
                ma = a.machine
                assert isinstance(ma, ProbeMachine)
                await wait_for(lambda: ma.state.get("B") == "Up")
            async with node(tmp_path, "C", tls=cert_b, join=[a.config.listen]) as c:
                mc = c.machine
                assert isinstance(mc, ProbeMachine)
                await asyncio.sleep(1.5)
                assert ma.state.get("C") != "Up" and mc.state.get("A") != "Up"

    with caplog.at_level(logging.WARNING, logger="nonstop.runtime"):
        asyncio.run(main())
    assert any("WrongCertificate" in r.getMessage() for r in caplog.records)
    assert any("presented a certificate for B" in r.getMessage() for r in caplog.records)


def test_msgpack_payloads_only(tmp_path: Path) -> None:
    """What goes over a node link is exactly the msgpack of ``{"t": "m", "p": payload}``."""
    frame = encode({"t": "m", "p": {"k": "fd", "b": [1, b"x"]}})
    assert msgpack.unpackb(frame[4:]) == {"t": "m", "p": {"k": "fd", "b": [1, b"x"]}}


def adjacent_free_ports() -> tuple[int, int]:
    """Two consecutive ports free for both TCP and UDP on 127.0.0.1."""
    for _ in range(200):
        base = free_port()
        socks = []
        try:
            for port in (base, base + 1):
                for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                    s = socket.socket(socket.AF_INET, kind)
                    socks.append(s)
                    s.bind(("127.0.0.1", port))
            return base, base + 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no two adjacent free ports")


def test_loopback_discovery_finds_peers_without_addresses(tmp_path: Path) -> None:
    """C2: two nodes configured with no peer address find each other by UDP on 127.0.0.1."""
    pa, pb = adjacent_free_ports()
    disc = DiscoveryConfig(enabled=True, mode="loopback", ports=[pa, pb], interval=0.1)

    async def main() -> None:
        async with (
            node(tmp_path, "A", port=pa, discovery=disc) as a,
            node(tmp_path, "B", port=pb, discovery=disc) as b,
        ):
            ma, mb = a.machine, b.machine
            assert isinstance(ma, ProbeMachine) and isinstance(mb, ProbeMachine)
            await wait_for(lambda: ma.state.get("B") == "Up" and mb.state.get("A") == "Up")
            assert a.addresses["B"][0] == f"127.0.0.1:{pb}"

    asyncio.run(main())


def test_static_address_wins_over_discovery(tmp_path: Path) -> None:
    async def main() -> None:
        async with node(tmp_path, "A") as a:
            a.learn("Z", "127.0.0.1:1", 3)  # static
            a.learn("Z", "127.0.0.1:2", 1)  # announced later: ignored
            assert a.addresses["Z"][0] == "127.0.0.1:1"

    asyncio.run(main())
