"""Faults the sink and the alerter must survive, or stop on with a message a person acts on:
a DuckDB file that cannot be written, a locked file, a webhook that fails."""

from __future__ import annotations

import asyncio
import http.server
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import duckdb
import pytest

from memdiag.alert import Alert, parse_rule
from memdiag.alerting import deliver
from memdiag.analytics.consumer import SinkFatal, SinkRunner, fatal_message
from memdiag.settings import Settings


class FailingSink:
    """A sink whose flush raises ``errors`` in turn, then writes."""

    last_flush_seconds = last_wait_seconds = 0.0  # what the runner logs of each flush

    def __init__(self, *errors: BaseException):
        self.errors = list(errors)
        self.flushes = 0
        self.pending = 1

    def flush(self) -> int:
        self.flushes += 1
        if self.errors:
            raise self.errors.pop(0)
        return 1


def runner(sink: Any, tmp_path: Path) -> SinkRunner:
    r = SinkRunner(Settings(duckdb_path=str(tmp_path / "x.duckdb")), sink=sink)
    r.retry_delays = (0.0, 0.0, 0.0)
    r._first_pending_at = 1.0
    return r


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        ('IO Error: Could not write file "x.duckdb": No space left on device', "the disk is full"),
        ('IO Error: Cannot open file "x.duckdb": Permission denied', "permission denied"),
        ("IO Error: Could not write: Read-only file system", "the file system is read-only"),
    ],
)
def test_an_unwritable_file_is_fatal_after_a_bounded_retry(
    tmp_path: Path, error: str, cause: str
) -> None:
    sink = FailingSink(*(duckdb.IOException(error) for _ in range(10)))
    r = runner(sink, tmp_path)
    with pytest.raises(SinkFatal) as fatal:
        asyncio.run(r.flush_and_commit())
    assert sink.flushes == len(r.retry_delays) + 1
    message = str(fatal.value)
    assert cause in message and str(tmp_path / "x.duckdb") in message
    assert "nothing is lost" in message and "restart the sink" in message


def test_a_passing_failure_is_retried_and_written(tmp_path: Path) -> None:
    sink = FailingSink(duckdb.IOException("IO Error: No space left on device"))
    asyncio.run(runner(sink, tmp_path).flush_and_commit())
    assert sink.flushes == 2


def test_a_locked_file_is_waited_for_never_fatal(tmp_path: Path, monkeypatch) -> None:
    lock = duckdb.IOException('IO Error: Could not set lock on file "x.duckdb": Conflicting lock')
    sink = FailingSink(*(lock for _ in range(12)))  # more than any bounded retry
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("memdiag.analytics.consumer.asyncio.sleep", sleep)
    asyncio.run(runner(sink, tmp_path).flush_and_commit())
    assert sink.flushes == 13 and slept == [1.0] * 12


def test_the_sink_stops_on_a_corrupt_file_with_the_cause(tmp_path: Path) -> None:
    """The real command: a file that is no DuckDB database, an exit code and one message."""
    bad = tmp_path / "memdiag.duckdb"
    bad.write_bytes(b"\x00garbage" * 5000)
    result = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "sink", "--db", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "MEMDIAG_BROKER": "kafka://127.0.0.1:9"},
    )
    # it never waits for the broker: the file is checked first, and the failure is final
    assert result.returncode == 1, result.stderr  # an error memdiag explains
    assert "not a valid DuckDB database" in result.stderr and str(bad) in result.stderr
    assert "Traceback" not in result.stderr


def test_fatal_message_names_file_and_cause() -> None:
    text = fatal_message("/data/m.duckdb", OSError("[Errno 28] No space left on device"))
    assert text.startswith("the sink cannot write /data/m.duckdb: the disk is full")


# -- the alert webhook --------------------------------------------------------------------------


class Hook(http.server.BaseHTTPRequestHandler):
    statuses: list[int] = []
    bodies: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        status = self.statuses.pop(0) if self.statuses else 200
        self.send_response(status)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Any:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    Hook.statuses, Hook.bodies = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def alert() -> Alert:
    return Alert(parse_rule("followup_rate > 0.3 for 5m"), "firing", 0.5, 1_790_000_000_000_000)


def test_a_failing_webhook_is_retried_with_backoff(hook: str) -> None:
    Hook.statuses = [503, 500]
    assert asyncio.run(deliver(hook, alert(), delays=(0.01, 0.02, 0.04)))
    assert len(Hook.bodies) == 3 and Hook.bodies[0] == Hook.bodies[2]


def test_a_dropped_alert_is_logged_whole(hook: str, caplog: pytest.LogCaptureFixture) -> None:
    Hook.statuses = [503] * 10
    caplog.set_level(logging.WARNING, logger="memdiag.alert")
    assert not asyncio.run(deliver(hook, alert(), delays=(0.01, 0.01)))
    assert len(Hook.bodies) == 3
    [dropped] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "alert dropped after 3 attempts" in dropped and '"state":"firing"' in dropped


def test_a_client_error_is_not_retried(hook: str, caplog: pytest.LogCaptureFixture) -> None:
    Hook.statuses = [404]
    assert not asyncio.run(deliver(hook, alert(), delays=(0.01, 0.01)))
    assert len(Hook.bodies) == 1


def test_an_unreachable_webhook_is_retried_then_dropped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="memdiag.alert")
    assert not asyncio.run(deliver("http://127.0.0.1:9/hook", alert(), delays=(0.01,)))
    assert any("alert dropped after 2 attempts" in r.getMessage() for r in caplog.records)


class IsolatingSink(FailingSink):
    """A sink whose batch write refuses bad data; record by record it writes the rest."""

    def __init__(self, *errors: BaseException, isolating_error: BaseException | None = None):
        super().__init__(*errors)
        self.isolated = 0
        self.isolating_error = isolating_error

    def flush_isolating(self, reject: Any) -> int:
        self.isolated += 1
        if self.isolating_error is not None:
            raise self.isolating_error
        return 1


def test_bad_data_is_isolated_but_a_broken_file_is_not(tmp_path: Path) -> None:
    data = IsolatingSink(duckdb.ConstraintException("Constraint Error: NOT NULL"))
    asyncio.run(runner(data, tmp_path).flush_and_commit())
    assert data.isolated == 1
    # a database DuckDB has invalidated is the file's problem: bounded retry, then fatal
    fatal = IsolatingSink(
        *(duckdb.FatalException("database has been invalidated") for _ in range(9))
    )
    with pytest.raises(SinkFatal, match="database has been invalidated"):
        asyncio.run(runner(fatal, tmp_path).flush_and_commit())
    assert fatal.isolated == 0
    # the file failing during the record-by-record write is not turned into dead letters
    both = IsolatingSink(
        *(duckdb.ConversionException("bad") for _ in range(9)),
        isolating_error=duckdb.IOException("IO Error: No space left on device"),
    )
    with pytest.raises(SinkFatal, match="the disk is full"):
        asyncio.run(runner(both, tmp_path).flush_and_commit())


def test_a_lock_word_in_a_path_is_no_lock(tmp_path: Path) -> None:
    from memdiag.analytics.consumer import is_lock_conflict

    assert not is_lock_conflict(
        duckdb.IOException('Cannot open "/srv/blockstore/x": No space left')
    )
    assert is_lock_conflict(
        duckdb.IOException('IO Error: Could not set lock on file "x": Conflicting lock is held')
    )


def test_a_lost_commit_after_a_long_wait_is_not_fatal(tmp_path: Path) -> None:
    from aiokafka.errors import CommitFailedError

    class Consumer:
        async def commit(self) -> None:
            raise CommitFailedError("rebalanced")

    r = runner(FailingSink(), tmp_path)
    r.consumer = Consumer()  # type: ignore[assignment]
    asyncio.run(r.flush_and_commit())
    assert r._first_pending_at is None


def test_the_webhook_url_is_logged_without_its_token(caplog: pytest.LogCaptureFixture) -> None:
    from memdiag.alerting import redacted

    assert (
        redacted("https://user:pw@hooks.example:8443/x/y?token=abc")
        == "https://hooks.example:8443/x/y"
    )
    caplog.set_level(logging.WARNING, logger="memdiag.alert")
    asyncio.run(deliver("http://u:secret@127.0.0.1:9/hook?token=t0k3n", alert(), delays=(0.01,)))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "t0k3n" not in text and "secret" not in text and "127.0.0.1:9/hook" in text


def test_an_integer_beyond_its_column_is_refused_at_the_edge_and_isolated_in_the_sink(
    tmp_path: Path,
) -> None:
    import orjson

    from memdiag.schemas import JUDGEMENT_KINDS
    from memdiag.schemas.decode import Decoder

    judgement = {
        "kind": "judgement", "event_id": "j", "ts": "2026-11-21T09:30:00Z", "run_id": "r",
        "question_id": "q", "judge_correct": False, "gold_evidence_ids": [],
        "retrieved_context_ids": [], "tokens": 2**63,
    }  # fmt: skip
    decoded = Decoder(JUDGEMENT_KINDS, "memdiag.judgements", 1 << 20, None).decode(
        orjson.dumps(judgement)
    )
    assert [r.reason for r in decoded.rejected] == ["bad_value"]
    # and a record that reaches the sink anyway (another producer) is one refused record,
    # not a broken file
    sink = IsolatingSink(OverflowError("Python int too large to convert to C long"))
    asyncio.run(runner(sink, tmp_path).flush_and_commit())
    assert sink.isolated == 1


def test_a_webhook_url_that_cannot_work_is_refused_at_start() -> None:
    from memdiag.alerting import check_webhook, redacted

    assert check_webhook("https://hooks.example/x?token=1") is None
    assert "http:// or https://" in (check_webhook("ftp://hooks.example/x") or "")
    problem = check_webhook("http://u:tok@h:abc/x") or ""
    assert "Port" in problem or "port" in problem
    assert "tok" not in problem
    assert redacted("http://[::1]:8080/h?x=1") == "http://[::1]:8080/h"

