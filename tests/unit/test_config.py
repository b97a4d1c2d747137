"""The node configuration schema: unknown keys, wrong types, nested tables through TOML."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from nonstop.cluster.quorum import QuorumPolicy
from nonstop.cluster.raft import RaftConfig
from nonstop.dataplane.service import ServiceConfig
from nonstop.net.discovery import DiscoveryConfig
from nonstop.net.tls import TLSConfig
from nonstop.node import config_doc
from nonstop.node.config import (
    SERVICE_KEYS,
    ConfigError,
    NodeConfig,
    check_options,
    from_mapping,
    load,
    write,
)

ROOT = Path(__file__).resolve().parents[2]


def error_of(data: dict[str, object]) -> str:
    with pytest.raises(ConfigError) as info:
        from_mapping(data)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_key_names_it_and_the_closest_valid_key() -> None:
    assert error_of({"lock_wiat": 3}) == (
        "unknown config key 'lock_wiat' (did you mean 'lock_wait'?)"
    )
    assert "'raft.electon_timeout' (did you mean 'election_timeout'?)" in error_of(
        {"raft": {"electon_timeout": 2}}
    )
    assert "valid keys: cert, key, ca" in error_of({"tls": {"zzz": 1}})


def test_wrong_type_names_key_expected_type_and_value() -> None:
    assert (
        error_of({"rpc_timeout": "abc"}) == "config key 'rpc_timeout' must be a number, got 'abc'"
    )
    assert error_of({"sync": "yes"}) == "config key 'sync' must be true or false, got 'yes'"
    assert error_of({"join": ["a:1", 5]}) == "config key 'join.1' must be a string, got 5"
    assert "must be one of 'debug', 'info'" in error_of({"log_level": "verbose"})
    assert "'tls.cert' must be a string, got 1" in error_of({"tls": {"cert": 1}})
    assert "'quorum.weights.A' must be an integer, got 'x'" in error_of(
        {"quorum": {"weights": {"A": "x"}}}
    )
    # every problem on the one line
    both = error_of({"lock_wiat": 3, "rpc_timeout": "abc"})
    assert "lock_wiat" in both and "rpc_timeout" in both


def test_semantic_checks_are_one_line() -> None:
    assert "not a host:port address: 'nowhere'" in error_of({"listen": "nowhere"})
    assert "has port 0: a node needs a fixed port" in error_of({"listen": "127.0.0.1:0"})
    assert "protocol must be [min, max]" in error_of({"protocol": [2, 1]})
    assert "min_votes must be a positive integer" in error_of({"quorum": {"mode": "min_votes"}})
    assert "application module" in error_of({"app": [1]})


def test_nested_tables_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = from_mapping(
        {
            "name": "A",
            "data": "/d",
            "join": "B@127.0.0.1:7102, 127.0.0.1:7103",
            "raft": {"election_timeout": 2.0},
            "quorum": {"mode": "min_votes", "min_votes": 2, "weights": {"A": 2}},
            "tls": {"cert": "c.pem", "key": "k.pem"},
            "discovery": {"enabled": True, "ports": [7000, 7010]},
            "lock_wait": 1.5,
        }
    )
    path = tmp_path / "node.toml"
    write(path, cfg)
    text = path.read_text()
    assert "[raft]" in text and "[tls]" in text
    assert tomllib.loads(text)["raft"] == {"election_timeout": 2.0}
    again = load(path)
    assert again == cfg
    assert again.join == ["B@127.0.0.1:7102", "127.0.0.1:7103"]
    # what reaches the layers below: only the keys set
    assert again.extra == {
        "raft": {"election_timeout": 2.0},
        "quorum": {"mode": "min_votes", "min_votes": 2, "weights": {"A": 2}},
        "lock_wait": 1.5,
    }
    assert isinstance(again.tls.runtime(), TLSConfig) and again.tls.runtime().cert == "c.pem"
    assert isinstance(again.discovery.runtime(), DiscoveryConfig)


def test_bad_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "n.toml"
    path.write_text('name = "A"\nrpc_timeout = "abc"\n')
    with pytest.raises(ConfigError, match=r"^config .*n\.toml: config key 'rpc_timeout'"):
        load(path)
    path.write_text("name = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load(path)


def test_options_are_checked_and_kept_partial() -> None:
    assert check_options({"lock_wait": 3, "raft": {"election_timeout": 2}}) == {
        "lock_wait": 3.0,
        "raft": {"election_timeout": 2.0},
    }
    with pytest.raises(ConfigError, match="did you mean 'lock_wait'"):
        check_options({"lock_wiat": 3})


def test_assignment_is_checked() -> None:
    cfg = NodeConfig()
    with pytest.raises(ValueError, match="not a host:port"):
        cfg.listen = "nowhere"


def test_defaults_equal_the_layers_defaults() -> None:
    cfg = NodeConfig()
    service = ServiceConfig()
    for key in SERVICE_KEYS:
        assert getattr(cfg, key) == getattr(service, key), key
    assert cfg.raft.model_dump() == dataclasses.asdict(RaftConfig())
    assert cfg.tls.runtime() == TLSConfig()
    assert cfg.discovery.runtime() == DiscoveryConfig()
    assert QuorumPolicy.from_config(cfg.quorum.model_dump(exclude_unset=True)) == QuorumPolicy()
    assert cfg.extra == {}


def test_operations_doc_lists_every_key() -> None:
    path = ROOT / "docs" / "operations.md"
    text = path.read_text()
    assert config_doc.render(text) == text, (
        "docs/operations.md is out of date: run python -m nonstop.node.config_doc"
    )
    for key in NodeConfig.model_fields:
        assert f"`{key}`" in text, key
