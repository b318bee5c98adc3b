from __future__ import annotations

import pytest

from memdiag.settings import ConfigError, Settings, bootstrap_servers


def test_defaults_follow_the_contract() -> None:
    s = Settings.from_env({})
    assert s.topics.all() == (
        "memdiag.events",
        "memdiag.judgements",
        "memdiag.memory",
        "memdiag.otlp_spans",
        "memdiag.diagnostics",
        "memdiag.weights",
        "memdiag.graph_weights",
        "memdiag.counters",
        "memdiag.deadletter",
    )
    assert s.followup_window_seconds == 30 and s.recent_search_retention_hours == 24
    assert s.max_event_bytes == 1024 * 1024 and s.duckdb_path == "memdiag.duckdb"
    assert s.broker == "kafka://localhost:9092" and s.store_text is False


def test_prefix_applies_to_every_topic() -> None:
    s = Settings.from_env({"MEMDIAG_TOPIC_PREFIX": "t1."})
    assert all(t.startswith("t1.") for t in s.topics.all())


def test_window_longer_than_retention_fails_at_start_up() -> None:
    with pytest.raises(ConfigError, match="longer than MEMDIAG_RECENT_SEARCH_RETENTION_HOURS"):
        Settings.from_env(
            {
                "AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS": "7200",
                "MEMDIAG_RECENT_SEARCH_RETENTION_HOURS": "1",
            }
        )


def test_bad_values_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="MEMDIAG_MAX_EVENT_BYTES"):
        Settings.from_env({"MEMDIAG_MAX_EVENT_BYTES": "lots"})
    with pytest.raises(ConfigError, match="MEMDIAG_STORE_TEXT"):
        Settings.from_env({"MEMDIAG_STORE_TEXT": "maybe"})
    with pytest.raises(ConfigError, match="MEMDIAG_MAX_OUTPUT_BYTES must be at least 16,384"):
        Settings.from_env({"MEMDIAG_MAX_OUTPUT_BYTES": "1000"})
    with pytest.raises(ConfigError, match=r"MEMDIAG_HEAP_TRIM_SECONDS must be >= 0 \(0: off\)"):
        Settings.from_env({"MEMDIAG_HEAP_TRIM_SECONDS": "-1"})


def test_round_trip_through_the_environment() -> None:
    s = Settings.from_env({"MEMDIAG_STORE_TEXT": "1", "MEMDIAG_EVENTS_PARTITIONS": "8"})
    assert Settings.from_env(s.as_env()) == s


def test_bootstrap_servers() -> None:
    assert bootstrap_servers("kafka://a:1;kafka://b:2") == "a:1,b:2"
    assert bootstrap_servers("localhost:9092") == "localhost:9092"


def test_the_duckdb_storage_version_is_a_version_or_latest() -> None:
    assert Settings().duckdb_storage_version == "v1.4.0"
    assert Settings.from_env({"MEMDIAG_DUCKDB_STORAGE_VERSION": "latest"}).duckdb_storage_version
    with pytest.raises(ConfigError, match="MEMDIAG_DUCKDB_STORAGE_VERSION"):
        Settings.from_env({"MEMDIAG_DUCKDB_STORAGE_VERSION": "1.4"})
