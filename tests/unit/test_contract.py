"""The outside, as the project's own reference docs write it (docs/): tables, columns,
views, macros, topics, counters, dead-letter reasons, commands. tests/spec checks those docs
against the product contract they were written from."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from memdiag.analytics.db import init_schema
from memdiag.cli import build_parser
from memdiag.contract import (
    COUNTER_ATTRIBUTES,
    COUNTER_HELP,
    INPUT_REASONS,
    PROCESSING_ERROR,
    SINK_REJECTED,
)
from memdiag.settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def documented(page: str, kind: str) -> dict[str, str]:
    """``name(columns)`` in backticks, from docs/PAGE, under its ``## KIND`` heading."""
    text = (DOCS / page).read_text()
    section = text.split(f"## {kind}", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"`([a-z_]+)\(([^)]*)\)`", section))


TABLES = documented("tables.md", "Tables")
VIEWS = documented("tables.md", "Views")
#: macro -> its columns (the backticked list after "returns")
MACROS = {
    name: re.search(
        rf"`{name}\([^)]*\)` returns\s+`\(([^)]*)\)`", (DOCS / "tables.md").read_text()
    ).group(1)  # type: ignore[union-attr]
    for name in documented("tables.md", "Table macros")
}


def _columns(spec: str) -> list[str]:
    return [c.strip().strip('"') for c in spec.split(",")]


def test_the_docs_list_every_table_view_and_macro(con: duckdb.DuckDBPyConnection) -> None:
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    views = {
        r[0]
        for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()
    }
    macros = {
        r[0]
        for r in con.execute(
            "SELECT function_name FROM duckdb_functions() "
            "WHERE function_type = 'table_macro' AND NOT internal"
        ).fetchall()
    }
    assert (set(TABLES), set(VIEWS), set(MACROS)) == (tables, views, macros)


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect(":memory:")
    init_schema(c)
    return c


@pytest.mark.parametrize("table", sorted(TABLES))
def test_tables_have_exactly_the_documented_columns(
    con: duckdb.DuckDBPyConnection, table: str
) -> None:
    have = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    assert have == _columns(TABLES[table])


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_have_exactly_the_documented_columns(
    con: duckdb.DuckDBPyConnection, view: str
) -> None:
    have = [r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()]
    assert have == _columns(VIEWS[view])


def test_topics() -> None:
    topics = Settings().topics
    assert topics.all() == tuple(
        f"memdiag.{t}"
        for t in (
            "events",
            "judgements",
            "memory",
            "otlp_spans",
            "diagnostics",
            "weights",
            "graph_weights",
            "counters",
            "deadletter",
        )
    )
    text = (DOCS / "topics.md").read_text().split("## Messages", 1)[0]
    # a key column may hold escaped pipes (edge:SOURCE\|TARGET\|RELATIONSHIP)
    table = dict(re.findall(r"^\| `(memdiag\.[a-z_]+)` \| ((?:[^|\\]|\\.)+) \|", text, re.M))
    assert tuple(table) == topics.all()
    for internal in (topics.observation_steps, topics.session_verdicts, topics.otlp_traces,
                     topics.span_events):  # fmt: skip
        assert f"`{internal}`" in text


def test_the_docs_list_every_counter_with_its_attributes() -> None:
    text = (DOCS / "topics.md").read_text().split("## Counters", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_.]+)` \|\s*([^|]*?)\s*\|", text, re.M)
    documented_attrs = {name: frozenset(re.findall(r"`(\w+)`", attrs)) for name, attrs in rows}
    assert documented_attrs == COUNTER_ATTRIBUTES
    assert set(documented_attrs) == set(COUNTER_HELP)


def test_the_docs_list_every_dead_letter_reason() -> None:
    text = (DOCS / "topics.md").read_text().split("## Dead letters", 1)[1]
    reasons = re.findall(r"^\| `([a-z_]+)` \|", text, re.M)
    assert reasons == [*INPUT_REASONS, PROCESSING_ERROR, SINK_REJECTED]


def test_commands_and_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--input", "f.jsonl", "--db", "d.duckdb", "--json"])
    assert (args.command, args.input, args.db, args.json) == ("run", "f.jsonl", "d.duckdb", True)
    assert parser.parse_args(["publish", "f.jsonl"]).file == "f.jsonl"
    for command in ("demo", "worker", "sink"):
        assert parser.parse_args([command]).command == command


@pytest.mark.parametrize("macro", sorted(MACROS))
def test_macros_have_exactly_the_documented_columns(
    con: duckdb.DuckDBPyConnection, macro: str
) -> None:
    have = [d[0] for d in con.execute(f"SELECT * FROM {macro}()").description]  # noqa: S608
    assert have == _columns(MACROS[macro])


def test_macro_parameters_are_named_as_documented(con: duckdb.DuckDBPyConnection) -> None:
    for name, params in documented("tables.md", "Table macros").items():
        names = [p.split(":=")[0].strip() for p in params.split(",")]
        got = con.execute(
            "SELECT parameters FROM duckdb_functions() WHERE function_name = ?", [name]
        ).fetchone()
        assert got is not None and list(got[0]) == names, name
    con.execute(
        "SELECT * FROM failure_category_distribution(org_id := 'o', project_id := 'p', "
        "since := TIMESTAMPTZ '2026-11-01 00:00:00+00')"
    ).fetchall()
    con.execute(
        "SELECT * FROM misleading_observations(org_id := 'o', since := '2026-11-01')"
    ).fetchall()


def test_id_lists_are_varchar_lists(con: duckdb.DuckDBPyConnection) -> None:
    types = dict((r[0], r[1]) for r in con.execute("DESCRIBE session_diagnostics").fetchall())
    for column in (
        "injected_observation_ids",
        "injected_graph_entity_ids",
        "injected_graph_edge_keys",
        "helpful_observation_ids",
        "misleading_observation_ids",
        "ignored_observation_ids",
    ):
        assert types[column] == "VARCHAR[]", column


def test_query_commands() -> None:
    parser = build_parser()
    a = parser.parse_args(
        [
            "query",
            "failure-distribution",
            "--org",
            "o",
            "--project",
            "p",
            "--since",
            "7d",
            "--json",
            "--db",
            "d",
        ]
    )
    # --since is read as the parser reads it: a time, 7 days back from now
    assert (a.question, a.org, a.project, a.json, a.db) == (
        "failure-distribution",
        "o",
        "p",
        True,
        "d",
    )
    assert abs((datetime.now(UTC) - a.since).total_seconds() - 7 * 86_400) < 60
    a = parser.parse_args(["query", "misleading", "--org", "o", "--since", "1d", "--limit", "5"])
    assert (a.question, a.limit) == ("misleading", 5)
    a = parser.parse_args(["query", "observation-stats", "obs_7", "--json"])
    assert a.observation_id == "obs_7"
    a = parser.parse_args(["query", "observation-history", "obs_7", "--limit", "3"])
    assert (a.observation_id, a.limit) == ("obs_7", 3)
    assert parser.parse_args(["query", "observation-history", "obs_7"]).limit == 100


def test_benchmark_commands() -> None:
    parser = build_parser()
    a = parser.parse_args(["report", "scores", "--run-id", "R", "--out", "scores.json"])
    assert (a.report, a.run_id, a.out) == ("scores", "R", "scores.json")
    a = parser.parse_args(["compare", "--baseline", "A", "--candidate", "B", "--json"])
    assert (a.baseline, a.candidate, a.json, a.resamples) == ("A", "B", True, 10_000)


def test_the_scores_file_schema_is_valid() -> None:
    from jsonschema import Draft202012Validator

    from memdiag.schemas import load_schema

    Draft202012Validator.check_schema(load_schema("scores"))


def test_status_and_alert_commands() -> None:
    parser = build_parser()
    a = parser.parse_args(["status", "--db", "d", "--json"])
    assert (a.command, a.db, a.json) == ("status", "d", True)
    a = parser.parse_args(["alert", "--rule", "followup_rate > 0.3 for 5m", "--rules", "f"])
    assert (a.rule, a.rules) == (["followup_rate > 0.3 for 5m"], "f")
    assert parser.parse_args(["report", "html", "--out", "r.html"]).out == "r.html"
