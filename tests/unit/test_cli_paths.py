"""A user's path mistakes are one line saying what and where, never a traceback: an output
path in a folder that does not exist, and a folder given as the database."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import duckdb
import pytest

from memdiag.analytics.sink import DuckDBSink
from memdiag.cli import main


@pytest.fixture
def db(tmp_path: Path) -> Path:
    sink = DuckDBSink(tmp_path / "m.duckdb")
    sink.init()
    return tmp_path / "m.duckdb"


def test_an_output_path_that_cannot_be_written_is_one_line(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "no" / "such" / "r.html"
    assert main(["report", "html", "--db", str(db), "--out", str(target)]) == 1
    said = capsys.readouterr().err
    assert "error:" in said and "r.html" in said and "No such file or directory" in said
    assert "Traceback" not in said


def test_a_folder_as_the_database_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--db", str(tmp_path)]) == 1
    said = capsys.readouterr().err
    assert "error:" in said and "Is a directory" in said and "Traceback" not in said



def test_serve_on_a_port_it_cannot_have_is_one_line(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn")
    with pytest.raises(SystemExit) as out_of_range:
        main(["serve", "--db", str(db), "--port", "99999"])
    assert out_of_range.value.code == 2
    assert "a port is 1 to 65535, not 99999" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--db", str(db), "--port", str(port)]) == 2
        # a name with two addresses (127.0.0.1 and ::1): each is bound, so each is asked
        assert main(["serve", "--db", str(db), "--host", "localhost", "--port", str(port)]) == 2
    said = capsys.readouterr().err
    assert f"cannot listen on http://127.0.0.1:{port}/" in said and "in use" in said
    assert f"cannot listen on http://localhost:{port}/" in said
    assert "memdiag serve:" not in said  # no banner for a server that never started


def test_a_file_memdiag_never_wrote_is_named_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE orders (id INTEGER)")
    assert main(["status", "--db", str(other)]) == 1
    said = capsys.readouterr().err
    assert "holds none of memdiag's tables" in said and "older memdiag" not in said


def test_publish_refuses_a_folder_and_an_empty_batch_and_names_a_file_that_is_not_json_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memdiag.cli.pipeline import _not_json_lines

    assert main(["publish", str(tmp_path)]) == 2
    said = " ".join(capsys.readouterr().err.split())  # wrapped to the terminal's width
    assert "is a folder: give a JSON Lines file" in said
    events = tmp_path / "e.jsonl"
    events.write_text('{"kind": "search"}\n\n{"kind": "search"}\n')
    with pytest.raises(SystemExit) as empty:
        main(["publish", str(events), "--batch-size", "0"])
    assert empty.value.code == 2 and "at least 1, not 0" in capsys.readouterr().err
    assert _not_json_lines(events) is None
    pretty = tmp_path / "arr.json"
    pretty.write_text('[\n  {"kind": "search",\n   "event_id": "e1"}\n]\n')
    hint = _not_json_lines(pretty)
    assert hint is not None and "one JSON array over many lines" in hint and "jq -c" in hint


def test_a_broken_socket_is_an_error_while_a_closed_stdout_is_not(
    db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`| head` closing stdout ends a command quietly (exit 0); a peer closing a socket
    (a broker, a client) is a failure, said in one line (exit 1), not a silent success."""
    import memdiag.cli as cli

    def broken(args: object) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    parser = cli.build_parser()
    parser.parse_args = lambda argv=None: argparse.Namespace(command="status", func=broken)  # type: ignore[assignment,method-assign]
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert main([]) == 1  # stdout is pytest's capture: open
    said = capsys.readouterr().err
    assert "error:" in said and "Broken pipe" in said and "Traceback" not in said
    monkeypatch.setattr(cli, "_stdout_gone", lambda: True)
    assert main([]) == 0


def test_an_events_file_as_the_database_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DuckDB takes a .jsonl path for a file to read, not a database: said, not a traceback."""
    events = tmp_path / "events.jsonl"
    events.write_text('{"kind": "search"}\n')
    assert main(["status", "--db", str(events), "--json"]) == 1
    said = capsys.readouterr()
    assert "is not a DuckDB database file" in said.out and "Traceback" not in said.err
    assert '"error": "database"' in said.out


@pytest.mark.parametrize("read_only", [False, True])
def test_an_events_file_is_refused_as_a_database_to_write_too(tmp_path: Path,
                                                               read_only: bool) -> None:  # fmt: skip
    """For writing (the sink, `run --append`), DuckDB opened a .jsonl as an in-memory
    database: every flush then failed with "Table dead_letters does not exist", and nothing
    was kept. Refused as for reading, the file untouched."""
    from memdiag.analytics.db import DatabaseError, connect

    events = tmp_path / "events.jsonl"
    events.write_text('{"kind": "search"}\n')
    with pytest.raises(DatabaseError, match="is not a DuckDB database file"):
        connect(events, read_only=read_only)
    assert events.read_text() == '{"kind": "search"}\n'
    connect(tmp_path / "new.duckdb").close()  # a file to create is taken
    connect(":memory:").close()
    connect(":memory:named").close()
    with pytest.raises(DatabaseError, match="no DuckDB file given"):
        connect("")  # MEMDIAG_DUCKDB_PATH= : not a database gone with the process


def test_an_empty_reason_is_a_usage_error_not_every_input_processed(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--reason "$REASON"` with the variable unset: "" is no reason (it is the key of the
    advice for reasons memdiag does not know), so it is said, never "every input was
    processed" over a file that holds dead letters."""
    sink = DuckDBSink(db)
    sink.write([{"kind": "dead_letter", "dead_letter_id": "d1", "topic": "memdiag.events",
                 "partition": 0, "offset": 1, "batch_index": None, "key": None,
                 "reason": "bad_ts", "detail": "x", "payload": "{}", "payload_bytes": 2,
                 "payload_truncated": False, "ts": "2026-11-21T09:00:00Z"}])  # fmt: skip
    assert main(["query", "dead-letters", "--reason", "", "--db", str(db)]) == 2
    said = capsys.readouterr()
    assert "'' is no dead-letter reason" in said.err and "bad_ts 1" in said.err
    assert "every input was processed" not in said.out
