"""Sessions during pipeline breaks: the ``session_pipeline`` view against the reference's
join on generated agents and sessions (the spans through the recall stage and the real sink,
in random batchings), and ``memdiag breaks``' comparison by hand."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.analytics.breaks import _rates, break_impact
from memdiag.analytics.db import init_schema
from memdiag.analytics.sink import DuckDBSink
from memdiag.cli import main
from tests.recall_scenario import at, indexed, written
from tests.reference import parse, pipeline_reference, session_pipeline_reference
from tests.sizes import examples
from tests.unit.test_recall import Run, batches_of, memory_events


def add_session(con: duckdb.DuckDBPyConnection, sid: str, agent: str | None, s: float,
                failed: bool) -> None:  # fmt: skip
    con.execute(
        "INSERT INTO session_diagnostics (session_id, outcome, injected_observation_ids, "
        "injected_graph_entity_ids, injected_graph_edge_keys, helpful_observation_ids, "
        "misleading_observation_ids, ignored_observation_ids, search_count, followup_count, ts, "
        "agent_id, event_id) VALUES (?, ?, [], [], [], [], [], [], 0, 0, ?, ?, ?)",
        [sid, "rejected" if failed else "accepted", at(s), agent, f"o-{sid}"],
    )


def database(path: Path, events: list[dict[str, Any]], rnd: random.Random) -> None:
    sink = DuckDBSink(path)
    sink.init()
    sink.write(Run().send(*batches_of(events, rnd)).records)


@st.composite
def sessions(draw: Any) -> list[dict[str, Any]]:
    return [
        {"session_id": f"s{i}", "agent_id": draw(st.sampled_from(["a1", "a2", "a3", None])),
         "s": draw(st.integers(0, 48)) * 37.5, "failed": draw(st.booleans())}
        for i in range(draw(st.integers(0, 12)))
    ]  # fmt: skip


@pytest.mark.chaos
@settings(max_examples=examples(25), deadline=None)
@given(memory_events(), sessions(), st.randoms(use_true_random=False))
def test_each_session_is_placed_as_the_reference_places_it(
    tmp_path_factory: pytest.TempPathFactory, events: list[dict[str, Any]],
    ses: list[dict[str, Any]], rnd: random.Random,
) -> None:  # fmt: skip
    path = tmp_path_factory.mktemp("b") / "b.duckdb"
    database(path, events, rnd)
    con = duckdb.connect(str(path))
    try:
        for s in ses:
            add_session(con, s["session_id"], s["agent_id"], s["s"], s["failed"])
        got = {
            sid: (state, None if since is None else int(since.timestamp() * 1_000_000))
            for sid, state, since in con.execute(
                "SELECT session_id, pipeline_state, break_since FROM session_pipeline"
            ).fetchall()
        }
    finally:
        con.close()
    spans = pipeline_reference(events)["pipeline_break_spans"]
    agents = {e["agent_id"] for e in events}
    want = session_pipeline_reference([{**s, "ts": parse(at(s["s"]))} for s in ses], spans, agents)
    assert got == want


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Agent b1 stops indexing after its third write (at 120 s); b2 never breaks."""
    events = []
    for n in range(6):
        events.append(written(f"w{n}", n * 60, f"m{n}", "b1"))
        events.append(written(f"x{n}", n * 60, f"y{n}", "b2"))
        events.append(indexed(f"xi{n}", n * 60 + 5, f"y{n}", "b2"))
        if n < 2:
            events.append(indexed(f"i{n}", n * 60 + 5, f"m{n}", "b1"))
    events.append(written("late", 2000, "m-late", "b1"))  # the clock passes the deadline
    events.append(written("late2", 2000, "y-late", "b2"))
    path = tmp_path / "b.duckdb"
    database(path, events, random.Random(0))
    con = duckdb.connect(str(path))
    for n in range(4):  # b1: before the break (< 120 s) 1 of 4 fail; during it 2 of 4
        add_session(con, f"pre{n}", "b1", 10 * n, n == 0)
        add_session(con, f"brk{n}", "b1", 600 + 100 * n, n < 2)
    add_session(con, "b2-1", "b2", 500, False)
    add_session(con, "anon", None, 500, True)
    add_session(con, "stranger", "zz", 500, True)
    con.close()
    return path


def test_the_comparison_by_hand(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        spans = con.execute("SELECT agent_id, since, until, memories FROM pipeline_break_spans"
                            ).fetchall()  # fmt: skip
        assert [(a, s.isoformat()[11:19], u, n) for a, s, u, n in spans] == [
            ("b1", "09:02:00", None, 4)  # m2..m5, nothing indexed after; the late one pends
        ]
        r = break_impact(con, resamples=2000)
    finally:
        con.close()
    assert (r["sessions"], r["placed"], r["apart"]) == (
        11, 9, {"no_agent_id": 1, "no_memory_events": 1}
    )  # fmt: skip
    o = r["overall"]
    assert (o["broken"]["sessions"], o["broken"]["failed"]) == (4, 2)
    assert (o["healthy"]["sessions"], o["healthy"]["failed"]) == (5, 1)
    assert o["difference"] == pytest.approx(2 / 4 - 1 / 5) and o["too_few"]
    ci = o["difference_ci"]
    assert ci["low"] <= o["difference"] <= ci["high"]
    b1 = next(a for a in r["agents"] if a["agent_id"] == "b1")
    assert len(b1["breaks"]) == 1 and b1["breaks"][0]["until"] is None
    assert break_impact(duckdb.connect(str(db), read_only=True), resamples=2000) == r  # seeded
    # another agent's sessions never move an agent's interval (seeded by its own id)
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO pipeline_agents (agent_id) VALUES ('a0')")  # sorts before b1
    add_session(con, "a-first", "a0", 500, True)
    con.close()
    again = break_impact(duckdb.connect(str(db), read_only=True), resamples=2000)
    assert again["placed"] == r["placed"] + 1
    assert next(a for a in again["agents"] if a["agent_id"] == "b1") == b1


def test_the_interval_is_the_session_bootstrap() -> None:
    """Each side resampled apart: the binomial draw is what resampling its sessions gives."""
    rng = np.random.default_rng(1)
    b = rng.random(60) < 0.6
    h = rng.random(90) < 0.3
    got = _rates(b, h, 20_000, 0, 0.95)["difference_ci"]
    idx_b = rng.integers(0, len(b), (20_000, len(b)))
    idx_h = rng.integers(0, len(h), (20_000, len(h)))
    naive = b[idx_b].mean(axis=1) - h[idx_h].mean(axis=1)
    low, high = np.quantile(naive, [0.025, 0.975])
    assert got["low"] == pytest.approx(low, abs=0.02) and got["high"] == pytest.approx(
        high, abs=0.02
    )


def test_the_command(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["breaks", "--db", str(db), "--resamples", "500"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "b1" in text and "+25 [" in text and "*: too few" in text and "counted apart" in text
    empty = db.parent / "empty.duckdb"
    con = duckdb.connect(str(empty))
    init_schema(con)
    con.close()
    assert main(["breaks", "--db", str(empty), "--json"]) == 0
    assert '"placed": 0' in capsys.readouterr().out


def test_an_index_stamped_before_its_write_ends_no_span(tmp_path: Path) -> None:
    """Writer and indexer clocks apart: the index's ts precedes the write's. Indexed, not a
    break (as pipeline_health says), and the reference agrees."""
    events = [indexed("i0", 0.2, "m0", "c1"), written("w0", 0.5, "m0", "c1"),
              written("w1", 1000, "m1", "c1"), indexed("i1", 1001, "m1", "c1")]  # fmt: skip
    database(tmp_path / "c.duckdb", events, random.Random(0))
    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM pipeline_break_spans").fetchall() == [(0,)]
        assert con.execute("SELECT broken FROM pipeline_health").fetchall() == [(False,)]
    finally:
        con.close()
    assert pipeline_reference(events)["pipeline_break_spans"] == {}


def test_explain_says_the_pipeline_was_down_in_the_terminal_and_the_html(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session that ended during its agent's break says so in `explain` and in its HTML
    page; one before the break says nothing of it."""
    assert main(["explain", "brk0", "--db", str(db)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "memory pipeline down at the outcome" in text and "first missed memory m2" in text
    page = tmp_path / "brk0.html"
    assert main(["explain", "brk0", "--db", str(db), "--html", str(page)]) == 0
    html = page.read_text()
    assert "<b>memory pipeline down</b> at the outcome" in html and "still down" in html
    capsys.readouterr()
    assert main(["explain", "pre1", "--db", str(db)]) == 0
    assert "pipeline down" not in capsys.readouterr().out


def test_a_side_at_zero_or_all_gets_a_score_interval_with_width() -> None:
    """0 of 25 healthy sessions failed: the bootstrap has no spread there, Newcombe's
    interval has; its values are the paper's (Newcombe 1998, method 10: 56/70 - 48/80)."""
    from memdiag.analytics.breaks import newcombe

    ci = newcombe(56, 70, 48, 80, 0.95)
    assert (ci["low"], ci["high"]) == (pytest.approx(0.0524, abs=5e-4),
                                       pytest.approx(0.3339, abs=5e-4))  # fmt: skip
    r = _rates(np.array([True] * 10 + [False] * 15), np.zeros(25, dtype=bool), 2000, 0, 0.95)
    ci = r["difference_ci"]
    assert ci["method"] == "newcombe" and ci["low"] < r["difference"] - 0.1
    assert 0 < ci["low"] < r["difference"] < ci["high"] < 1
    both = _rates(np.ones(30, dtype=bool), np.zeros(30, dtype=bool), 2000, 0, 0.95)
    assert both["difference_ci"]["high"] == pytest.approx(1.0) and both["difference_ci"]["low"] < 1
    mixed = _rates(np.array([True, False] * 15), np.array([True, False, False] * 10), 2000, 0, 0.95)
    assert mixed["difference_ci"]["method"] == "bootstrap"
