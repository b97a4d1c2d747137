"""``nonstop.connect()`` with no address: the local cluster of the current folder (issue 13)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import nonstop
from nonstop.client.local_folder import local_cluster_addresses


def test_no_local_cluster_names_the_folder_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(nonstop.Unavailable, match="nonstop local up") as info:
        nonstop.connect()
    assert str(tmp_path / ".nonstop" / "local") in str(info.value)
    with pytest.raises(nonstop.Unavailable, match="nonstop local up"):
        nonstop.connect_async()


def test_the_layout_gives_the_addresses_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / ".nonstop" / "local"
    folder.mkdir(parents=True)
    layout = {
        "cluster": "local-1234",
        "nodes": [{"name": "A", "listen": "127.0.0.1:1"}, {"name": "B", "listen": "127.0.0.1:2"}],
    }
    (folder / "local.json").write_text(json.dumps(layout))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="nonstop.client"):
        assert local_cluster_addresses() == ["127.0.0.1:1", "127.0.0.1:2"]
    assert "local cluster local-1234" in caplog.text
    # Nothing listens there: the usual Unavailable of a cluster that does not answer.
    with pytest.raises(nonstop.Unavailable):
        nonstop.connect(timeout=0.5, rounds=1)


def test_a_broken_layout_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "local.json").write_text("{not json")
    with pytest.raises(nonstop.Unavailable, match="cannot read the local cluster layout"):
        local_cluster_addresses(tmp_path)
