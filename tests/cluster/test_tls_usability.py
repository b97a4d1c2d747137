"""TLS as an operator meets it (issue 11), with real node processes and the CLI.

* ``nonstop local up --option 'tls={...}'`` starts a TLS cluster the CLI talks to,
  and a missing file is refused at once with the reason;
* a certificate without ``tls.ca`` that peers cannot verify stops the start with
  one line (a certificate of a public CA, in the system store, would be valid);
* a plain client on a TLS node, and a TLS client on a plain node, get one line
  saying which side speaks TLS.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nonstop.client import Client
from nonstop.client.failures import NodeRefused
from nonstop.net.tls import TLSConfig
from tests.cluster.conftest import run_cli
from tests.unit.test_transport import make_certs

pytestmark = pytest.mark.timeout(120)


def tls_option(tls: TLSConfig, *, ca: bool = True) -> str:
    files = {"cert": tls.cert, "key": tls.key}
    if ca:
        files["ca"] = tls.ca
    return f"tls={json.dumps(files)}"


def listen_of(folder: Path) -> str:
    layout = json.loads((folder / "local.json").read_text())
    return str(layout["nodes"][0]["listen"])


def test_local_up_with_tls_and_plain_client_told(folder: Path, tmp_path: Path) -> None:
    tls = make_certs(tmp_path)
    code, out, err = run_cli(
        "local", "up", "-n", "1", "--dir", str(folder), "--option", tls_option(tls)
    )
    assert code == 0, err
    assert "quorum Active" in out
    code, out, err = run_cli("cluster", "status", "--json", "--dir", str(folder))
    assert code == 0, err
    assert json.loads(out)["quorum"] == "Active"

    address = listen_of(folder)
    code, _, err = run_cli("cluster", "status", "--node", address, "--timeout", "2")
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "TLSRequired" in lines[0] and "requires TLS" in lines[0], err
    with pytest.raises(NodeRefused, match="requires TLS"), Client([address], timeout=2) as c:
        c.ping()
    with Client([address], timeout=2, tls=tls) as c:
        assert c.ping()["name"] == "A"


def test_tls_option_with_a_missing_file_is_refused_at_once(folder: Path) -> None:
    code, _, err = run_cli(
        "local", "up", "-n", "1", "--dir", str(folder), "--option", 'tls={"cert": "nope.pem"}'
    )
    assert code == 2
    assert err.strip().count("\n") == 0 and "nope.pem" in err and "No such file" in err, err
    assert not (folder / "local.json").exists()


def test_certificate_peers_cannot_verify_stops_the_start(folder: Path, tmp_path: Path) -> None:
    tls = make_certs(tmp_path)  # signed by a private CA, which the system store lacks
    code, _, err = run_cli(
        "local", "up", "-n", "1", "--dir", str(folder), "--option", tls_option(tls, ca=False)
    )
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "peers cannot verify" in lines[0] and "set tls.ca" in lines[0], err


def test_tls_client_on_a_plain_node_is_told(folder: Path, tmp_path: Path) -> None:
    tls = make_certs(tmp_path)
    code, _, err = run_cli("local", "up", "-n", "1", "--dir", str(folder))
    assert code == 0, err
    address = listen_of(folder)
    code, _, err = run_cli(
        "cluster", "status", "--node", address, "--tls-ca", str(tls.ca), "--timeout", "2"
    )
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "TLSNotEnabled" in lines[0], err
    assert "does not speak TLS" in lines[0]
    log = (folder / "A" / "node.log").read_text()
    assert "it speaks TLS, this node's listener is plain TCP" in log
