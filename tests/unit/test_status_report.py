"""`memdiag status` figures and the HTML report, the latter looked at in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import duckdb
import numpy as np
import pytest

from memdiag.analytics.report import BAR, CORRECT, IGNORED, RETRIEVAL, render
from memdiag.analytics.status import followup_over_time, status
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


def _colour(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])


@pytest.mark.skipif(
    not shutil.which("chromium"), reason="Debian's chromium is not installed (make browser)"
)
def test_the_report_renders_in_headless_chromium(db: str, tmp_path: Path) -> None:
    import matplotlib.image

    with duckdb.connect(db, read_only=True) as con:
        page = render(con, db)
    assert "<script" not in page and "http://" not in page.split("<svg", 1)[0]  # self-contained
    html_path = tmp_path / "report.html"
    html_path.write_text(page)
    png = tmp_path / "shot.png"
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    subprocess.run(
        [*base, f"--screenshot={png}", "--window-size=1200,3000", html_path.as_uri()],
        check=True,
        capture_output=True,
        timeout=120,
    )
    dom = subprocess.run(
        [*base, "--dump-dom", html_path.as_uri()],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert dom.count("<svg") == 4 and "Misleading memories" in dom and "stale" in dom
    pixels = matplotlib.image.imread(str(png))[:, :, :3]
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    # the charts were drawn: each series colour covers a visible area of the screenshot
    for name, colour in (
        ("bars", BAR),
        ("used", CORRECT),
        ("ignored", IGNORED),
        ("retrieval", RETRIEVAL),
    ):
        close = np.all(np.abs(pixels - _colour(colour)) < 0.03, axis=2)
        assert close.sum() > 400, f"{name} ({colour}) barely visible: {close.sum()} pixels"
    # and the page is not blank below the charts' area
    assert (pixels < 0.9).any(axis=2)[:1500].mean() > 0.02


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


def test_ids_with_dollars_are_text_in_the_charts() -> None:
    """An id is data: `cost$\\frac$` is drawn as it is, never parsed as mathtext."""
    from memdiag.analytics.report import chart_pipeline

    points = [{"agent_id": "cost$\\frac$", "bucket_start": 0, "pipeline_coverage": 0.5}]
    svg = chart_pipeline(points, ["cost$\\frac$"])
    assert "cost$\\frac$" in svg
