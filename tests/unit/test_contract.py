"""The outside, exactly as CONTRACT.md writes it: tables, columns, views, topics, commands."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from analytics.db import init_schema
from memdiag.cli import build_parser
from memdiag.settings import Settings

CONTRACT = Path(__file__).resolve().parents[3] / "shared" / "CONTRACT.md"
# Implemented so far; the rest arrive with their issues.
TABLES = {
    "searches": "event_id, session_id, ts, source, result_count, is_followup, prev_event_id, "
    "gap_seconds, agent_id, org_id, project_id",
    "dead_letters": 'topic, partition, "offset", reason, detail, payload, ts',
}
VIEWS = {"followup_rate": "agent_searches, followups, rate"}


def _columns(spec: str) -> list[str]:
    return [c.strip().strip('"') for c in spec.split(",")]


def test_the_contract_text_still_lists_these_columns() -> None:
    if not CONTRACT.exists():
        pytest.skip("shared/CONTRACT.md not beside the checkout")
    text = CONTRACT.read_text()
    for name, spec in {**TABLES, **VIEWS}.items():
        match = re.search(rf"`{name}\(([^)]*)\)`", text)
        assert match, name
        assert _columns(match.group(1)) == _columns(spec), name


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect(":memory:")
    init_schema(c)
    return c


@pytest.mark.parametrize("table", sorted(TABLES))
def test_tables_have_the_contract_columns(con: duckdb.DuckDBPyConnection, table: str) -> None:
    have = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    missing = [c for c in _columns(TABLES[table]) if c not in have]
    assert not missing


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_have_exactly_the_contract_columns(con: duckdb.DuckDBPyConnection, view: str) -> None:
    have = [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()]
    assert have == _columns(VIEWS[view])


def test_topics() -> None:
    assert Settings().topics.all() == tuple(
        f"memdiag.{t}"
        for t in ("events", "judgements", "diagnostics", "weights", "counters", "deadletter")
    )


def test_commands_and_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--input", "f.jsonl", "--db", "d.duckdb", "--json"])
    assert (args.command, args.input, args.db, args.json) == ("run", "f.jsonl", "d.duckdb", True)
    assert parser.parse_args(["publish", "f.jsonl"]).file == "f.jsonl"
    for command in ("demo", "worker", "sink"):
        assert parser.parse_args([command]).command == command
