"""What every terminal rendering promises: nothing is cut off at 80 columns (ids stay whole,
a table that cannot fit is stacked), a shortened list says how many it left out, and an
unknown id fails the same way in every command."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.unit.test_serve import AGENT, OBS, RUN_A, RUN_B, build

LONG_SESSION = "ses-" + "x" * 70  # longer than any column at 80
LONG_RUN = "longmem-reranker-with-a-very-long-name-2026-11-21"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from memdiag.analytics.sink import DuckDBSink
    from tests.unit.test_judgements import judgement
    from tests.unit.test_sessions import session

    path = build(tmp_path_factory.mktemp("render") / "r.duckdb")
    sink = DuckDBSink(path)
    from tests.unit.test_sessions import Worker

    w = Worker()
    w.publish(session(LONG_SESSION, "rejected", ["obs-" + "y" * 60], ts="2026-11-21T11:00:00Z"))
    sink.write([*w.records, *w.weights])
    sink.write([judgement(LONG_RUN, f"q{i}", i % 2 == 0) for i in range(6)])
    return path


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def memdiag(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """The command in this process (fast), its consoles at ``columns`` wide as a terminal of
    that width would make them."""
    from memdiag.cli import main
    from memdiag.cli.common import err, out

    def run(db: Path, *args: str, columns: int = 80) -> Ran:
        widths = out._width, err._width  # noqa: SLF001 - Rich keeps the width there
        out.width = err.width = columns
        capsys.readouterr()
        try:
            code = main([*args, "--db", str(db)])
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            out._width, err._width = widths  # noqa: SLF001
        got = capsys.readouterr()
        return Ran(code, got.out, got.err)

    return run


COMMANDS = [
    ("status",),
    ("query", "failure-distribution"),
    ("query", "misleading"),
    ("query", "misleading", "--graph"),
    ("query", "unused-memories", "--min-injections", "1"),
    ("query", "observation-stats", OBS),
    ("query", "observation-history", OBS),
    ("query", "pipeline-health"),
    ("query", "recall-trend"),
    ("query", "failed-sessions"),
    ("query", "dead-letters"),
    ("explain", LONG_SESSION),
    ("explain-memory", "m1" + OBS[3:], "--agent", AGENT),
    ("runs",),
    ("compare", "--baseline", RUN_A, "--candidate", RUN_B, "--resamples", "200"),
    ("report", "scores", "--run-id", LONG_RUN),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_nothing_is_cut_off_at_80_columns(
    db: Path, args: tuple[str, ...], memdiag: Callable[..., Ran]
) -> None:
    r = memdiag(db, *args)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout, r.stdout  # Rich's ellipsis: a cell cut short
    for long_id in (LONG_SESSION, LONG_RUN):
        if long_id in " ".join(args):
            assert long_id in r.stdout, (long_id, r.stdout)  # whole, on one line
    width = max(len(line) for line in r.stdout.splitlines() or [""])
    assert width <= 80, r.stdout


def test_off_a_terminal_lines_are_wide_and_whole(db: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "memdiag.cli", "runs", "--db", str(db)],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})  # fmt: skip
    line = next(line for line in r.stdout.splitlines() if LONG_RUN in line)
    assert "judged" in r.stdout and "50.0%" in line  # its row on one line, whole


def test_a_shortened_list_says_so(db: Path, memdiag: Callable[..., Ran]) -> None:
    r = memdiag(db, "query", "failed-sessions", "--limit", "2")
    assert "2 of 5 failed sessions shown" in r.stderr
    r = memdiag(db, "status", "--top", "0")
    assert "0 of 1 misleading memories shown: memdiag query misleading" in r.stdout
    js = memdiag(db, "query", "failed-sessions", "--limit", "1", "--json")
    assert len(json.loads(js.stdout)) == 1 and "1 of 5 rows" in js.stderr
    full = memdiag(db, "query", "failed-sessions", "--limit", "10")
    assert "shown" not in full.stderr  # nothing cut: nothing said
    probes = memdiag(db, "explain-memory", "m1" + OBS[3:], "--agent", AGENT, "--limit", "1")
    assert "--limit" not in probes.stdout  # one probe, all of them shown


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("query", "observation-stats", "obs-nope"), "no such memory 'obs-nope'"),
        (("query", "observation-history", "obs-nope"), "no such memory 'obs-nope'"),
        (("query", "failure-distribution", "--org", "nope"), "no such org 'nope'"),
        (("query", "failed-sessions", "--org", "nope"), "no such org 'nope'"),
        (("query", "pipeline-health", "--agent", "nope"), "no such agent with memory events"),
        (("query", "recall-trend", "--agent", "nope"), "no such agent with memory events"),
        (("explain", "nope"), "no such session 'nope'"),
        (("explain-memory", "m1", "--agent", "nope"), "no such agent with memory events"),
        (("report", "scores", "--run-id", "nope"), "no such run 'nope'"),
        (("compare", "--baseline", "nope", "--candidate", RUN_B), "no such run 'nope'"),
        (("calibrate", "--org", "nope"), "no such org 'nope'"),
    ],
)
def test_unknown_things_fail_the_same_way(
    db: Path, args: tuple[str, ...], says: str, memdiag: Callable[..., Ran]
) -> None:
    r = memdiag(db, *args)
    assert r.returncode == 1 and says in r.stderr
    assert "closest" in r.stderr or "try (" in r.stderr or "include (" in r.stderr
    js = memdiag(db, *args, "--json")
    doc = json.loads(js.stdout)
    assert js.returncode == 1 and doc["error"] == "not_found" and says in doc["message"]
    assert doc["closest"], doc


def test_an_empty_since_window_says_the_data_span(db: Path, memdiag: Callable[..., Ran]) -> None:
    r = memdiag(db, "query", "failed-sessions", "--since", "2030-01-01")
    assert r.returncode == 0 and "the data spans 2026-11-21" in r.stderr


def test_a_file_that_is_not_duckdb_is_a_sentence(
    tmp_path: Path, memdiag: Callable[..., Ran]
) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_text("hello")
    r = memdiag(junk, "status")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "is not a valid DuckDB database file" in r.stderr
    js = json.loads(memdiag(junk, "status", "--json").stdout)
    assert js["error"] == "database"
