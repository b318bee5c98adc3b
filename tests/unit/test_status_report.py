"""`memdiag status` figures and the HTML report, the latter looked at in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest

from memdiag.analytics.status import followup_over_time, status
from memdiag.views.report import BAR, CORRECT, IGNORED, RETRIEVAL, render
from tests.browser import Console, browser
from tests.unit.test_judgements import judgement
from tests.unit.test_sessions import example_events, into_duckdb, session


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("report") / "r.duckdb"
    sink = into_duckdb(
        path,
        example_events(),
        *(session(f"s{i}", "rejected" if i % 2 else "accepted", ["x", f"o{i}"]) for i in range(6)),
        *(session(f"bad{i}", "rework", ["stale"]) for i in range(3)),
    )
    sink.write(
        [
            judgement("run-1", f"q{i}", i % 3 == 0, retrieved=() if i % 3 == 1 else ("g",))
            for i in range(9)
        ]
    )
    return str(path)


def test_status_figures(db: str) -> None:
    with duckdb.connect(db, read_only=True) as con:
        st = status(con)
        series = followup_over_time(con)
    assert st["followup"]["agent_searches"] == 2 and st["followup"]["rate"] == 0.5
    assert "refinement" in st["followup"]["caveat"]
    assert st["sessions"] == {"rejected": 3 + 1, "accepted": 3, "rework": 3}
    assert (
        st["misleading"]["count"] == 1 and st["misleading"]["top"][0]["observation_id"] == "stale"
    )
    [run] = st["runs"]
    assert (run["reader_failures"], run["retrieval_failures"], run["judgements"]) == (3, 3, 9)
    assert st["freshness"]["newest_event"] is not None
    assert sum(p["agent_searches"] for p in series) == 2
    # the newest search (at the span's end) is in the last bucket, not in one past it
    with duckdb.connect(db, read_only=True) as con:
        [whole] = followup_over_time(con, buckets=1)
    assert whole["agent_searches"] == 2


def test_status_command_reads_at_a_glance(db: str) -> None:
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "status", "--db", db],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    for text in (
        "followup rate",
        "50.0%",
        "memories used",
        "misleading memories: 1",
        "stale",
        "run-1",
        "freshness",
        "test_failure",
    ):
        assert text in result.stdout, text


def test_the_report_renders_in_headless_chromium(db: str, tmp_path: Path) -> None:
    """The page on its own in Debian's Chromium: no script, no request, no console error; each
    chart's colours drawn over a visible area; nothing wider than the window."""
    with duckdb.connect(db, read_only=True) as con:
        page = render(con, db)
    assert "<script" not in page and "http://" not in page.split("<svg", 1)[0]  # self-contained
    html_path = tmp_path / "report.html"
    html_path.write_text(page)
    with browser() as b:
        tab = b.new_page(viewport={"width": 1200, "height": 900})
        console = Console(tab)
        requests: list[str] = []
        tab.on("request", lambda r: requests.append(r.url))
        tab.goto(html_path.as_uri())
        assert tab.locator("svg.chart").count() >= 4
        assert "Misleading memories" in tab.content() and "stale" in tab.content()
        for name, colour in (("bars", BAR), ("used", CORRECT), ("ignored", IGNORED),
                             ("retrieval", RETRIEVAL)):  # fmt: skip
            area = tab.evaluate(
                """c => [...document.querySelectorAll(`svg.chart [fill="${c}"]`)]
                   .map(el => el.getBoundingClientRect()).reduce((s, r) => s + r.width * r.height, 0)""",
                colour,
            )
            assert area > 100, f"{name} ({colour}) barely drawn: {area} px²"
        # nothing runs wider than the window: wide tables scroll inside their own box
        assert tab.evaluate("document.documentElement.scrollWidth") <= 1200
        assert console.errors == [] and requests == [html_path.as_uri()]


def test_a_file_from_before_the_recall_pipeline_still_reads(db: str, tmp_path: Path) -> None:
    """A file written before memdiag had the recall pipeline (its tables and view dropped
    here): status and the report say it is not there yet, the query says what to do, and
    nothing crashes (DuckDB once found the function `pipeline_health` for the missing view)."""
    import sys

    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as con:
        con.execute("DROP VIEW pipeline_health")
        con.execute("DROP VIEW recall_probes")
        for table in ("memory_pipeline", "recall_probe_events", "pipeline_agents",
                      "pipeline_breaks"):  # fmt: skip
            con.execute(f"DROP TABLE {table}")
    with duckdb.connect(str(old), read_only=True) as con:
        assert status(con)["pipeline"] is None
    env = {"COLUMNS": "120", "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "memdiag.cli"]
    st = subprocess.run([*run, "status", "--db", str(old)], capture_output=True, text=True,
                        timeout=60, env=env)  # fmt: skip
    assert st.returncode == 0 and "Traceback" not in st.stderr, st.stderr
    report = subprocess.run([*run, "report", "html", "--db", str(old), "--out",
                             str(tmp_path / "r.html")], capture_output=True, text=True,
                            timeout=120, env=env)  # fmt: skip
    assert report.returncode == 0, report.stderr
    q = subprocess.run([*run, "query", "pipeline-health", "--db", str(old)], capture_output=True,
                       text=True, timeout=60, env=env)  # fmt: skip
    assert q.returncode != 0 and "Traceback" not in q.stderr
    assert "memdiag sink" in q.stderr and len(q.stderr.strip().splitlines()) == 1


def test_ids_in_the_charts_are_text() -> None:
    """An id is data: `cost$\\frac$` and `<script>` are drawn as they are, escaped."""
    from datetime import UTC, datetime

    from memdiag.views.html import coverage_chart

    agent = "cost$\\frac$<script>alert(1)</script>"
    t = datetime(2026, 11, 21, tzinfo=UTC)
    points = [{"agent_id": agent, "bucket_start": t, "pipeline_coverage": 0.5, "written": 4}]
    svg = coverage_chart(points, [agent])
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "cost$\\frac$" in svg


def test_the_dead_letters_card_says_how_many_reasons_it_leaves_out(tmp_path: Path) -> None:
    from memdiag.analytics.db import connect
    from memdiag.analytics.sink import DuckDBSink
    from memdiag.analytics.status import status
    from memdiag.views import html as h

    sink = DuckDBSink(tmp_path / "d.duckdb")
    sink.init()
    reasons = ["bad_ts", "not_json", "missing_field", "wrong_type", "unknown_kind"]
    sink.write([
        {"kind": "dead_letter", "dead_letter_id": r, "topic": "memdiag.events", "partition": 0,
         "offset": i, "batch_index": 0, "key": None, "reason": r, "detail": "d", "payload": "x",
         "payload_bytes": 1, "payload_truncated": False, "ts": "2026-11-21T09:30:00Z"}
        for i, r in enumerate(reasons)
    ])  # fmt: skip
    con = connect(sink.path, read_only=True)
    try:
        page = h.cards(status(con), h.PLAIN)
    finally:
        con.close()
    assert ", 2 more" in page
