"""The DuckDB sink: upserts on natural keys, so redelivery and replay change nothing."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from memdiag.analytics.db import DatabaseError, _rekey, connect
from memdiag.analytics.sink import DuckDBSink


def search_row(eid: str, **kw) -> dict:
    return {
        "kind": "search",
        "event_id": eid,
        "session_id": "s",
        "ts": "2026-11-21T09:30:00Z",
        "source": "agent",
        "result_count": 1,
        "evaluated": True,
        "is_followup": False,
        "prev_event_id": None,
        "gap_seconds": None,
        "agent_id": None,
        "org_id": "o",
        "project_id": None,
        **kw,
    }


def probe_row(eid: str, **kw) -> dict:
    """A recall probe's row as the worker sends it: agent a's hit on m."""
    return {
        "kind": "recall_probe", "event_id": eid, "agent_id": "a", "memory_id": "m",
        "query_source": "name", "hit": True, "rank": 1, "score": 0.9, "k": 5,
        "threshold": 0.5, "result_count": 1, "top_ids": ["m"], "ts": "2026-11-21T09:30:00Z",
        **kw,
    }  # fmt: skip


def dead(did: str, **kw) -> dict:
    return {
        "kind": "dead_letter",
        "dead_letter_id": did,
        "topic": "memdiag.events",
        "partition": 0,
        "offset": 1,
        "batch_index": 0,
        "key": None,
        "reason": "not_json",
        "detail": "d",
        "payload": "x",
        "payload_bytes": 1,
        "payload_truncated": False,
        "ts": "2026-11-21T09:30:00Z",
        **kw,
    }


@pytest.fixture
def sink(tmp_path: Path) -> DuckDBSink:
    s = DuckDBSink(tmp_path / "t.duckdb")
    s.init()
    return s


def rows(sink: DuckDBSink, sql: str) -> list:
    con = duckdb.connect(sink.path, read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_redelivery_changes_nothing(sink: DuckDBSink) -> None:
    batch = [
        search_row("a"),
        search_row("b", is_followup=True, prev_event_id="a", gap_seconds=2.0),
        dead("d1"),
    ]
    sink.write(batch)
    before = (
        rows(sink, "SELECT * FROM searches ORDER BY event_id"),
        rows(sink, "SELECT * FROM dead_letters"),
    )
    sink.write(batch)
    sink.write(batch + batch)  # duplicates inside one batch too
    after = (
        rows(sink, "SELECT * FROM searches ORDER BY event_id"),
        rows(sink, "SELECT * FROM dead_letters"),
    )
    assert before == after
    assert len(after[0]) == 2 and len(after[1]) == 1


def test_first_dead_letter_sighting_stands(sink: DuckDBSink) -> None:
    sink.write([dead("d1", offset=1)])
    sink.write([dead("d1", offset=50)])
    assert rows(sink, 'SELECT "offset" FROM dead_letters') == [(1,)]


def test_a_corrected_row_rewrites_the_verdict_in_the_same_batch_or_later(
    sink: DuckDBSink,
) -> None:
    corrected = {**search_row("c"), "is_followup": True, "prev_event_id": "b", "gap_seconds": 3.5}
    sink.write([search_row("c"), corrected])
    assert rows(sink, "SELECT is_followup, prev_event_id, gap_seconds FROM searches") == [
        (True, "b", 3.5)
    ]
    sink.write([{**corrected, "is_followup": False}])
    assert rows(sink, "SELECT is_followup FROM searches") == [(False,)]


@pytest.mark.parametrize("how", ["together", "one by one", "isolating"])
def test_two_sessions_searches_under_one_id_are_two_searches(tmp_path: Path, how: str) -> None:
    """A producer that numbers each session's events from 1 gives two sessions' searches one
    id: each is its session's search, corrected on its own, and nothing is dead-lettered
    (another event under a taken id within a session is the session stage's to tell)."""
    sink = DuckDBSink(tmp_path / "t.duckdb")
    sink.init()
    first, corrected = search_row("1"), search_row("1", is_followup=True, prev_event_id="x")
    other = search_row("1", session_id="s2", org_id="o2")
    published = [first, other, corrected, other]
    if how == "together":
        sink.write(published)
    elif how == "one by one":
        for record in published:
            sink.write([record])
    else:
        for record in published:
            sink.add(record)
        sink.flush_isolating(lambda r, e: pytest.fail(f"refused {r}: {e}"))
    sink.write(published)  # redelivered: nothing more
    assert rows(sink, "SELECT session_id, org_id, is_followup FROM searches ORDER BY 1") == [
        ("s", "o", True),
        ("s2", "o2", False),
    ]
    assert rows(sink, "SELECT count(*) FROM dead_letters") == [(0,)]


def test_a_file_keyed_by_search_id_alone_is_keyed_by_session_and_id_on_open(
    tmp_path: Path,
) -> None:
    """A file from an older memdiag: its searches and judgement artifacts are copied under
    the new keys, rows and NOT NULL constraints kept, once."""
    path = tmp_path / "old.duckdb"
    sink = DuckDBSink(path)
    sink.init()
    sink.write([search_row("a"), search_row("b", is_followup=True, prev_event_id="a")])
    tables = ("searches", "judgement_artifacts", "recall_probe_events", "ambient_contexts")
    with duckdb.connect(str(path)) as con:  # back to the old key, as an older memdiag made it
        for table in tables:
            _rekey(con, table, ("event_id",))
    before = rows(sink, "SELECT * FROM searches ORDER BY event_id")
    for _ in range(2):  # the second open finds the new keys: nothing to do
        DuckDBSink(path).init()
    with duckdb.connect(str(path), read_only=True) as con:
        keys = dict(con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY' AND list_contains(?, table_name)",
            [list(tables)],
        ).fetchall())  # fmt: skip
        default = con.execute(
            "SELECT column_default FROM duckdb_columns() "
            "WHERE table_name = 'recall_probe_events' AND column_name = 'query_source'"
        ).fetchone()
        not_null = con.execute(
            "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'searches' "
            "AND constraint_type = 'NOT NULL' AND constraint_column_names = ['ts']"
        ).fetchone()
    assert keys == {"searches": ["session_id", "event_id"],
                    "judgement_artifacts": ["run_id", "event_id"],
                    "recall_probe_events": ["agent_id", "event_id"],
                    "ambient_contexts": ["agent_id", "event_id"]}  # fmt: skip
    assert not_null == (1,) and default == ("'name'",)  # constraints and defaults kept
    assert rows(sink, "SELECT * FROM searches ORDER BY event_id") == before
    sink.write([search_row("a", session_id="s2")])  # another session's "a": a row of its own
    assert rows(sink, "SELECT count(*) FROM searches") == [(3,)]


def test_views_exist_and_compute(sink: DuckDBSink) -> None:
    sink.write(
        [
            search_row("a"),
            search_row("b", is_followup=True),
            search_row("v", source="viewer", evaluated=False),
        ]
    )
    assert rows(sink, "SELECT agent_searches, followups, rate FROM followup_rate") == [(2, 1, 0.5)]


def test_failed_flush_keeps_the_batch(sink: DuckDBSink, tmp_path: Path) -> None:
    sink.add(search_row("a"))
    sink.add(search_row("b", ts="not a time"))  # DuckDB rejects the cast: nothing is written
    with pytest.raises(duckdb.Error):
        sink.flush()
    assert sink.pending == 2
    assert rows(sink, "SELECT count(*) FROM searches") == [(0,)]


def test_unknown_record_kinds_are_counted_not_written(sink: DuckDBSink) -> None:
    sink.write([{"kind": "from_the_future"}])
    assert sink.unknown_kinds == {"from_the_future": 1}


def test_reader_gets_a_clear_error_for_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="memdiag run"):
        connect(tmp_path / "nope.duckdb", read_only=True)


def test_reader_waits_for_the_writer_lock(sink: DuckDBSink) -> None:
    sink.write([search_row("a")])
    con = connect(sink.path, read_only=True, timeout=1)
    con.close()


def test_a_poison_record_is_isolated_and_dead_lettered(tmp_path: Path) -> None:
    from memdiag.analytics.consumer import SINK_REJECTED, SinkRunner
    from memdiag.settings import Settings

    settings = Settings().with_(duckdb_path=str(tmp_path / "p.duckdb"))
    runner = SinkRunner(settings)  # connects to nothing until run()
    runner.sink.init()
    good = [search_row("a"), search_row("b")]
    for record in [good[0], {"kind": "search", "ts": "garbage"}, good[1], dead("d1")]:
        runner.sink.add(record)
    with pytest.raises(KeyError):
        runner.sink.flush()  # the batch as a whole is refused...
    written = runner.sink.flush_isolating(runner._rejected)  # ...record by record it is not
    assert written == 4 and runner.sink.rows_rejected == 1 and runner.sink.pending == 0
    assert rows(runner.sink, "SELECT event_id FROM searches ORDER BY 1") == [("a",), ("b",)]
    bad = rows(
        runner.sink,
        "SELECT topic, reason, detail LIKE 'DuckDB refused%', payload FROM dead_letters "
        "WHERE reason = 'sink_rejected'",
    )
    assert bad == [("memdiag.diagnostics", SINK_REJECTED, True, '{"kind":"search","ts":"garbage"}')]
    # the same poison again (a redelivery) is the same dead letter, not a second one
    runner.sink.add({"kind": "search", "ts": "garbage"})
    runner.sink.flush_isolating(runner._rejected)
    assert rows(runner.sink, "SELECT count(*) FROM dead_letters") == [(2,)]


def test_a_wrongly_typed_value_is_isolated_too(sink: DuckDBSink) -> None:
    sink.add(search_row("a"))
    sink.add(search_row("b", result_count="many"))
    with pytest.raises(pa.ArrowException):
        sink.flush()
    reasons: list[str] = []

    def reject(record: dict, error: str) -> dict:
        reasons.append(error)
        return dead("rej-" + record["event_id"], reason="sink_rejected")

    assert sink.flush_isolating(reject) == 2
    assert rows(sink, "SELECT event_id FROM searches") == [("a",)]
    assert len(reasons) == 1 and "many" in reasons[0]


def test_a_file_from_before_the_detector_gains_it_on_open(tmp_path: Path) -> None:
    """retrieval_feedback's similarity and detector (#39): a file written before them gains
    them when a sink opens it; its rows were keyword verdicts, and say so."""
    row = {"kind": "retrieval_feedback", "session_id": "s", "turn_id": "t", "signal": "used",
           "match_ratio": 0.5, "keyword_count": 2, "matched_count": 1,
           "ts": "2026-11-21T10:00:00Z", "agent_id": None, "org_id": None, "project_id": None}  # fmt: skip
    old = DuckDBSink(tmp_path / "old.duckdb")
    old.init()
    old.write([{**row, "observation_id": "o1"}])
    with duckdb.connect(str(tmp_path / "old.duckdb")) as con:
        for column in ("similarity", "detector"):
            con.execute(f"ALTER TABLE retrieval_feedback DROP COLUMN {column}")
    new = DuckDBSink(tmp_path / "old.duckdb")
    new.init()
    new.write([{**row, "observation_id": "o2", "similarity": 0.42, "detector": "semantic"}])
    with duckdb.connect(str(tmp_path / "old.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT observation_id, similarity, detector FROM retrieval_feedback "
                           "ORDER BY observation_id").fetchall()  # fmt: skip
    assert rows == [("o1", None, "keyword"), ("o2", 0.42, "semantic")]


def test_two_agents_probes_under_one_id_are_two_probes(tmp_path: Path) -> None:
    sink = DuckDBSink(tmp_path / "t.duckdb")
    sink.init()
    probe = probe_row("1")
    other = {**probe, "agent_id": "b", "hit": False, "rank": None}
    sink.write([probe, other])
    sink.write([other, probe])
    assert rows(sink, "SELECT agent_id, hit FROM recall_probe_events ORDER BY 1") == [
        ("a", True),
        ("b", False),
    ]
    assert rows(sink, "SELECT count(*) FROM dead_letters") == [(0,)]
    sink.write([{**probe, "hit": False}])  # agent a's "1" again, another probe: refused
    [(reason, detail)] = rows(sink, "SELECT reason, detail FROM dead_letters")
    assert reason == "reused_event_id"
    assert detail.startswith("event_id '1' was already taken in agent 'a' by another recall_probe")


def test_a_probe_row_from_before_query_source_replays_clean(tmp_path: Path) -> None:
    """`query_source` came with a default ('name'): an older row holds the default, not what
    its event said, so it is not compared."""
    sink = DuckDBSink(tmp_path / "t.duckdb")
    sink.init()
    probe = probe_row("p1", query_source="task")
    sink.write([{**probe, "query_source": None}])  # as a memdiag before query_source wrote it
    with duckdb.connect(sink.path) as con:
        con.execute("UPDATE recall_probe_events SET query_source = 'name'")  # the default
    sink.write([probe])  # replayed by this one
    assert rows(sink, "SELECT count(*) FROM dead_letters") == [(0,)]
    assert rows(sink, "SELECT query_source FROM recall_probe_events") == [("task",)]


def test_the_recall_views_tell_two_agents_events_under_one_id_apart() -> None:
    """Probes and ambient contexts are keyed by agent and id: the views join on both (a
    look-alike of agent a1's made a2's miss 'aliased', and the rates mixed the two)."""
    from memdiag.analytics.db import init_schema

    con = duckdb.connect()
    init_schema(con)
    con.execute("""INSERT INTO memory_pipeline (agent_id, memory_id, name, written_at,
                   indexed_at, status) VALUES
        ('a1', 'm1', 'billing api', '2026-01-01', '2026-01-01', 'indexed'),
        ('a1', 'm2', 'billing-api', '2026-01-01', '2026-01-01', 'indexed'),
        ('a2', 'n1', 'zebra', '2026-01-01', '2026-01-01', 'indexed'),
        ('a2', 'n2', 'apple', '2026-01-01', '2026-01-01', 'indexed')""")
    con.execute("""INSERT INTO recall_probe_events (agent_id, memory_id, hit, rank, ts,
                   event_id, k, top_ids, query_source) VALUES
        ('a1', 'm1', false, NULL, '2026-01-02', '1', 3, ['m2'], 'name'),
        ('a2', 'n1', false, NULL, '2026-01-02', '1', 3, ['n2'], 'name')""")
    con.execute("""INSERT INTO ambient_contexts (event_id, agent_id, memory_ids, ts) VALUES
        ('1', 'a1', ['m1', 'm2'], '2026-01-03'), ('1', 'a2', ['n1'], '2026-01-03')""")
    assert con.execute(
        "SELECT agent_id, miss_reason FROM recall_probes ORDER BY 1"
    ).fetchall() == [("a1", "aliased"), ("a2", "outranked")]
    assert con.execute(
        "SELECT agent_id, in_context, ambient_trigger_rate FROM recall_trend_points "
        "WHERE kind = 'ambient' ORDER BY 1"
    ).fetchall() == [("a1", 2, 1.0), ("a2", 1, 0.5)]
