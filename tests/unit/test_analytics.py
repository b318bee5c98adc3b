"""The analyst's side of the session diagnostics: tables, the view, the macros, the queries.

Records come from the worker's own logic (``tests/unit/test_sessions.Worker``), so these
tests check what the sink does with what the worker really sends.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag.analytics import queries
from memdiag.analytics.db import DatabaseError, sql
from memdiag.analytics.lookup import NotFound
from memdiag.analytics.sink import DuckDBSink
from tests.sizes import examples
from tests.unit.test_sessions import (
    Worker,
    example_events,
    session,
    sessions_on_distinct_partitions,
)


def fill(sink: DuckDBSink, w: Worker) -> None:
    sink.write([*w.records, *w.weights, *w.strengths, *w.graph_weights])


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
        found = queries.misleading(con)
        assert found == [
            {
                "observation_id": "bad",
                "fail_count": 4,
                "success_count": 0,
                "weight": pytest.approx(0.8 * 0.8 * 0.6 * 0.6),
                # the newest failed session it was in: where to read it first
                "latest_failed_session_id": sids[3],
            }
        ]
        assert found.total == 1 and not found.cut
        assert queries.misleading(con, org="org_a", limit=1).total == 2  # "also" and "bad"
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
        with pytest.raises(NotFound, match=r"no such memory 'obs_77'.*obs_7") as unknown:
            queries.observation_stats(con, "obs_77")  # an unknown id is an error, with the closest
        assert unknown.value.closest[0] == "obs_7" and unknown.value.known == 2
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
    assert queries.parse_since("3650d", now) == now - timedelta(days=3650)
    # past datetime's range (or timedelta's): refused as a bad value, not an OverflowError
    for value in ("3651d", "3000000d", "99999999999d", "99999999999999999999w"):
        with pytest.raises(ValueError, match="at most ten years back"):
            queries.parse_since(value, now)


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


@pytest.mark.chaos
@settings(max_examples=examples(25), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
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


def test_strength_and_unused_memories(db: DuckDBSink) -> None:
    """A memory injected in 6 turns and never used is dead weight, with the strength its 6
    ignored verdicts give; one used once is not; a verdict taken back takes its step back."""
    w = Worker()
    events = []
    for i in range(6):
        events += session(f"d{i}", "accepted", ["dead", "kept"], ts=f"2026-11-21T10:0{i}:00Z")
    for e in events:  # "kept" says something of its own, quoted in the first session only
        if e["kind"] == "injection":
            e["observations"][1]["content"] = "rollback canary releases quickly"
        if e["kind"] == "response" and e["session_id"] == "d0":
            e["text"] = "we rollback canary releases quickly"
    w.publish(events)
    fill(db, w)
    with con_of(db) as con:
        unused = queries.unused_memories(con, min_injections=5)
        assert [(u["observation_id"], u["judged_turns"], u["sessions"]) for u in unused] == [
            ("dead", 6, 6)
        ]
        assert unused[0]["strength"] == pytest.approx(0.95**6)
        assert queries.unused_memories(con, min_injections=7) == []
        since = queries.parse_since("2026-11-21T10:03:00Z")
        assert queries.unused_memories(con, min_injections=3, since=since)[0]["judged_turns"] == 3
        stats = queries.observation_stats(con, "kept")
        assert stats["strength_steps"] == 6
        assert stats["strength"] == pytest.approx(0.95**5)  # used first (from 1.0), then 5 ignored
        history = con.execute(
            "SELECT session_id, signal, round(strength, 6) FROM observation_strength_history "
            "WHERE observation_id = 'kept' ORDER BY step"
        ).fetchall()
        assert [h[:2] for h in history] == [("d0", "used")] + [
            (f"d{i}", "ignored") for i in range(1, 6)
        ]


def test_graph_feedback_weights_and_misleading_graph(db: DuckDBSink) -> None:
    """Injected entities and edges take the outcome steps observations take; an edge in 3+
    failed sessions and no accepted one is misleading, whatever spelling named it."""
    w = Worker()
    events = []
    spellings = [
        {"source_id": "api", "target_id": "db", "relationship": "READS"},
        {"sourceId": "api", "targetId": "db", "relationshipName": "READS"},
        {"source_id": "api", "target_id": "db", "relationship_name": "READS"},
        {
            "sourceId": "api",
            "target_id": "db",
            "relationship": "READS",
            "relationshipName": "READS",
        },
    ]
    for i, edge in enumerate(spellings):
        s = session(f"g{i}", "rejected", ["o"], ts=f"2026-11-21T10:0{i}:00Z")
        s[0]["graph_entity_ids"] = ["api", "db"] if i else ["api"]
        s[0]["graph_edge_keys"] = [edge]
        for e in s:
            e["org_id"] = "org_a"
        events += s
    ok = session("fine", "accepted", ["o"], ts="2026-11-21T11:00:00Z")
    ok[0]["graph_entity_ids"] = ["db"]
    w.publish([*events, *ok])
    fill(db, w)
    assert {r["id"] for r in w.graph_weights} == {"entity:api", "entity:db", "edge:api|db|READS"}
    with con_of(db) as con:
        graph = {r["id"]: r for r in queries.misleading_graph(con)}
        assert set(graph) == {"api", "api|db|READS"}  # db was in an accepted session
        assert graph["api|db|READS"]["kind"] == "edge" and graph["api"]["kind"] == "entity"
        assert graph["api|db|READS"]["weight"] == pytest.approx(0.8 * 0.8 * 0.6 * 0.6)
        assert (
            con.execute("SELECT id FROM misleading_graph_edges(org_id := 'org_b')").fetchall() == []
        )
        since = "2026-11-21T10:02:00Z"
        assert (
            con.execute(f"SELECT id FROM misleading_graph_entities(since := '{since}')").fetchall()
            == []
        )
        row = con.execute(
            "SELECT kind, graph_id, step, failed_sessions, misleading FROM graph_weights "
            "WHERE id = 'entity:db'"
        ).fetchone()
        assert row == ("entity", "db", 4, 3, False)
