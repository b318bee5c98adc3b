"""``memdiag explain``: a session's story from DuckDB, written by the real worker logic."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

from memdiag.analytics.explain import UnknownSession, explain, search_verdict, timeline
from memdiag.analytics.sink import DuckDBSink
from memdiag.views.html import anchor
from memdiag.views.report import explain_page, render
from tests.unit.test_sessions import Worker, into_duckdb, session

HOSTILE = 'ses-<b>&"[red]x[/red]'  # HTML and Rich markup in an id: shown, never interpreted


def ev(kind: str, eid: str, sid: str, second: float, **fields: Any) -> dict[str, Any]:
    minute, sec = divmod(second, 60)
    return {
        "kind": kind,
        "event_id": eid,
        "session_id": sid,
        "ts": f"2026-11-21T09:{int(minute):02d}:{sec:06.3f}Z",
        "agent_id": "coder",
        **fields,
    }


def story(sid: str) -> list[dict[str, Any]]:
    """Searches of every verdict, one turn with a used and an ignored memory, a failed test."""
    return [
        ev("search", f"{sid}-a", sid, 0, query="auth flow", result_ids=["x"]),
        ev("search", f"{sid}-b", sid, 10, query="token expiry", result_ids=["y"]),
        ev("search", f"{sid}-c", sid, 50, query="refresh", result_ids=["z"]),  # past 30 s
        ev("search", f"{sid}-d", sid, 55, query="refresh", result_ids=["q"]),  # same query
        ev("search", f"{sid}-e", sid, 56, query="ui", result_ids=["x"], source="viewer"),
        ev("search", f"{sid}-f", sid, 57, query="nothing", result_ids=[]),
        ev(
            "injection",
            f"{sid}-i",
            sid,
            60,
            turn_id="t1",
            observations=[
                {"id": "o_used", "content": "rotate refresh tokens before expiry always"},
                {"id": "stale", "content": "deployment pipelines need manual approval"},
                {"id": "o_lost", "content": "never answered"},
            ],
        ),
        ev(
            "injection",
            f"{sid}-i2",
            sid,
            61,
            turn_id="t2",
            observations=[{"id": "o_lost", "content": "x"}],
        ),
        ev(
            "response",
            f"{sid}-r",
            sid,
            65,
            turn_id="t1",
            text="We rotate refresh tokens before expiry.",
        ),
        ev(
            "session_outcome",
            f"{sid}-o",
            sid,
            90,
            outcome="rejected",
            tool_calls=[
                {"tool": "edit", "file": "a.py", "success": True},
                {"tool": "PyTest", "success": False},
            ],
            files_modified=["a.py"],
            errors=[{"message": "1 failed", "tool": "PyTest", "recoverable": True}],
        ),
    ]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("explain") / "e.duckdb"
    into_duckdb(
        path,
        # "stale" is in two failed sessions before the story's: misleading then
        *(session(f"before{i}", "rework", ["stale"], ts=f"2026-11-21T08:0{i}:00Z") for i in range(2)),
        story(HOSTILE),
        [ev("session_outcome", "n-o", "never", 5, outcome="rework", tool_calls=[],
            files_modified=[], errors=[])],
        [ev("search", "open-a", "open", 1, query="q", result_ids=["x"])],
    )  # fmt: skip
    return str(path)


def test_every_search_says_why(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        ex = explain(con, HOSTILE)
    verdicts = {s["event_id"].rsplit("-", 1)[1]: s["verdict"] for s in ex["searches"]}
    p = HOSTILE
    assert verdicts == {
        "a": "the session's first search: never a followup",
        "b": f"followup of {p}-a, 10 s later: a new query, no result in common",
        "c": f"not a followup of {p}-b, 40 s later: past the followup window",
        "d": f"not a followup of {p}-c, 5 s later: the same query again, or a result in common",
        "e": "viewer search: not judged",
        "f": "no results: a retrieval failure, not judged",
    }
    assert ex["search_summary"] == {"agent": 5, "followups": 1, "viewer": 1, "empty": 1}
    assert not ex["never_searched"]


def test_turns_outcome_rule_and_weights(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        ex = explain(con, HOSTILE)
    [turn] = ex["turns"]
    signals = {m["observation_id"]: m["signal"] for m in turn["memories"]}
    assert signals == {"o_used": "used", "stale": "ignored", "o_lost": "ignored"}
    assert (turn["used"], turn["ignored"]) == (1, 2)
    assert ex["unjudged_memories"] == []  # o_lost was judged in t1; t2 never answered
    o = ex["outcome"]
    assert o["failed"] and o["failure_category"] == "test_failure"
    assert o["rule"] == "test runner PyTest failed"
    assert o["misleading_observation_ids"] == ["stale"]
    weights = {w["observation_id"]: w for w in ex["weights"]}
    stale = weights["stale"]
    assert stale["misleading"] and stale["aggressive"] and stale["alpha"] == 0.4
    assert stale["previous_weight"] == pytest.approx(0.8 * 0.8)
    assert stale["new_weight"] == pytest.approx(0.64 * 0.6)
    assert ex["weights"][0]["observation_id"] == "stale"  # misleading first
    kinds = [i["kind"] for i in timeline(ex)]
    assert kinds == ["search"] * 6 + ["turn", "outcome"]
    assert timeline(ex)[-1]["at"] == 90.0


def test_never_searched_open_and_unknown_sessions(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        never = explain(con, "never")
        open_ = explain(con, "open")
        with pytest.raises(UnknownSession, match=r"no such session 'nevr'.*try .*\(rework\)"):
            explain(con, "nevr")
        with pytest.raises(UnknownSession, match=r"try \(1 of 5 sessions\): never"):
            explain(con, "neve")
    assert never["never_searched"] and never["outcome"]["rule"] == "no file was modified"
    assert never["search_summary"]["agent"] == 0 and never["turns"] == []
    assert open_["outcome"] is None and open_["weights"] == []


def test_a_verdict_from_before_the_column_names_no_cause() -> None:
    row = {
        "source": "agent",
        "evaluated": True,
        "prev_event_id": "a",
        "gap_seconds": 3.0,
        "is_followup": False,
        "disjoint_new_query": None,
    }
    assert search_verdict(row) == "not a followup of a, 3 s later"


def memdiag(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memdiag.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )


def test_the_command_text_json_and_html(db: str, tmp_path: Path) -> None:
    text = memdiag("explain", HOSTILE, "--db", db)
    assert text.returncode == 0, text.stderr
    for part in (
        HOSTILE,
        "test_failure — test runner PyTest failed",
        "followup of",
        "+50.0 s",
        "40 s later: past the followup window",
        "o_used",
        "used 0.",
        "turn t1",
        "1 evaluated turn: 1 of 3 verdicts 'used' (3 distinct memories)",
        "5 agent searches, 1 followup, 1 empty, 1 viewer",
        "1 misleading memory",
    ):
        assert part in text.stdout, part
    [stale] = [
        line
        for line in text.stdout.splitlines()
        if line.lstrip().startswith("stale") and "doubled" in line
    ]
    assert "yes" in stale and "0.4 (doubled)" in stale and "0.640" in stale and "0.384" in stale
    never = memdiag("explain", "never", "--db", db)
    assert "never searched" in never.stdout
    page = tmp_path / "e.html"
    js = memdiag("explain", HOSTILE, "--db", db, "--json", "--html", str(page))
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout)["outcome"]["rule"] == "test runner PyTest failed"
    doc = page.read_text()
    assert "<b>&" not in doc and "ses-&lt;b&gt;&amp;&quot;[red]x[/red]" in doc
    assert "<script" not in doc and "test runner PyTest failed" in doc
    missing = memdiag("explain", "nevr", "--db", db)
    assert missing.returncode == 1 and "try (4 of 5 sessions): " in missing.stderr
    as_json = json.loads(memdiag("explain", "nevr", "--db", db, "--json").stdout)
    assert as_json["error"] == "not_found" and as_json["kind"] == "session"
    assert as_json["known"] == 5 and "never" in as_json["closest"]


def test_the_report_links_failed_sessions_and_misleading_memories(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        doc = render(con, db)
        alone = explain_page(explain(con, HOSTILE), db)
    target = anchor(HOSTILE)
    assert f'href="#{target}"' in doc and f'<details id="{target}">' in doc
    # the misleading table links "stale" to its latest failed session, embedded on the page
    misleading = doc.split("<h2>Misleading memories</h2>", 1)[1].split("</section>", 1)[0]
    assert "stale" in misleading and f'href="#{target}"' in misleading
    assert f'<details id="{anchor("never")}">' in doc
    assert "test runner PyTest failed" in alone


def test_a_search_after_one_past_the_retention_says_so() -> None:
    row = {
        "source": "agent",
        "evaluated": True,
        "prev_event_id": None,
        "gap_seconds": None,
        "is_followup": False,
        "disjoint_new_query": False,
    }
    assert search_verdict(row, earlier_judged=True).startswith("no predecessor remembered")
    assert search_verdict(row) == "the session's first search: never a followup"
    gap = {
        **row,
        "prev_event_id": "a",
        "gap_seconds": 0.000001,
        "disjoint_new_query": True,
        "is_followup": True,
    }
    assert "a, 0.000001 s later" in search_verdict(gap)


def test_a_file_from_before_the_column_still_explains_and_reports(db: str, tmp_path: Path) -> None:
    """Readers open files read-only and cannot add a column: they read it as unknown."""
    import shutil

    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as con:
        con.execute("ALTER TABLE searches DROP COLUMN disjoint_new_query")
    with duckdb.connect(str(old), read_only=True) as con:
        ex = explain(con, HOSTILE)
        assert "<h2>Latest failed sessions</h2>" in render(con, str(old))
    verdicts = [s["verdict"] for s in ex["searches"]]
    assert verdicts[2] == f"not a followup of {HOSTILE}-b, 40 s later"  # the cause is unknown
    assert verdicts[1].startswith("followup of")


# -- the semantic rule: each verdict's similarity and the rule that made it (#39) -------------

PARAPHRASED = "Rotate the signing key before the token expires."
REUSED = "Canary deployments go first, then the whole fleet."
UNRELATED = "The office kitchen closes at six on Fridays."
SAID = (
    "The auth token's signing secret must be rolled ahead of expiry. "
    "Canary deployments go first, then the whole fleet follows."
)


@pytest.fixture(scope="module")
def semantic_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.unit.test_sessions import SEMANTIC

    path = tmp_path_factory.mktemp("explain-semantic") / "s.duckdb"
    turn = [
        ev("injection", "s-i", "sem", 1, turn_id="t1", observations=[
            {"id": "o_para", "content": PARAPHRASED}, {"id": "o_reuse", "content": REUSED},
            {"id": "o_none", "content": UNRELATED}]),
        ev("response", "s-r", "sem", 2, turn_id="t1", text=SAID),
        ev("session_outcome", "s-o", "sem", 3, outcome="accepted", tool_calls=[],
           files_modified=[], errors=[]),
    ]  # fmt: skip
    into_duckdb(path, turn, settings=SEMANTIC)
    return str(path)


def test_a_semantic_verdict_says_its_similarity_and_its_rule(semantic_db: str) -> None:
    """The paraphrase is used by the similarity alone (its words say ignored), the reused
    memory by the keyword rule, the unrelated one by neither: in the JSON, the terminal and
    the session page."""
    from memdiag.analytics.explain import verdict_text

    with duckdb.connect(semantic_db, read_only=True) as con:
        ex = explain(con, "sem")
        page = explain_page(ex, semantic_db)
    [turn] = ex["turns"]
    got = {m["observation_id"]: m for m in turn["memories"]}
    assert {k: (m["signal"], m["rule"], m["detector"]) for k, m in got.items()} == {
        "o_para": ("used", "similarity", "semantic"),
        "o_reuse": ("used", "keyword", "semantic"),
        "o_none": ("ignored", "neither", "semantic"),
    }
    assert got["o_para"]["match_ratio"] <= 0.3 < got["o_reuse"]["match_ratio"]
    assert got["o_para"]["similarity"] >= 0.19 > got["o_none"]["similarity"]
    para = verdict_text(got["o_para"])
    assert para.startswith(f"{got['o_para']['match_ratio']:.2f} (")
    assert para.endswith(f"· similarity {got['o_para']['similarity']:.3f} · by the similarity")
    assert "by the keyword rule" in verdict_text(got["o_reuse"])
    assert "by neither rule" in verdict_text(got["o_none"])
    for m in got.values():
        assert verdict_text(m) in page
    text = memdiag("explain", "sem", "--db", semantic_db)
    assert text.returncode == 0, text.stderr
    for m in got.values():
        assert verdict_text(m) in text.stdout, verdict_text(m)
    as_json = json.loads(memdiag("explain", "sem", "--db", semantic_db, "--json").stdout)
    [t] = as_json["turns"]
    assert {m["observation_id"]: m["rule"] for m in t["memories"]} == {
        k: m["rule"] for k, m in got.items()
    }


def test_a_memory_history_under_the_semantic_rule_has_the_similarity(semantic_db: str) -> None:
    """observation-history and the memory's page add the similarity and the rule columns
    when a verdict of the memory is a semantic one."""
    from memdiag.serve import pages

    history = memdiag("query", "observation-history", "o_para", "--db", semantic_db)
    assert history.returncode == 0, history.stderr
    [head] = [line for line in history.stdout.splitlines() if "session_id" in line]
    assert "similarity" in head and "rule" in head
    [row] = [line for line in history.stdout.splitlines() if " t1 " in line]
    with duckdb.connect(semantic_db, read_only=True) as con:
        [h] = json.loads(
            memdiag("query", "observation-history", "o_para", "--db", semantic_db, "--json").stdout
        )
        sections = pages.memory(con, "o_para", {}).sections
    assert h["rule"] == "similarity" and h["detector"] == "semantic"
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[-3:] == [f"{h['similarity']:.3f}", "similarity", "accepted"]
    doc = "".join(html for _, _, html in sections)
    assert re.search(r"<th[^>]*>similarity</th><th[^>]*>rule</th>", doc)
    assert f'<td class="n">{h["similarity"]:.3f}</td><td>similarity</td><td>accepted</td>' in doc


def test_a_file_from_before_the_detector_explains_its_verdicts_as_keyword_ones(
    db: str, tmp_path: Path
) -> None:
    """A reader cannot add retrieval_feedback's similarity and detector to an older file:
    it reads them as the sink's upgrade fills them (no similarity, the keyword rule), also
    through a query that names the table with an alias."""
    import shutil

    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as con:
        for column in ("similarity", "detector"):
            con.execute(f"ALTER TABLE retrieval_feedback DROP COLUMN {column}")
    with duckdb.connect(str(old), read_only=True) as con:
        ex = explain(con, HOSTILE)
    [turn] = ex["turns"]
    assert {(m["detector"], m["similarity"], m["rule"]) for m in turn["memories"]} == {
        ("keyword", None, "keyword")
    }
    history = memdiag("query", "observation-history", "stale", "--db", str(old), "--json")
    assert history.returncode == 0, history.stderr
    assert {(r["detector"], r["rule"]) for r in json.loads(history.stdout)} == {
        ("keyword", "keyword")
    }


@pytest.mark.parametrize(
    ("sql", "alias"),
    [
        ("SELECT {c} FROM searches WHERE TRUE", None),
        ("SELECT {c} FROM searches s, span WHERE TRUE", "s"),
        ("SELECT t.{c} FROM searches AS t WHERE TRUE", "t"),
        ("SELECT {c} FROM searches\nWHERE TRUE", None),
        ("SELECT {c} FROM searches TABLESAMPLE 10%", None),
        ("FROM searches SELECT {c}", None),
        ("SELECT {c} FROM searches ORDER BY 1", None),
    ],
)
def test_an_older_files_column_is_read_through_the_tables_alias(sql: str, alias: str) -> None:
    """A reader adds a column an older file lacks by reading the table through a subquery,
    under the alias the statement gives it (or the table's name); prose, another table whose
    name starts with it and the next line are left alone."""
    from memdiag.analytics.queries import upgraded

    with duckdb.connect() as con:
        con.execute("CREATE TABLE searches (a INTEGER)")
        con.execute("CREATE TABLE span (x INTEGER)")
        got = upgraded(con, sql.format(c="disjoint_new_query"))
        assert f") AS {alias or 'searches'}" in got and got.count("FROM (SELECT *,") == 1
        con.execute(got)
        prose = "-- what reads from searches\nSELECT disjoint_new_query FROM searches_x"
        assert upgraded(con, prose) == prose


def test_a_row_trimmed_to_fit_a_message_is_not_blamed_on_the_rules(tmp_path: Path) -> None:
    """A failed session whose last tool call (of 3,000) is the failing test run: the worker
    classifies the whole outcome (test_failure); the row, trimmed to fit one Kafka message,
    keeps the first calls only. explain says so, rather than "today's rules give other"."""
    from memdiag.analytics.sink import DuckDBSink
    from memdiag.streams.fit import fit
    from tests.unit.test_sessions import Worker

    calls = [{"tool": "bash", "file": f"src/m{i}.py", "success": True} for i in range(3_000)]
    calls.append({"tool": "pytest", "success": False})
    w = Worker()
    w.publish([ev("session_outcome", "big-o", "big", 5, outcome="rejected", tool_calls=calls,
                  files_modified=[], errors=[])])  # fmt: skip
    sink = DuckDBSink(tmp_path / "t.duckdb")
    sink.init()
    sink.write([fit(r, 32 * 1024)[0] for r in w.records])
    with duckdb.connect(str(tmp_path / "t.duckdb"), read_only=True) as con:
        o = explain(con, "big")["outcome"]
    assert o["failure_category"] == "test_failure"
    assert o["rule"].startswith(
        "stored as test_failure, by the rules on the whole outcome; "
        "the row was trimmed to fit one Kafka message (tool_call_summary)"
    )


def test_a_trim_of_what_the_rules_do_not_read_is_not_blamed(tmp_path: Path) -> None:
    """Only failure_context was cut (the rules classify from the tool calls, errors and
    files): a category that differs is the rules' doing, and explain says that."""
    from memdiag.analytics.sink import DuckDBSink
    from memdiag.streams.fit import fit
    from tests.unit.test_sessions import Worker

    w = Worker()
    w.publish([ev("session_outcome", "ctx-o", "ctx", 5, outcome="rejected",
                  tool_calls=[{"tool": "pytest", "success": False}], files_modified=[],
                  errors=[], failure_context={"log": "x" * 60_000})])  # fmt: skip
    rows = [{**r, "failure_category": "other"} for r in w.records]  # as older rules stored it
    sink = DuckDBSink(tmp_path / "c.duckdb")
    sink.init()
    sink.write([fit(r, 32 * 1024)[0] for r in rows])
    with duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True) as con:
        o = explain(con, "ctx")["outcome"]
    assert o["rule"].startswith("stored as other; today's rules give test_failure")


def test_a_sessions_dead_letters_are_part_of_its_story(tmp_path: Path) -> None:
    """What memdiag could not take of a session is in its story (keyed by it, or naming it
    in the payload); a session memdiag took nothing of says so instead of "no such"."""
    from memdiag.analytics.sink import DuckDBSink
    from tests.unit.test_sessions import Worker

    events = story("s")
    reused = {**events[1], "query": "another query"}  # s-b again, another search
    future = ev("search", "s-late", "s", 0, query="q", result_ids=[], ts="2099-01-01T00:00:00Z")
    gone = ev("search", "g-1", "gone", 0, query="q", result_ids=[], ts="2099-01-01T00:00:00Z")
    w = Worker()
    w.publish(events)
    w.publish([reused, future])
    w.publish([gone], keyed=False)
    sink = DuckDBSink(tmp_path / "d.duckdb")
    sink.init()
    letters = [{"kind": "dead_letter", **d} for d in w.tables.dead_letters]
    sink.write([*w.records, *w.weights, *letters])
    with duckdb.connect(sink.path, read_only=True) as con:
        ex = explain(con, "s")
        with pytest.raises(UnknownSession, match=r"1 dead letter name it \(bad_ts\)"):
            explain(con, "gone")
    dead = {d["event_id"]: d for d in ex["dead_letters"]}
    assert set(dead) == {"s-b", "s-late"} and dead["s-b"]["in_all"] == 2
    assert dead["s-b"]["reason"] == "reused_event_id" and dead["s-b"]["event_kind"] == "search"
    assert "differs in query" in dead["s-b"]["detail"]
    text = memdiag("explain", "s", "--db", sink.path).stdout
    assert "2 inputs of this session not taken" in text and "reused_event_id: search s-b" in text
    page = explain_page(ex, sink.path)
    assert "2 inputs of this session not taken" in page and "bad_ts" in page


def _letter(i: int, topic: str, key: str | None, payload: str, reason: str = "bad_ts") -> dict:
    return {
        "kind": "dead_letter",
        "dead_letter_id": f"id{i}",
        "topic": topic,
        "partition": 0,
        "offset": i,
        "batch_index": 0,
        "key": key,
        "reason": reason,
        "detail": "d",
        "payload": payload,
        "payload_bytes": len(payload),
        "payload_truncated": False,
        "ts": "2026-11-21T09:00:00Z",
    }


def _db(tmp_path: Path, extra: list[dict]) -> str:
    w = Worker()
    w.publish(story("s1"))
    sink = DuckDBSink(tmp_path / "d.duckdb")
    sink.init()
    sink.write([*w.records, *w.weights, *extra])
    return sink.path


def test_explain_leaves_out_another_topics_dead_letter_keyed_by_an_equal_id(tmp_path: Path) -> None:
    """A judgement keyed by run 's1' and a memory event keyed by agent 's1' are not session
    s1's inputs (found by a review: the key match did not look at the topic)."""
    path = _db(
        tmp_path,
        [
            _letter(
                1, "memdiag.judgements", "s1", '{"kind":"judgement","run_id":"s1","event_id":"j1"}'
            ),
            _letter(
                2,
                "memdiag.memory",
                "s1",
                '{"kind":"memory_written","agent_id":"s1","event_id":"m1"}',
            ),
        ],
    )
    with duckdb.connect(path, read_only=True) as con:
        dead = explain(con, "s1")["dead_letters"]
    assert dead == [], [(d["event_kind"], d["event_id"]) for d in dead]


def test_explain_prints_no_control_character_of_a_refused_payload(tmp_path: Path) -> None:
    """The event id of a refused input comes from its (hostile) payload: a JSON escape must
    not become a real ESC sequence on the user's terminal."""
    evil = '{"kind":"search","session_id":"s1","event_id":"x\\u001b]0;pwned\\u0007\\u001b[2J"}'
    path = _db(tmp_path, [_letter(3, "memdiag.events", "s1", evil)])
    text = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "explain", "s1", "--db", path],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "\x1b" not in text, repr(text[text.find("\x1b") - 40 : text.find("\x1b") + 20])


def test_a_file_from_before_the_session_id_column_tells_the_same_story(tmp_path: Path) -> None:
    """dead_letters.session_id is what the payload names, else the key on the events topic.
    A file written before it has the column read as if it were filled (a reader cannot
    upgrade it) and filled once, with its index, when a writer opens it: explain finds the
    same dead letters in both."""
    from memdiag.analytics.db import connect, init_schema

    named = '{"kind":"search","session_id":"s1","event_id":"e9","ts":"x"}'
    path = _db(tmp_path, [_letter(1, "memdiag.events", None, named),
                          _letter(2, "memdiag.events", None, '{"kind":"search"'),
                          _letter(3, "memdiag.events", "s1", '{"kind":"sear'),
                          _letter(4, "memdiag.judgements", "s1", '{"run_id":"s1"}')])  # fmt: skip
    sessions = [("id1", "s1"), ("id2", None), ("id3", "s1"), ("id4", None)]
    with duckdb.connect(path) as con:
        query = "SELECT dead_letter_id, session_id FROM dead_letters ORDER BY 1"
        assert con.execute(query).fetchall() == sessions
        con.execute("DROP INDEX dead_letters_by_session")  # as an older file
        con.execute("ALTER TABLE dead_letters DROP COLUMN session_id")
    with duckdb.connect(path, read_only=True) as con:
        assert len(explain(con, "s1")["dead_letters"]) == 2
    con = connect(path)
    init_schema(con)  # a writer opens it: the column is added and filled
    assert con.execute(query).fetchall() == sessions
    assert len(explain(con, "s1")["dead_letters"]) == 2
    assert con.execute("SELECT count(*) FROM duckdb_indexes() "
                       "WHERE index_name = 'dead_letters_by_session'").fetchone() == (1,)  # fmt: skip
    con.close()
