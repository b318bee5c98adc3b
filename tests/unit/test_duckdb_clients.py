"""The DuckDB file opens in the clients analysts use: the real DuckDB CLI from PyPI
(``duckdb-cli``), the oldest supported (1.4) and the newest 1.x, which ``make`` installs
under ``.venv/clients``. Each opens the file the sink writes, runs both table macros and
both views, and does it again after the sink has appended more. A missing client fails the
test: it is part of the set-up, not optional."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from memdiag.analytics.db import STORAGE_VERSION, connect, storage_version
from memdiag.analytics.sink import DuckDBSink
from tests.unit.test_judgements import judgement
from tests.unit.test_sessions import Worker, example_events, session

ROOT = Path(__file__).resolve().parents[2]
#: the versions `make` installs (Makefile, DUCKDB_CLIENTS)
CLIENTS = re.search(r"^DUCKDB_CLIENTS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
assert CLIENTS, "the Makefile names no DuckDB clients (DUCKDB_CLIENTS := ...)"
VERSIONS = CLIENTS.group(1).split()
QUERIES = """
SELECT count(*) AS categories, sum(sessions) AS failed FROM failure_category_distribution();
SELECT count(*) AS misleading FROM misleading_observations();
SELECT agent_searches, followups FROM followup_rate;
SELECT count(*) AS observations FROM observation_feedback_stats;
SELECT count(*) AS searches FROM searches;
"""


def client(version: str) -> Path:
    path = Path(sys.executable).parent.parent / "clients" / f"duckdb-{version}" / "duckdb"
    assert path.is_file(), f"DuckDB CLI {version} is not installed at {path}: run `make install`"
    return path


def run(version: str, db: Path) -> list[list[str]]:
    result = subprocess.run(
        [str(client(version)), "-readonly", "-csv", "-noheader", str(db), "-c", QUERIES],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"duckdb {version}: {result.stderr}"
    return [line.split(",") for line in result.stdout.splitlines()]


def test_the_clients_are_the_oldest_supported_and_the_newest_1x() -> None:
    assert VERSIONS[0].startswith("1.4.") and VERSIONS[-1].startswith("1.")
    for version in VERSIONS:
        out = subprocess.run(
            [str(client(version)), "-version"], capture_output=True, text=True, timeout=30
        )
        assert out.stdout.startswith(f"v{version.split('.post')[0]}"), out.stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_the_sinks_file_opens_in_the_client_and_again_after_appends(
    tmp_path: Path, version: str
) -> None:
    db = tmp_path / "m.duckdb"
    sink = DuckDBSink(db)
    sink.init()
    w = Worker()
    w.publish(example_events())
    for i in range(4):
        w.publish(session(f"s{i}", "rejected", ["x", f"o{i}"]))
    sink.write([*w.records, *w.weights])
    first = run(version, db)
    assert first[0] == ["7", "5"]  # every category listed; 4 failed sessions + the example
    assert first[1] == ["1"]  # x: in 4 failed sessions, no accepted one

    for i in range(4, 7):  # the sink appends while analysts come and go
        w.publish(session(f"s{i}", "rejected", ["x", f"o{i}"]))
    w.publish([search("late-1", "s0"), search("late-2", "s0", ts="2026-11-21T10:00:10Z")])
    sink.write([*w.records, *w.weights, judgement("run-1", "q1", False, retrieved=("g",))])
    second = run(version, db)
    assert second[0] == ["7", "8"]
    assert second[1] == ["1"]
    assert int(second[4][0]) == int(first[4][0]) + 2  # the appended searches are read


def search(event_id: str, session_id: str, ts: str = "2026-11-21T10:00:00Z") -> dict[str, object]:
    return {"kind": "search", "event_id": event_id, "ts": ts, "session_id": session_id,
            "query": event_id, "result_ids": [event_id]}  # fmt: skip


def test_a_new_file_is_written_in_the_configured_storage_version(tmp_path: Path) -> None:
    from memdiag.settings import Settings

    assert Settings().duckdb_storage_version == STORAGE_VERSION
    con = connect(tmp_path / "a.duckdb")
    try:
        assert storage_version(con) == f"{STORAGE_VERSION}+"
    finally:
        con.close()
    con = connect(tmp_path / "b.duckdb", storage_version="latest")
    try:
        major, minor = duckdb.__version__.split(".")[:2]
        assert storage_version(con) == f"v{major}.{minor}.0+"
    finally:
        con.close()


def test_an_older_file_in_a_newer_version_gets_a_conversion_that_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    where = tmp_path / "it's a $HOME dir"  # quotes and a dollar: the command must survive both
    where.mkdir()
    old = where / "memdiag.duckdb"
    sink = DuckDBSink(old, storage_version="latest")  # as memdiag wrote files before
    sink.init()
    w = Worker()
    w.publish(example_events())
    sink.write([*w.records, *w.weights])
    with caplog.at_level("WARNING", logger="memdiag.sink"):
        DuckDBSink(old).init()
    said = caplog.text
    assert "MEMDIAG_DUCKDB_STORAGE_VERSION" in said
    command = said.split("and run: ", 1)[1].split(" ; then replace", 1)[0]
    subprocess.run(command, shell=True, check=True, timeout=60)  # noqa: S602 - as a user pastes it
    converted = where / f"memdiag.{STORAGE_VERSION}.duckdb"
    assert str(converted) in said
    assert run(VERSIONS[0], converted)[0] == ["7", "1"]  # the example's rejected session
