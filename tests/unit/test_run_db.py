"""``memdiag run`` into a --db that already holds rows: on the embedded broker a run starts
with no state, so adding to such a file would judge its events without the earlier ones and
mix two worlds in one file. Refused, unless --append or --replace says otherwise."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from memdiag.cli import main
from memdiag.runner import PipelineError, check_db


def holding(path: Path, rows: int) -> Path:
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE searches (event_id VARCHAR)")
        for i in range(rows):
            con.execute("INSERT INTO searches VALUES (?)", [f"e{i}"])
    return path


def test_a_file_with_rows_is_refused_on_the_embedded_broker(tmp_path: Path) -> None:
    db = holding(tmp_path / "m.duckdb", 3)
    with pytest.raises(PipelineError, match="already holds 3 rows.*--replace.*--append"):
        check_db(db, None, embedded=True)
    check_db(db, "append", embedded=True)  # said so: left as it is
    check_db(db, None, embedded=False)  # a lasting broker keeps the state: a run adds to it
    assert db.exists()
    check_db(holding(tmp_path / "empty.duckdb", 0), None, embedded=True)  # no rows: fine
    check_db(tmp_path / "new.duckdb", None, embedded=True)  # no file: fine
    check_db(db, "replace", embedded=True)
    assert not db.exists()


def test_the_command_refuses_before_it_starts_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("MEMDIAG_BROKER", raising=False)
    db = holding(tmp_path / "m.duckdb", 2)
    events = tmp_path / "e.jsonl"
    events.write_text("{}\n")
    assert main(["run", "--input", str(events), "--db", str(db), "--quiet"]) == 1
    said = capsys.readouterr().err
    assert "already holds 2 rows" in said and "--replace" in said
    with pytest.raises(SystemExit):  # one or the other
        main(["run", "--input", str(events), "--db", str(db), "--append", "--replace"])


def test_a_file_that_is_not_duckdb_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "notes.duckdb"
    bad.write_text("not a database")
    with pytest.raises(PipelineError, match="cannot be read as a DuckDB file"):
        check_db(bad, None, embedded=True)


def test_a_file_another_process_writes_is_named_in_use(tmp_path: Path) -> None:
    import subprocess
    import sys

    db = holding(tmp_path / "busy.duckdb", 1)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
         "print('held', flush=True); time.sleep(30)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(PipelineError, match="is in use by another process"):
            check_db(db, None, embedded=True)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
