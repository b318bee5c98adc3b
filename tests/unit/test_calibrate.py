"""``memdiag calibrate``: the statistics as pure functions, and a small built-in case whose
answer is worked out by hand, written by the real worker logic into DuckDB."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import product
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.analytics.calibrate import (
    Sessions,
    auc,
    binary,
    calibrate,
    load,
    resample_counts,
    stream_check,
)
from memdiag.analytics.sink import DuckDBSink
from tests.unit.test_sessions import into_duckdb


def brute_auc(scores: list[float], positive: list[bool]) -> float:
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    wins = sum((a > b) + 0.5 * (a == b) for a, b in product(pos, neg))
    return wins / (len(pos) * len(neg))


@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=2, max_size=40))
def test_auc_is_the_pairwise_win_rate_with_ties_half(items: list[tuple[int, bool]]) -> None:
    scores = np.array([s / 4 for s, _ in items])
    positive = np.array([p for _, p in items])
    if positive.all() or not positive.any():
        assert np.isnan(auc(scores, positive))
    else:
        assert auc(scores, positive) == pytest.approx(brute_auc(list(scores), list(positive)))


@given(
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=2, max_size=25),
    st.integers(0, 2**16),
)
def test_a_weighted_auc_is_the_auc_of_the_resampled_sessions(items, seed: int) -> None:
    scores = np.array([float(s) for s, _ in items])
    positive = np.array([p for _, p in items])
    [counts] = list(resample_counts(len(items), 8, seed))
    weighted = auc(scores, positive, counts)
    for row, value in zip(counts, weighted, strict=True):
        drawn = np.repeat(np.arange(len(items)), row)
        pos = positive[drawn]
        if pos.all() or not pos.any():
            assert np.isnan(value)
        else:
            assert value == pytest.approx(brute_auc(list(scores[drawn]), list(pos)))


def test_resampling_is_seeded_and_keeps_clusters_whole() -> None:
    a = np.vstack(list(resample_counts(50, 300, seed=7)))
    assert (a.sum(axis=1) == 50).all()
    assert (a == np.vstack(list(resample_counts(50, 300, seed=7)))).all()
    assert not (a == np.vstack(list(resample_counts(50, 300, seed=8)))).all()
    clusters = np.array([0, 0, 0, 1, 1, 2])
    c = np.vstack(list(resample_counts(6, 200, seed=1, clusters=clusters)))
    assert (c[:, [0, 3, 5]].sum(axis=1) == 3).all()  # three clusters drawn per resample
    big = list(resample_counts(500_000, 9, seed=0))  # bounded memory: several chunks
    assert len(big) > 1 and sum(len(x) for x in big) == 9
    assert all((x.sum(axis=1) == 500_000).all() for x in big)
    assert (c[:, 0] == c[:, 1]).all() and (c[:, 1] == c[:, 2]).all() and (c[:, 3] == c[:, 4]).all()


def test_binary_predictor_figures() -> None:
    flag = np.array([1, 1, 1, 0, 0, 0, 0, 0], dtype=bool)
    failed = np.array([1, 1, 0, 1, 0, 0, 0, 0], dtype=bool)
    r = binary("x", flag, failed, lambda: resample_counts(8, 500, 0), 0.95)
    assert (r["flagged"], r["failed_flagged"]) == (3, 2)
    assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(2 / 3)
    assert r["lift"] == pytest.approx((2 / 3) / (3 / 8))
    ci = r["precision_ci"]
    assert 0 <= ci["low"] <= r["precision"] <= ci["high"] <= 1 and ci["undefined_resamples"] >= 0


# -- the built-in case ---------------------------------------------------------------------


def ev(kind: str, sid: str, n: int, second: int, **fields: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "event_id": f"{sid}-{n}",
        "session_id": sid,
        "ts": f"2026-11-21T10:{second // 60:02d}:{second % 60:02d}Z",
        "agent_id": f"agent-{sid}",
        **fields,
    }


def case(
    sid: str,
    failed: bool,
    gap: int | None,
    same_query: bool = False,
    ignored: bool = False,
    searches: int = 2,
) -> list[dict[str, Any]]:
    """A session: ``searches`` agent searches (the second ``gap`` s after the first, a
    disjoint new query unless ``same_query``), a turn whose memory is ignored or used, and
    its outcome at 5 minutes."""
    events = []
    if searches:
        events.append(ev("search", sid, 1, 0, query="first", result_ids=["a"]))
    if searches == 2:
        query = "first" if same_query else "second"
        events.append(ev("search", sid, 2, gap, query=query, result_ids=["b"]))
    content = "rotate refresh tokens before expiry"
    events += [
        ev(
            "injection",
            sid,
            3,
            200,
            turn_id="t",
            observations=[{"id": f"m-{sid}", "content": content}],
        ),
        ev("response", sid, 4, 201, turn_id="t", text="unrelated" if ignored else content),
        ev(
            "session_outcome",
            sid,
            5,
            300,
            outcome="rejected" if failed else "accepted",
            tool_calls=[],
            files_modified=["a.py"],
            errors=[{"message": "wrong", "tool": "edit", "recoverable": True}] if failed else [],
        ),
    ]
    return events


BUILT_IN = [
    case("F1", True, 5, ignored=True),  # followup under every window
    case("F2", True, 20, ignored=True),  # from 30 s
    case("F3", True, 45),  # from 60 s
    case("F4", True, None, searches=0),  # never searched
    case("A1", False, 5, same_query=True, ignored=True),  # a retry: never a followup
    case("A2", False, 100),  # from 120 s
    case("A3", False, None, searches=1),
    case("A4", False, None, searches=1),
]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("calibrate") / "c.duckdb"
    into_duckdb(path, *BUILT_IN)
    return str(path)


def test_the_built_in_case_gives_the_hand_worked_answer(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        r = calibrate(load(con), resamples=400, seed=3)
    pop = r["population"]
    assert (pop["sessions"], pop["failed"], pop["searched"], pop["never_searched"]) == (8, 4, 7, 1)
    assert pop["failure_rate_never_searched"] == 1.0 and pop["failure_rate_searched"] == 3 / 7
    # window -> (flagged, failed among them, precision, recall, rate AUC), all over the 7
    # sessions that searched (F4 cannot have a followup); the AUC: F1..F3 against A1..A4,
    # each rate 1/2 or 0, ties count half
    expected = {
        10.0: (1, 1, 1.0, 1 / 3, 8 / 12),
        30.0: (2, 2, 1.0, 2 / 3, 10 / 12),
        60.0: (3, 3, 1.0, 3 / 3, 12 / 12),
        120.0: (4, 3, 3 / 4, 3 / 3, 10.5 / 12),
    }
    got = {
        w["window_seconds"]: (
            w["flagged"],
            w["failed_flagged"],
            w["precision"],
            w["recall"],
            w["rate_auc"],
        )
        for w in r["windows"]
    }
    assert got.keys() == expected.keys()
    for window, figures in expected.items():
        assert got[window] == pytest.approx(figures), window
    assert r["best_window_seconds"] == 60.0
    assert sum(w["p_best"] for w in r["windows"]) == pytest.approx(1.0)
    followup, ignored, never = r["predictors"]
    assert followup["predictor"] == "≥ 1 followup (30 s)" and followup["recall"] == 2 / 3
    assert followup["sessions"] == 7 and followup["lift"] == pytest.approx(1 / (3 / 7))
    assert (ignored["flagged"], ignored["precision"], ignored["recall"]) == (3, 2 / 3, 2 / 4)
    assert (never["flagged"], never["precision"], never["recall"]) == (1, 1.0, 1 / 4)
    assert r["rate_auc"]["auc"] == pytest.approx(10 / 12) and r["rate_auc"]["sessions"] == 7
    assert r["notes"] and "8 sessions" in r["notes"][0]  # too few to trust the intervals
    assert r["verdict"].endswith("(unreliable: too few to resample, see the notes)")
    assert r["groups"]["failed"] == {
        "sessions": 4,
        "never_searched": 1,
        "followups": {"sessions": 3, "mean": 2 / 3, "median": 1.0},
        "rate": {"sessions": 3, "mean": 1 / 3, "median": 0.5},
    }
    assert r["groups"]["accepted"]["followups"] == {"sessions": 4, "mean": 0.0, "median": 0.0}


def test_same_seed_same_intervals(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        s = load(con)
    assert calibrate(s, resamples=300, seed=5) == calibrate(s, resamples=300, seed=5)


def test_recomputing_the_stream_window_reproduces_every_verdict(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        # every judged search; the worker's window is consistent with [20 s, 45 s)
        assert stream_check(con, 30.0) == {
            "checked": 12, "disagree": 0, "window_at_least": 20.0, "window_below": 45.0
        }  # fmt: skip
        assert stream_check(con, 120.0)["disagree"] == 2  # F3 (45 s) and A2 (100 s)
        assert stream_check(con, 30.0, org="nobody")["checked"] == 0
        rows = con.execute(
            "SELECT event_id FROM searches WHERE is_followup IS DISTINCT FROM "
            "(disjoint_new_query AND gap_seconds <= 30)"
        ).fetchall()
    assert rows == []


def test_the_command(db: str, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memdiag.cli", "calibrate", "--db", db, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={"COLUMNS": "140", "PATH": "/usr/bin:/bin"},
        )

    text = run("--resamples", "200")
    assert text.returncode == 0, text.stderr
    for part in ("≥ 1 followup (30 s)", "never searched", "30 s (stream)", "120 s", "caveats"):
        assert part in text.stdout, part
    js = json.loads(run("--json", "--windows", "15,30", "--by", "agent").stdout)
    assert [w["window_seconds"] for w in js["windows"]] == [15.0, 30.0]
    assert js["bootstrap"]["unit"] == "agent" and js["stream_check"]["disagree"] == 0
    none = run("--org", "nobody")  # an unknown org is an error, not an empty calibration
    assert none.returncode == 1 and "no such org 'nobody'" in none.stderr
    none = run("--since", "2099-01-01")
    assert none.returncode == 1 and "no session with an outcome" in none.stderr


def test_tied_windows_share_the_best_and_zero_resamples_give_no_intervals() -> None:
    s = Sessions(
        failed=np.array([True, True, False, False, True, False]),
        agent_searches=np.array([2, 2, 2, 2, 0, 1]),
        gaps=[[5.0], [5.0], [], [50.0], [], []],
        ignored=np.zeros(6, dtype=bool),
        agent=np.array([0, 0, 1, 1, 2, 3]),
    )
    r = calibrate(s, windows=(10.0, 20.0), stream_window=20.0, resamples=300, seed=1)
    ten, twenty = r["windows"]
    assert ten["rate_auc"] == twenty["rate_auc"] and ten["p_best"] == twenty["p_best"] == 0.5
    bare = calibrate(s, windows=(10.0,), stream_window=10.0, resamples=0)
    assert bare["windows"][0]["rate_auc_ci"] is None and bare["windows"][0]["p_best"] is None
    assert bare["predictors"][0]["precision_ci"] is None and "--resamples 0" in bare["verdict"]
    by_agent = calibrate(s, windows=(10.0,), stream_window=10.0, resamples=50, by="agent")
    assert by_agent["bootstrap"]["clusters"] == 4 and "only 4 agents" in by_agent["notes"][0]
    with pytest.raises(ValueError, match="resamples"):
        calibrate(s, resamples=-1)


def test_a_file_with_verdicts_from_before_the_column(db: str, tmp_path: Path) -> None:
    """Sessions whose searches have no disjoint_new_query are left out, and counted."""
    import shutil

    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as con:
        con.execute("ALTER TABLE searches DROP COLUMN disjoint_new_query")
    with duckdb.connect(str(old), read_only=True) as con:  # a reader cannot add the column
        s = load(con)
    # F1, F2, F3, A1 and A2 had a judged second search: unknown now
    assert (len(s), s.unknown) == (3, 5)
    r = calibrate(s, resamples=50)
    assert r["population"]["left_out_unknown"] == 5 and "5 sessions left out" in r["notes"][0]
    sink = DuckDBSink(old)
    sink.init()  # the sink upgrades the file: the column exists, NULL on the old rows
    with duckdb.connect(str(old), read_only=True) as con:
        assert load(con).unknown == 5 and stream_check(con, 30.0)["checked"] == 0
