"""``memdiag run``: the whole pipeline on one file, and done when DuckDB has every event.

Broker (embedded Tansu unless ``MEMDIAG_BROKER`` is set), worker and sink run as child
processes, exactly as in production; the file is published while they start (the worker
reads from the earliest offset, so nothing waits for anything). "Done" is measured, not
guessed: first the worker's consumer group has committed the end of its input topics (it
flushes what it produced before it commits, re-routed events included), then the sink's
group has committed the end of the topics it reads (it commits only after DuckDB has
committed). Then everything stops, in order, and the summary is read from DuckDB.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from aiokafka import AIOKafkaProducer

from memdiag import procs
from memdiag.broker import EmbeddedBroker
from memdiag.kafka import Lag, client_options, ensure_topics, wait_drained
from memdiag.publish import ProgressFn, PublishStats, publish_file
from memdiag.settings import Settings

Say = Callable[[str], None]


class PipelineError(RuntimeError):
    """A stage of the pipeline failed; the message says which and shows its log."""


def worker_stages(settings: Settings) -> list[list[str]]:
    """The worker's input topics, stage by stage: each stage feeds the next, so once a
    stage has committed everything, all it will ever send to the next one has been sent."""
    t = settings.topics
    return [
        [t.otlp_spans],
        [t.otlp_traces],
        [t.events, t.judgements, t.memory, t.span_events],
        [t.observation_steps],
        [t.session_verdicts],
        [t.counters],
    ]


async def wait_worker(
    settings: Settings,
    timeout: float,
    poll: float = 0.2,
    on_poll: Callable[[Lag], None] | None = None,
    end_of_input: bool = False,
) -> Lag:
    """Wait until the worker has processed everything, in every stage. ``end_of_input``:
    once the spans are all in their traces, tell the trace stage the input has ended (what
    still waits for an ancestor span then never will: it is dead-lettered, not forgotten a
    day later)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    lag = Lag(settings.app_id, 0)
    for topics in worker_stages(settings):
        remaining = max(0.0, deadline - loop.time())
        lag = await wait_drained(settings, settings.app_id, topics, remaining, poll, on_poll)
        if not lag.drained:
            return lag
        if end_of_input and topics == [settings.topics.otlp_traces]:
            await _end_of_input(settings)
            return await wait_worker(settings, max(0.0, deadline - loop.time()), poll, on_poll)
    return lag


async def _end_of_input(settings: Settings) -> None:
    """One end marker to each partition of the trace stage's topic."""
    producer = AIOKafkaProducer(**client_options(settings), acks="all")
    await producer.start()
    try:
        topic = settings.topics.otlp_traces
        for partition in range(settings.events_partitions):
            await producer.send_and_wait(topic, b'[{"end": true}]', partition=partition)
    finally:
        await producer.stop()


def sink_inputs(settings: Settings) -> list[str]:
    t = settings.topics
    return [t.diagnostics, t.weights, t.graph_weights, t.deadletter]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    read_to: int = 0  # how far new_warnings has read the log

    def tail(self, lines: int = 30) -> str:
        self.log_file.flush()
        text = self.log_path.read_text("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def new_warnings(self, logger: str = "memdiag.db") -> list[str]:
        """The warnings of ``logger`` its log gained since the last call (the sink waiting on
        another process's lock of the DuckDB file), without their log prefix."""
        self.log_file.flush()
        with self.log_path.open("rb") as f:
            f.seek(self.read_to)
            text = f.read()
        end = text.rfind(b"\n") + 1  # whole lines only: a half-written one waits
        self.read_to += end
        lines = text[:end].decode("utf-8", "replace").splitlines()
        marker = f"[WARNING] {logger}: "
        return [line.split(marker, 1)[1] for line in lines if marker in line]

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise PipelineError(
                f"the {self.name} exited with code {self.proc.returncode}; its log ends:\n"
                f"{self.tail()}"
            )


@dataclass
class RunResult:
    publish: PublishStats
    db_path: str
    seconds: float
    stage_seconds: dict[str, float] = field(default_factory=dict)


#: The consumer-group session timeout of ``run`` and ``demo`` on the embedded broker (s).
EMBEDDED_SESSION_TIMEOUT = 2.0


@contextmanager
def broker_for(settings: Settings, say: Say) -> Iterator[Settings]:
    """The settings pointed at a broker: ``MEMDIAG_BROKER`` if set, else an embedded one."""
    if os.environ.get("MEMDIAG_BROKER"):
        say(f"using the broker at {settings.broker}")
        yield settings
        return
    t0 = time.monotonic()
    with EmbeddedBroker() as broker:
        say(f"embedded broker (Tansu) on {broker.bootstrap}, up in {time.monotonic() - t0:.2f}s")
        # the embedded broker is local and plaintext, whatever MEMDIAG_KAFKA_* say. One worker
        # on a loopback broker: Tansu answers the group join after half the session timeout,
        # so a short one makes the worker take its first record about 2.6 s after its start
        # (6 s, the default for a fleet: 4.6 s)
        yield settings.with_(
            broker=broker.url,
            kafka_security_protocol="PLAINTEXT",
            session_timeout_seconds=min(settings.session_timeout_seconds, EMBEDDED_SESSION_TIMEOUT),
            heartbeat_interval_seconds=min(
                settings.heartbeat_interval_seconds, EMBEDDED_SESSION_TIMEOUT / 4
            ),
        )


def spawn_child(
    name: str, command: str, settings: Settings, log_dir: Path, module: str = "memdiag.cli"
) -> Child:
    """``python -m memdiag.cli COMMAND`` (or another module's ``COMMAND`` words) with the
    settings in its environment, its output in ``log_dir/NAME.log``."""
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("ab")  # a restarted process adds to its log
    env = {**os.environ, **settings.as_env()}
    # A one-shot local run has no collector to export to (the counters are on the counters
    # topic either way): unlike `memdiag worker`, it exports nothing unless asked.
    env.setdefault("OTEL_METRICS_EXPORTER", "none")
    proc = procs.spawn(
        [sys.executable, "-m", module, *command.split()],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return Child(name, proc, log_path, log_file)


def rows_in(path: Path) -> int:
    """How many rows the DuckDB file at ``path`` holds in all its tables (0: no file)."""
    if not path.exists():
        return 0
    import duckdb

    try:
        with duckdb.connect(str(path), read_only=True) as con:
            tables = con.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() WHERE NOT internal"
            ).fetchall()
            total = 0
            for names in tables:
                schema, table = (n.replace('"', '""') for n in names)
                row = con.execute(f'SELECT count(*) FROM "{schema}"."{table}"').fetchone()  # noqa: S608
                total += row[0] if row else 0
            return total
    except duckdb.Error as exc:
        if "lock" in str(exc).lower():
            raise PipelineError(
                f"--db {path} is in use by another process (a sink or a reader that writes): "
                f"stop it, or give another --db ({str(exc).splitlines()[0]})"
            ) from None
        raise PipelineError(f"--db {path}: cannot be read as a DuckDB file ({exc})") from None


#: What ``run`` does with a --db that holds rows: refuse (None), add to it, or start it over.
APPEND, REPLACE = "append", "replace"


def check_db(path: Path, existing: str | None, embedded: bool) -> None:
    """A run on the embedded broker starts with no state: into a file that holds another
    run's rows, its events would be judged without the earlier ones (no search before the
    first, weights back at 1.0) and the file would mix the two. Refused unless the caller
    says ``append`` (rows of unrelated data, say) or ``replace`` (the file is removed)."""
    if existing == REPLACE:
        for stale in (path, path.with_name(path.name + ".wal")):
            stale.unlink(missing_ok=True)
        return
    if existing == APPEND or not embedded:
        return  # a lasting broker keeps the worker's state: a run there adds to it
    n = rows_in(path)
    if n:
        raise PipelineError(
            f"{path} already holds {n:,} rows. A run on the embedded broker starts with no "
            "state (no earlier searches, turns or weights), so its events would be judged "
            "without the ones already in the file, and the file would mix the two. Give a new "
            "--db, --replace to start the file over, or --append to add to it anyway (data "
            "that shares no session, memory or run with the file); a worker on a lasting "
            "broker (MEMDIAG_BROKER) adds to a file with its state kept."
        )


def run_pipeline(
    input_path: Path,
    settings: Settings,
    say: Say,
    progress: ProgressFn | None = None,
    timeout: float = 600.0,
    existing: str | None = None,
) -> RunResult:
    """The whole pipeline on one file. ``existing``: what to do with a --db that holds rows
    (:func:`check_db`)."""
    if not input_path.is_file():  # a path the user gave: said as one (exit 1, "path")
        raise FileNotFoundError(errno.ENOENT, "no such input file", str(input_path))
    check_db(Path(settings.duckdb_path), existing, not os.environ.get("MEMDIAG_BROKER"))
    started = time.monotonic()
    stages: dict[str, float] = {}
    with broker_for(settings, say) as s, tempfile.TemporaryDirectory(prefix="memdiag-run-") as d:
        # the worker's local state lives as long as this run (a cache of its changelog: one
        # started afresh is rebuilt from it, as on a new machine)
        s = s.with_(state_dir=str(Path(d) / "state"))
        asyncio.run(ensure_topics(s))
        # the file exists with its tables whatever the input holds (a file of no events
        # gives an empty database, not "no DuckDB file" to the commands after it)
        _create_db(s)
        children = [
            spawn_child("worker", "worker", s, Path(d)),
            spawn_child("sink", "sink", s, Path(d)),
        ]
        try:
            t0 = time.monotonic()
            stats = asyncio.run(publish_file(input_path, s, progress=progress))
            stages["publish"] = time.monotonic() - t0
            spans = f" and {stats.span_records} OTLP span records" if stats.span_records else ""
            say(
                f"published {stats.events} events{spans} in {stats.messages} messages "
                f"({stages['publish']:.2f}s)"
            )

            def watch(lag: Lag) -> None:
                for child in children:
                    child.check_alive()
                    for warning in child.new_warnings():  # e.g. another process's lock
                        say(f"{child.name}: {warning}")

            t0 = time.monotonic()
            lag = asyncio.run(
                wait_worker(s, timeout, on_poll=watch, end_of_input=stats.span_records > 0)
            )
            if not lag.drained:
                raise PipelineError(
                    f"the worker is still {lag.behind} messages behind after {timeout:.0f}s; "
                    f"its log ends:\n{children[0].tail()}"
                )
            stages["worker"] = time.monotonic() - t0
            say(f"worker processed everything ({stages['worker']:.2f}s after publishing)")
            t0 = time.monotonic()
            lag = asyncio.run(wait_drained(s, s.sink_group, sink_inputs(s), timeout, on_poll=watch))
            if not lag.drained:
                raise PipelineError(
                    f"the sink is still {lag.behind} messages behind after {timeout:.0f}s; "
                    f"its log ends:\n{children[1].tail()}"
                )
            stages["sink"] = time.monotonic() - t0
            say(f"every event is in {s.duckdb_path}")
        finally:
            _stop_all(children)
    return RunResult(stats, s.duckdb_path, time.monotonic() - started, stages)


def _create_db(s: Settings) -> None:
    from memdiag.analytics.sink import DuckDBSink

    DuckDBSink(s.duckdb_path, storage_version=s.duckdb_storage_version).init()


def _stop_all(children: list[Child]) -> None:
    for child in reversed(children):  # the sink first: it flushes and commits on SIGTERM
        procs.stop(child.proc, timeout=15)
        child.log_file.close()


def summary(db_path: str) -> dict[str, Any]:
    """The figures ``run`` prints, read back from DuckDB (the status figures, flattened)."""
    from memdiag.analytics.db import connect
    from memdiag.analytics.status import status

    con = connect(db_path, read_only=True)
    try:
        st = status(con, top=0, runs=1_000)
        searches = con.execute("SELECT count(*) FROM searches").fetchone()
    finally:
        con.close()
    if searches is None:  # an aggregate always returns a row
        raise RuntimeError(f"unexpected empty aggregate from {db_path}")
    dead = {d["reason"]: d["dead_letters"] for d in st["dead_letters"]}
    return {
        "searches": searches[0],
        "agent_searches": st["followup"]["agent_searches"],
        "followups": st["followup"]["followups"],
        "followup_rate": st["followup"]["rate"],
        "dead_letters": sum(dead.values()),
        "dead_letters_by_reason": dead,
        "feedback": {"used": st["feedback"]["used"], "ignored": st["feedback"]["ignored"]},
        "sessions_by_outcome": st["sessions"],
        "failure_categories": {
            c["failure_category"]: c["sessions"] for c in st["failure_categories"]
        },
        "misleading_observations": st["misleading"]["count"],
        "memory_pipeline": st["pipeline"],
        "benchmark_runs": [  # oldest first: the first is the natural baseline
            {
                "run_id": r["run_id"],
                "judgements": r["judgements"],
                "accuracy": r["accuracy"],
                "reader_failures": r["reader_failures"],
                "retrieval_failures": r["retrieval_failures"],
            }
            for r in reversed(st["runs"])
        ],
    }
