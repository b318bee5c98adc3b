"""The ``memdiag`` command.

Results go to stdout (``--json`` for scripts); progress and notes go to stderr, so a script
can pipe the results and a person still sees what is happening.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
from typing import Any, NoReturn

from memdiag import __version__
from memdiag.cli.alerting import cmd_alert
from memdiag.cli.common import REPORT_EXTRA, err, whole_number
from memdiag.cli.pipeline import (
    cmd_demo,
    cmd_publish,
    cmd_report_html,
    cmd_run,
    cmd_sink,
    cmd_worker,
)
from memdiag.settings import ConfigError
from memdiag.views.questions import BY_COMMAND, Question

EPILOG = """\
Configuration comes from the environment (MEMDIAG_BROKER, MEMDIAG_TOPIC_PREFIX,
MEMDIAG_DUCKDB_PATH, AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS, ...; see the README).
Start here:  memdiag demo        then:  memdiag run --input events.jsonl --db my.duckdb
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memdiag",
        description=(
            "Streaming diagnostics for AI-agent memory: which searches were followups, "
            "which injected memories were used or ignored, why sessions failed, which "
            "memories mislead, and reader vs retrieval failures in benchmarks."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"memdiag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    parser.error = _json_error(parser, "gate")  # type: ignore[method-assign]

    def add(name: str, help: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help,
            description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    run = add(
        "run",
        "run the whole pipeline on one JSON Lines file, into DuckDB",
        "Start a broker (embedded Tansu unless MEMDIAG_BROKER is set), the worker and the "
        "sink; publish FILE; wait until every event is in DuckDB; stop everything; print a "
        "summary. Exits 0 when done.",
    )
    run.add_argument(
        "--input",
        required=True,
        metavar="FILE.jsonl",
        help="events, one a line (a line that is an OTLP/JSON TracesData, as the Collector's "
        "file exporter writes, goes to memdiag.otlp_spans)",
    )
    _common_run(run)
    run.set_defaults(func=cmd_run)

    demo = add(
        "demo",
        "run the pipeline on a bundled realistic sample and print the report",
        "Like `run`, on a bundled, deterministic sample of agent sessions (refinements, "
        "retries, viewer searches, empty results and a few bad lines).",
    )
    _common_run(demo)
    for action in demo._actions:  # its own default, not MEMDIAG_DUCKDB_PATH
        if action.dest == "db":
            action.help = (
                "DuckDB file (default memdiag-demo.duckdb, made again on each demo; a file "
                "you name is treated as by `run`)"
            )
    demo.add_argument(
        "--report", default="memdiag-demo.html", metavar="FILE", help="the HTML report's path"
    )
    demo.set_defaults(func=cmd_demo, db=None)

    worker = add(
        "worker",
        "run the stream worker (long-running) against MEMDIAG_BROKER",
        "The Faust worker: reads memdiag.events, memdiag.judgements, memdiag.memory and "
        "memdiag.otlp_spans, keeps per-session, per-observation, per-agent and per-trace "
        "state, derives the diagnostics and the weight updates. Stop it with Ctrl-C or "
        "SIGTERM: it commits what it processed, within MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS. "
        "Without the broker it commits nothing more, says so and exits with status 75: what "
        "it did not commit is processed again on the next start. A second signal stops it at "
        "once.",
    )
    worker.set_defaults(func=cmd_worker)

    sink = add(
        "sink",
        "run the DuckDB sink (long-running) against MEMDIAG_BROKER",
        "Consumes memdiag.diagnostics, memdiag.weights, memdiag.graph_weights and "
        "memdiag.deadletter in batches "
        "and upserts them into DuckDB. It holds the file only while it writes a batch, so "
        "analysts can open it read-only in between. Stop it with Ctrl-C or SIGTERM: it "
        "writes what it holds, then commits, within MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS. Without "
        "the broker it writes all the same but commits nothing more, says so and exits with "
        "status 75: those messages come again on the next start (upserts: each row once). A "
        "DuckDB file it cannot write (a full disk, a permission, a read-only or corrupt file) "
        "stops it with one line that says what and where, exit status 1; it commits nothing "
        "it did not write, so nothing is lost. A second signal stops it at once.",
    )
    sink.add_argument("--db", metavar="PATH", help="DuckDB file (default MEMDIAG_DUCKDB_PATH)")
    sink.set_defaults(func=cmd_sink)

    from memdiag.cli.broker import add_broker

    add_broker(add)

    from memdiag.cli.reset import add_reset

    add_reset(add)

    publish = add(
        "publish",
        "publish a JSON Lines file of events to MEMDIAG_BROKER, with progress",
        "Sends events to memdiag.events keyed by session_id, judgements to "
        "memdiag.judgements keyed by run_id and the recall pipeline's events to "
        "memdiag.memory keyed by agent_id, batching consecutive events of one key into one "
        "message; a line that is an OTLP/JSON TracesData goes whole to memdiag.otlp_spans. "
        "Lines that are not valid events are sent too: the worker dead-letters them with a "
        "reason. A line the broker refuses as too large for one message (message.max.bytes) "
        "goes to memdiag.deadletter in its place (too_large), and publishing goes on.",
    )
    publish.add_argument("file", metavar="FILE.jsonl")
    publish.add_argument(
        "--batch-size",
        type=whole_number(1),
        default=500,
        help="most events per message (default 500)",
    )
    publish.add_argument("--json", action="store_true", help="print the result as JSON")
    publish.add_argument("--quiet", action="store_true", help="no progress output")
    publish.set_defaults(func=cmd_publish)

    query = add(
        "query",
        "answer an analyst's question from DuckDB (see `memdiag query -h`)",
        "Read-only questions to the DuckDB file. Each prints a table, or JSON with --json.\n"
        "--since takes a date or date-time (2026-11-21, 2026-11-21T09:30:00Z, UTC if no\n"
        "offset) or a duration back from now (30m, 24h, 7d, 2w).",
    )
    questions = query.add_subparsers(dest="question", metavar="QUESTION", required=True)
    for q in BY_COMMAND.values():
        if q.command[0] == "query":
            _question(questions.add_parser(q.name, help=q.help, description=q.description), q)
    for name in ("explain", "explain-memory", "breaks", "calibrate"):
        q = BY_COMMAND[(name,)]
        _question(add(name, q.help, q.description), q)

    report = add(
        "report",
        "write a report from DuckDB (see `memdiag report -h`)",
        "Reports read from the DuckDB file.",
    )
    reports = report.add_subparsers(dest="report", metavar="REPORT", required=True)
    q = BY_COMMAND[("report", "scores")]
    _question(reports.add_parser("scores", help=q.help, description=q.description), q,
              "print the scores JSON to stdout")  # fmt: skip
    page = reports.add_parser(
        "html",
        help="a self-contained HTML page with the status figures as charts",
        description=(
            "One page, no scripts, no network: failed sessions by category, the followup rate "
            "over time, used/ignored per memory, misleading memories, and reader vs retrieval "
            "failures per benchmark run (charts inlined as SVG)."
        ),
    )
    page.add_argument("--out", default="report.html", metavar="FILE", help="default report.html")
    _db_and_json(page, "print the report's path as JSON")
    page.set_defaults(func=cmd_report_html)

    for name in ("runs", "doctor", "compare", "gate", "status"):
        q = BY_COMMAND[(name,)]
        p = add(name, q.help, q.description)
        _question(p, q, "print one JSON object with the status, verdict and reason, on every "
                  "exit" if name == "gate" else None)  # fmt: skip
        if name == "gate":
            p.error = _json_error(p)  # type: ignore[method-assign]

    from memdiag.cli.serve import add_serve

    add_serve(add)

    alert = add(
        "alert",
        "watch the counter topic and say when alert rules fire and resolve",
        "Reads the per-minute rollups on memdiag.counters (MEMDIAG_BROKER) and prints, or\n"
        "POSTs as JSON to --webhook, each time a rule starts or stops holding.\n\n"
        "A rule:  EXPR OP NUMBER [for DURATION]   (the window, 5m by default, in event time)\n"
        "  EXPR:  followup_rate | ignored_share | reader_failures | retrieval_failures |\n"
        "         misleading | dead_letters | pipeline_coverage | recall_probe_miss |\n"
        "         count(S) | rate(S) | ratio(S1, S2), these three optionally 'by ATTR[,ATTR]'\n"
        "         (evaluated, fired and resolved apart for each value of ATTR)\n"
        "  S:     a counter, e.g. memdiag.dead_letter_total{reason=not_json}, or S - S2\n"
        "         (ignored_share is net of retrieval_feedback_retracted_total)\n"
        "e.g.     memdiag alert --rule 'followup_rate > 0.3 for 5m'\n"
        "pipeline_coverage alone means 'pipeline_coverage > 0': some agent's\n"
        "memdiag.unindexed_memory_total grew within the window (a memory missed its index\n"
        "deadline); it resolves after a window with none.\n"
        "recall_probe_miss is per agent: the share of the agent's recall probes in the\n"
        "window that missed, e.g. 'recall_probe_miss > 0.5 for 1h' fires for each agent\n"
        "whose probes mostly miss (an indexer storing garbage keeps coverage at 100%) and\n"
        "resolves when its probes hit again (or a window passes with none).\n"
        "A rules file has one rule a line, optionally named (NAME: RULE); # comments.\n"
        "Windows move with event time only: while no counter message comes (no traffic, or\n"
        "the worker is down), a firing alert stays firing and none resolves. Watch the\n"
        "worker itself apart (its process, or the freshness memdiag status shows).\n"
        "What fires is kept in memory: a restarted alert never resolves what the one\n"
        "before it fired, and fires again what still holds.",
    )
    alert.add_argument("--rule", action="append", metavar="RULE", help="a rule (repeatable)")
    alert.add_argument("--rules", metavar="FILE", help="a file of rules")
    alert.add_argument("--webhook", metavar="URL", help="POST each alert as JSON here")
    alert.add_argument(
        "--from-beginning",
        action="store_true",
        help="read the topic from its start (default: from now on)",
    )
    alert.add_argument(
        "--stop-after-idle",
        type=float,
        metavar="SECONDS",
        help="exit once no counter message came for this long (default: run until stopped)",
    )
    alert.add_argument("--json", action="store_true", help="print alerts as JSON lines")
    alert.add_argument("--quiet", action="store_true", help="no progress output")
    alert.set_defaults(func=cmd_alert)

    return parser


def _question(p: argparse.ArgumentParser, q: Question, json_help: str | None = None) -> None:
    """A question's command: its arguments (declared once, in memdiag.views.questions), --db
    and --json, answered by the one runner (imported when a question is asked: it loads
    DuckDB, which the worker's process never needs)."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    q.add_to(p)
    _db_and_json(p, json_help or "print the answer as JSON")
    p.set_defaults(func=lambda args: _answer(q, args))
    if q.name != "gate":  # the gate's errors are verdicts (its own shape)
        p.error = _json_usage(p)  # type: ignore[method-assign]


def _answer(q: Question, args: argparse.Namespace) -> int:
    from memdiag.cli.answer import answer

    return answer(q, args)


def _db_and_json(p: argparse.ArgumentParser, json_help: str) -> None:
    """The two options of every command that reads DuckDB and prints results."""
    p.add_argument("--db", metavar="PATH", help="DuckDB file (default MEMDIAG_DUCKDB_PATH)")
    p.add_argument("--json", action="store_true", help=json_help)


_ARGV: list[str] | None = None  # main's argv, for usage errors under --json


def _json_error(p: argparse.ArgumentParser, command: str | None = None) -> Any:
    """A usage error of a command whose every exit is one JSON object under --json (the
    top-level parser reports unknown arguments: ``command`` names the one it answers for)."""
    usage_error = p.error

    def error(message: str) -> NoReturn:
        argv = _ARGV if _ARGV is not None else sys.argv[1:]
        words = [a for a in argv if not a.startswith("-")]
        if "--json" in argv and (command is None or words[:1] == [command]):
            sys.stdout.write(
                json.dumps({"status": 2, "verdict": "error", "reason": f"error: {message}"}) + "\n"
            )
            p.exit(2)
        usage_error(message)

    return error


def _json_usage(p: argparse.ArgumentParser) -> Any:
    """A question's usage error: under --json, one JSON object on stdout as its other errors
    are (``{"status": 2, "error": "usage", "message": ...}``), exit 2."""
    usage_error = p.error

    def error(message: str) -> NoReturn:
        argv = _ARGV if _ARGV is not None else sys.argv[1:]
        if "--json" in argv:
            sys.stdout.write(json.dumps({"status": 2, "error": "usage", "message": message}) + "\n")
            p.exit(2)
        usage_error(message)

    return error


def _common_run(p: argparse.ArgumentParser) -> None:
    _db_and_json(p, "print the summary as JSON")
    existing = p.add_mutually_exclusive_group()
    existing.add_argument(
        "--replace",
        dest="existing",
        action="store_const",
        const="replace",
        help="remove --db first if it exists (a run on the embedded broker starts with no "
        "state, so it refuses a file that already holds rows)",
    )
    existing.add_argument(
        "--append",
        dest="existing",
        action="store_const",
        const="append",
        help="add to a --db that already holds rows: for data that shares no session, "
        "memory or run with it (the run's state starts empty)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="give up if a stage has not caught up after this many seconds (default 600)",
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops `run` in order, like Ctrl-C


def _stdout_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (``| head``): the one broken
    pipe that is no error (another, a socket's, is)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError):  # no stdout, or not a file descriptor
        return False


def main(argv: list[str] | None = None) -> int:
    global _ARGV
    _ARGV = argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("run", "demo", "publish", "alert"):
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        return _failed(args, 2, "configuration", str(exc), "configuration error:")
    except KeyboardInterrupt:
        err.print("interrupted")
        _say_json(args, 130, "interrupted", "interrupted")
        return 130
    except ModuleNotFoundError as exc:
        if exc.name not in REPORT_EXTRA:
            raise
        return _failed(args, 1, "missing_extra", f"this command needs {exc.name}, which the "
                       "worker's install leaves out: pip install 'memdiag[report]'")  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a user-facing command: say what, not a traceback
        from memdiag.broker import BrokerError
        from memdiag.kafka import KafkaUnavailable
        from memdiag.runner import PipelineError

        if isinstance(exc, BrokenPipeError) and _stdout_gone():
            # `| head` closed the pipe: what it wanted is out (and the exit's flush of
            # stdout must not fail again)
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
            return 0
        if isinstance(exc, ConnectionError):  # a socket the peer closed (a broker, a client)
            return _failed(args, 1, "connection", str(exc))
        if isinstance(exc, BrokerError | KafkaUnavailable):
            return _failed(args, 1, "broker", str(exc))
        if isinstance(exc, PipelineError):  # a stage behind, a --db that holds rows, ...
            return _failed(args, 1, "pipeline", str(exc))
        if type(exc).__name__ in ("DatabaseError", "IOException"):
            return _failed(args, 1, "database", str(exc))
        if isinstance(exc, OSError) and exc.filename is not None:  # a path the user gave
            why = exc.strerror or str(exc)
            return _failed(args, 1, "path", f"{exc.filename}: {why}")
        raise


def _failed(args: argparse.Namespace, status: int, kind: str, message: str,
            label: str = "error:") -> int:  # fmt: skip
    """Say a failure in one line on stderr, and, under --json, as one JSON object on stdout
    (``{"status", "error", "message"}``, as a question's usage error): a script reading
    stdout gets an answer on every exit."""
    from rich.markup import escape

    err.print(f"[red]{label}[/red] {escape(message)}", soft_wrap=True)
    _say_json(args, status, kind, message)
    return status


def _say_json(args: argparse.Namespace, status: int, kind: str, message: str) -> None:
    if getattr(args, "json", False):
        try:
            said = {"status": status, "error": kind, "message": message}
            sys.stdout.write(json.dumps(said) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):  # stdout itself is gone: stderr said it
            pass
