"""The distributed benchmark's PostgreSQL sync-standby peer and its options, without
PostgreSQL: the servers' settings and commands, ``--peers``, ``--nonstop-option``,
and the report's sync-standby table.  The real setup runs in ``make bench-dist``."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.distributed_bench import (
    OWN,
    PG,
    PG_APPLY,
    PG_SYNC,
    Cell,
    Config,
    cluster_options,
    main,
    parse_peers,
    pgbench_table,
    sync_standby_table,
)
from bench.nonstop_options import describe, parse_nonstop_options
from bench.peers import Result
from bench.pg_peer import (
    PGBENCH_TRANSFER,
    SYNC_STANDBY_SQL,
    basebackup_command,
    postgres_command,
    primary_settings,
    session_options,
    standby_settings,
)


# ------------------------------------------------------------ server settings
def test_primary_streams_wal_durably_on_loopback_without_naming_its_standby() -> None:
    s = primary_settings(5432, "/tmp/x")
    assert s["listen_addresses"] == "127.0.0.1"
    assert (s["fsync"], s["synchronous_commit"], s["full_page_writes"]) == ("on", "on", "on")
    assert s["wal_level"] == "replica" and int(s["max_wal_senders"]) >= 1
    # Set later by ALTER SYSTEM: on the command line it would override that.
    assert "synchronous_standby_names" not in s


def test_standby_has_its_own_port_and_the_primarys_durability() -> None:
    primary, standby = primary_settings(5432, "/d"), standby_settings(5433, "/d")
    assert standby["port"] == "5433" and primary["port"] == "5432"
    assert standby["hot_standby"] == "on"
    for key in ("fsync", "synchronous_commit", "full_page_writes", "listen_addresses"):
        assert standby[key] == primary[key]
    # A hot standby refuses to start with fewer connections than its primary.
    assert int(standby["max_connections"]) >= int(primary["max_connections"])


def test_every_standby_that_streams_is_synchronous() -> None:
    assert SYNC_STANDBY_SQL == "ALTER SYSTEM SET synchronous_standby_names = '*'"


def test_postgres_command_passes_each_setting_with_c() -> None:
    cmd = postgres_command(Path("/b"), Path("/d"), {"port": "1", "fsync": "on"})
    assert cmd == ["/b/postgres", "-D", "/d", "-c", "port=1", "-c", "fsync=on"]


def test_base_backup_copies_the_primary_as_a_standby_of_it() -> None:
    cmd = basebackup_command(Path("/b"), 6000, Path("/t/standby"))
    assert cmd[0] == "/b/pg_basebackup"
    assert "-R" in cmd  # standby.signal + primary_conninfo
    assert cmd[cmd.index("-X") + 1] == "stream"
    assert cmd[cmd.index("-D") + 1] == "/t/standby"
    assert cmd[cmd.index("-h") + 1] == "127.0.0.1" and cmd[cmd.index("-p") + 1] == "6000"


def test_session_commit_level() -> None:
    assert session_options(None) == ""
    assert session_options("on") == "-c synchronous_commit=on"
    assert session_options("remote_apply") == "-c synchronous_commit=remote_apply"
    with pytest.raises(ValueError, match="local"):
        session_options("local")


# ----------------------------------------------------------------- --peers
def test_peers_are_known_names_in_a_fixed_order_with_pg() -> None:
    assert parse_peers("pg-sync-apply, pg,pg-sync,pg") == ("pg", "pg-sync", "pg-sync-apply")
    assert parse_peers("pg") == ("pg",)
    with pytest.raises(ValueError, match="unknown pg-async"):
        parse_peers("pg,pg-async")
    with pytest.raises(ValueError, match="must include pg"):
        parse_peers("pg-sync")


def test_bad_arguments_stop_the_bench_before_anything_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (["--peers", "pg-sync"], ["--nonstop-option", "ha.dta=partitions"]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "must include pg" in err and "ha.dta" in err


# --------------------------------------------------------- --nonstop-option
def test_dotted_keys_make_tables_and_values_are_json_else_strings() -> None:
    got = parse_nonstop_options(
        ["ha.data=partitions", "ha.policies.default.replicas=0", "lock_wait=2"]
    )
    assert got == {
        "ha": {"data": "partitions", "policies": {"default": {"replicas": 0}}},
        "lock_wait": 2,
    }
    assert parse_nonstop_options([]) == {}


def test_a_table_and_its_dotted_keys_merge_and_a_key_set_twice_is_refused() -> None:
    got = parse_nonstop_options(['ha={"data": "partitions"}', "ha.policies.default.replicas=0"])
    assert got["ha"] == {"data": "partitions", "policies": {"default": {"replicas": 0}}}
    with pytest.raises(ValueError, match="lock_wait is set twice"):
        parse_nonstop_options(["lock_wait=1", "lock_wait=2"])


def test_malformed_or_unknown_options_are_errors_naming_them() -> None:
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_nonstop_options(["ha.data"])
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_nonstop_options(["ha..data=x"])
    with pytest.raises(ValueError, match=r"ha\.dta"):
        parse_nonstop_options(["ha.dta=partitions"])
    with pytest.raises(ValueError, match="lock_wait"):
        parse_nonstop_options(["lock_wait=soon"])


def test_the_report_quotes_the_options_or_says_defaults() -> None:
    assert describe(["ha.data=partitions"]) == "`ha.data=partitions`"
    assert "defaults" in describe([])


def test_cluster_options_follow_the_callers_ha_table() -> None:
    assert cluster_options("nodes", None) == ({"ha": {"data": "nodes"}}, "nodes", 16)
    opts, data, parts = cluster_options("partitions", None)
    assert data == "partitions" and parts == 16
    assert opts["ha"]["policies"]["default"]["replicas"] == 0
    own = {"ha": {"data": "partitions", "policies": {"default": {"replicas": 1, "partitions": 8}}}}
    opts, data, parts = cluster_options("nodes", own)
    assert (opts, data, parts) == (own, "partitions", 8)


# ------------------------------------------------------------------ report
def _cell(system: str, clients: int, rate: float, roles: dict[str, float] | None = None) -> Cell:
    cell = Cell(system, clients, results=[Result(int(rate * 2), 2.0, [0.01])])
    if roles is not None:
        cell.server_cpu_by_role.append(roles)
    return cell


def test_sync_standby_table_gives_ratios_cpu_split_and_the_goal() -> None:
    cfg = Config(clients=(16, 64))
    cells = {}
    for clients, ns_rate in ((16, 100.0), (64, 300.0)):
        cells[("nonstop", clients)] = _cell("nonstop", clients, ns_rate)
        cells[(OWN, clients)] = _cell(OWN, clients, ns_rate)
        cells[(PG, clients)] = _cell(PG, clients, 1000.0)
        cells[(PG_SYNC, clients)] = _cell(PG_SYNC, clients, 200.0, {"primary": 500, "standby": 90})
        cells[(PG_APPLY, clients)] = _cell(
            PG_APPLY, clients, 150.0, {"primary": 520, "standby": 110}
        )
    table = "\n".join(sync_standby_table(cfg, cells))
    assert "| 16 | 0.50 | 0.67 | 500 + 90 | 520 + 110 |  |" in table
    assert "| 64 | 1.50 | 2.00 | 500 + 90 | 520 + 110 | ≥ 1× on: **met** |" in table
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| clients"))
    rule = lines[lines.index(header) + 1]
    assert header.count("|") == rule.count("|")


def test_no_sync_standby_table_without_sync_peers() -> None:
    cfg = Config(clients=(1,), peers=("pg",))
    cells = {("nonstop", 1): _cell("nonstop", 1, 1.0), (PG, 1): _cell(PG, 1, 1.0)}
    assert sync_standby_table(cfg, cells) == []


# ------------------------------------------------------------ pgbench
def test_pgbench_script_moves_one_unit_between_two_accounts_locked_in_id_order() -> None:
    lines = PGBENCH_TRANSFER.splitlines()
    assert lines[0] == "\\set a random(0, :n - 1)"
    assert "\\set b (case when :b >= :a then :b + 1 else :b end)" in lines  # b != a
    updates = [line for line in lines if line.startswith("UPDATE")]
    assert [u.split("WHERE id = ")[1] for u in updates] == [":lo;", ":hi;"]
    assert sum("then -1 else 1" in u for u in updates) == 2  # -1 on a, +1 on b
    assert lines[-1] == "END;" and any(line.startswith("INSERT INTO transfers") for line in lines)


def test_pgbench_table_gives_nonstop_over_pgbench_per_client_count() -> None:
    cell = Cell("nonstop", 64)
    cell.results.append(Result(ops=500, seconds=1.0, latencies=[0.01]))
    table = pgbench_table(
        {("nonstop", 64): cell}, {64: {"tps": 2000.0, "latency_ms": 30.0, "server_cpu_us": 450}}
    )
    assert table[0] == "## Against pgbench (PostgreSQL with a sync standby)"
    assert "| 64 | 2,000 | 30.00 | 450 | 500 | 0.250 |" in table
    assert pgbench_table({}, {}) == []
