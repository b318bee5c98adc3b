"""The analyst's side of the session diagnostics: tables, the view, the macros, the queries.

Records come from the worker's own logic (``tests/unit/test_sessions.Worker``), so these
tests check what the sink does with what the worker really sends.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag.analytics import queries
from memdiag.analytics.db import DatabaseError, sql
from memdiag.analytics.sink import DuckDBSink
from tests.unit.test_sessions import (
    Worker,
    example_events,
    session,
    sessions_on_distinct_partitions,
)


def fill(sink: DuckDBSink, w: Worker) -> None:
    sink.write([*w.records, *w.weights])


@pytest.fixture
def db(tmp_path: Path) -> DuckDBSink:
    s = DuckDBSink(tmp_path / "a.duckdb")
    s.init()
    return s


def con_of(sink: DuckDBSink) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(sink.path, read_only=True)


def test_the_contract_example_lands_in_every_table(db: DuckDBSink) -> None:
    w = Worker()
    w.publish(example_events())
    fill(db, w)
    with con_of(db) as con:
        assert con.execute(
            "SELECT observation_id, signal FROM retrieval_feedback ORDER BY 1"
        ).fetchall() == [("obs_7", "used"), ("obs_9", "ignored")]
        assert con.execute("SELECT * FROM observation_feedback_stats ORDER BY 1").fetchall() == [
            ("obs_7", 1, 0),
            ("obs_9", 0, 1),
        ]
        row = con.execute(
            "SELECT outcome, failure_category, injected_observation_ids, "
            "injected_graph_edge_keys, ignored_observation_ids, misleading_observation_ids, "
            "search_count, followup_count, tool_call_summary[1].tool, errors_encountered[1].message, "
            "failure_context FROM session_diagnostics"
        ).fetchone()
        assert row == (
            "rejected",
            "test_failure",
            ["obs_7", "obs_9"],
            ["node_x|node_y|DEPENDS_ON"],
            ["obs_9"],
            [],
            2,
            1,
            "vitest",
            "2 tests failed",
            None,
        )
        assert con.execute(
            "SELECT observation_id, weight, step FROM observation_weights ORDER BY 1"
        ).fetchall() == [("obs_7", 0.8, 1), ("obs_9", 0.8, 1)]
        assert con.execute("SELECT count(*) FROM observation_weight_history").fetchone() == (2,)
        dist = dict(con.execute("SELECT * FROM failure_category_distribution()").fetchall())
        assert dist == {
            "test_failure": 1,
            "style": 0,
            "regression": 0,
            "incomplete": 0,
            "wrong_approach": 0,
            "other": 0,
            "unknown": 0,
        }


def test_replay_gives_the_same_duckdb(db: DuckDBSink) -> None:
    sids = sessions_on_distinct_partitions(4)
    events = [e for sid in sids for e in session(sid, "rejected", ["m", sid])]
    w = Worker()
    w.publish(events)
    fill(db, w)
    tables = [
        "retrieval_feedback",
        "session_diagnostics",
        "observation_weights",
        "observation_weight_history",
    ]

    def snapshot() -> dict:
        with con_of(db) as con:
            return {
                t: sorted(
                    con.execute(f"SELECT * EXCLUDE (ingested_at) FROM {t}").fetchall()  # noqa: S608
                    if t in ("retrieval_feedback", "session_diagnostics")
                    else con.execute(f"SELECT * FROM {t}").fetchall(),  # noqa: S608
                    key=repr,
                )
                for t in tables
            }

    before = snapshot()
    w.records.clear()
    w.weights.clear()
    w.publish(events)
    fill(db, w)
    assert snapshot() == before
    assert before["observation_weights"][0][0] == "m"


def test_misleading_macro_and_filters(db: DuckDBSink) -> None:
    w = Worker()
    sids = sessions_on_distinct_partitions(4)
    for i, sid in enumerate(sids):
        for e in session(sid, "rejected", ["bad", "also"], ts=f"2026-11-2{i}T10:00:00Z"):
            e["org_id"] = "org_a" if i < 3 else "org_b"
            w.publish([e])
    w.publish(session("fine", "accepted", ["also"]))
    fill(db, w)
    with con_of(db) as con:
        assert queries.misleading(con) == [
            {
                "observation_id": "bad",
                "fail_count": 4,
                "success_count": 0,
                "weight": pytest.approx(0.8 * 0.8 * 0.6 * 0.6),
            }
        ]
        # within org_a, "also" was never in an accepted session (that one has no org)
        assert [r["observation_id"] for r in queries.misleading(con, org="org_a")] == [
            "also",
            "bad",
        ]
        assert queries.misleading(con, org="org_b") == []  # one failure there
        since = datetime(2026, 11, 22, tzinfo=UTC)
        assert queries.misleading(con, since=since) == []  # only 2 failures from then on
        assert con.execute(
            "SELECT * FROM misleading_observations(org_id := 'org_a', since := '2026-11-20')"
        ).fetchall() == [("also", 3, 0), ("bad", 3, 0)]
        dist = {
            r["failure_category"]: r["sessions"]
            for r in queries.failure_distribution(con, org="org_b")
        }
        assert dist["wrong_approach"] == 1 and sum(dist.values()) == 1


def test_failure_distribution_counts_foreign_categories_as_unknown(db: DuckDBSink) -> None:
    w = Worker()
    w.publish(session("s1", "rejected", []))
    w.publish(session("s2", "rework", []))
    records = [dict(r) for r in w.records]
    records[-1] = {**records[-1], "failure_category": "cosmic_rays"}
    db.write(records)
    with con_of(db) as con:
        rows = queries.failure_distribution(con, project=None)
    assert [r["failure_category"] for r in rows] == [
        "test_failure",
        "style",
        "regression",
        "incomplete",
        "wrong_approach",
        "other",
        "unknown",
    ]
    assert {r["failure_category"]: r["sessions"] for r in rows}["unknown"] == 1


def test_observation_queries(db: DuckDBSink) -> None:
    w = Worker()
    w.publish(example_events())
    fill(db, w)
    with con_of(db) as con:
        stats = queries.observation_stats(con, "obs_7")
        assert (stats["used"], stats["ignored"], stats["used_share"]) == (1, 0, 1.0)
        assert stats["weight"] == 0.8 and stats["misleading"] is False
        assert queries.observation_stats(con, "nope")["used_share"] is None
        history = queries.observation_history(con, "obs_9", limit=5)
        assert [(h["session_id"], h["turn_id"], h["signal"]) for h in history] == [
            ("ses_abc", "t1", "ignored")
        ]


def test_history_is_most_recent_first_and_limited(db: DuckDBSink) -> None:
    w = Worker()
    for day in range(1, 6):
        w.publish(session(f"s{day}", "accepted", ["o"], ts=f"2026-11-0{day}T10:00:00Z"))
    fill(db, w)
    with con_of(db) as con:
        history = queries.observation_history(con, "o", limit=3)
    assert [h["session_id"] for h in history] == ["s5", "s4", "s3"]


def test_an_older_weight_step_never_overwrites_a_newer_one(db: DuckDBSink) -> None:
    w = Worker()
    for i in range(3):
        w.publish(session(f"s{i}", "rejected", ["o"]))
    steps = [r for r in w.weights]
    db.write([steps[2]])
    db.write([steps[0], steps[1]])
    with con_of(db) as con:
        assert con.execute("SELECT step FROM observation_weights").fetchone() == (3,)
        assert con.execute("SELECT count(*) FROM observation_weight_history").fetchone() == (3,)


def test_since_parsing() -> None:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    assert queries.parse_since("24h", now) == datetime(2026, 11, 21, 12, tzinfo=UTC)
    assert queries.parse_since("7d", now) == datetime(2026, 11, 15, 12, tzinfo=UTC)
    assert queries.parse_since("2026-11-21") == datetime(2026, 11, 21, tzinfo=UTC)
    assert queries.parse_since("2026-11-21T09:30:00Z") == datetime(2026, 11, 21, 9, 30, tzinfo=UTC)
    with pytest.raises(ValueError, match="duration back from now"):
        queries.parse_since("yesterday")


def test_an_old_file_gets_an_upgrade_hint(tmp_path: Path) -> None:
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE searches(event_id VARCHAR)")
    with (
        duckdb.connect(str(path), read_only=True) as con,
        pytest.raises(DatabaseError, match="upgrade"),
    ):
        queries.observation_history(con, "o")


NAIVE_MISLEADING = """
SELECT observation_id,
       count(*) FILTER (WHERE outcome <> 'accepted') AS fail_count,
       count(*) FILTER (WHERE outcome = 'accepted') AS success_count
FROM (SELECT unnest(injected_observation_ids) AS observation_id, outcome, org_id, ts
      FROM session_diagnostics)
WHERE ($org IS NULL OR org_id = $org) AND ($since IS NULL OR ts >= $since)
GROUP BY 1
HAVING count(*) FILTER (WHERE outcome <> 'accepted') >= 3
   AND count(*) FILTER (WHERE outcome = 'accepted') = 0
ORDER BY fail_count DESC, observation_id
"""


def diagnostic(sid: str, outcome: str, obs: list[str], ts: str, org: str | None) -> dict:
    return {
        "kind": "session_diagnostic",
        "event_id": f"{sid}-{ts}",
        "session_id": sid,
        "outcome": outcome,
        "failure_category": None if outcome == "accepted" else "other",
        "injected_observation_ids": obs,
        "injected_graph_entity_ids": [],
        "injected_graph_edge_keys": [],
        "helpful_observation_ids": [],
        "misleading_observation_ids": [],
        "ignored_observation_ids": [],
        "search_count": 0,
        "followup_count": 0,
        "ts": ts,
        "org_id": org,
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([f"s{i}" for i in range(8)]),
            st.sampled_from(["accepted", "rejected", "rework"]),
            st.lists(st.sampled_from(["a", "b", "c", "d"]), unique=True, max_size=4),
            st.sampled_from(
                [
                    "2026-11-20T23:30:00Z",
                    "2026-11-21T00:00:00Z",
                    "2026-11-21T12:00:00Z",
                    "2026-11-22T06:00:00+02:00",
                ]
            ),
            st.sampled_from([None, "o1", "o2"]),
        ),
        max_size=25,
    ),
    st.lists(st.integers(1, 6), max_size=4),
    st.sampled_from(
        [None, "2026-11-21T00:00:00Z", "2026-11-21T06:00:00Z", "2026-11-21T23:00:00+05:00"]
    ),
    st.sampled_from([None, "o1"]),
)
def test_the_daily_rollup_gives_what_a_full_scan_gives(writes, cuts, since, org) -> None:
    """Replacements, replays, org filters and a `since` inside a day all agree with the
    definition computed from session_diagnostics alone."""
    import tempfile

    records = [diagnostic(*w) for w in writes]
    with tempfile.TemporaryDirectory() as d:
        sink = DuckDBSink(Path(d) / "r.duckdb")
        sink.init()
        start = 0
        for cut in [*cuts, len(records)]:  # several batches, some records written twice
            sink.write(records[start : start + cut])
            start = max(0, start + cut - 1)
        with duckdb.connect(sink.path, read_only=True) as con:
            fast = con.execute(
                "SELECT * FROM misleading_observations(org_id := $org, since := $since)",
                {"org": org, "since": since},
            ).fetchall()
            naive = con.execute(
                NAIVE_MISLEADING, {"org": org, "since": since and datetime.fromisoformat(since)}
            ).fetchall()
            assert fast == naive
            # and the rollup equals a rebuild from scratch
            live = con.execute("SELECT * FROM observation_outcome_days ORDER BY ALL").fetchall()
        with duckdb.connect(sink.path) as con:
            con.execute(sql("rebuild_observation_outcome_days"))
            rebuilt = con.execute("SELECT * FROM observation_outcome_days ORDER BY ALL").fetchall()
        assert live == rebuilt
