"""The ``memdiag`` command.

Results go to stdout (``--json`` for scripts); progress and notes go to stderr, so a script
can pipe the results and a person still sees what is happening.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any, NoReturn

from memdiag import __version__
from memdiag.cli.alerting import cmd_alert
from memdiag.cli.analyst import (
    cmd_compare,
    cmd_doctor,
    cmd_gate,
    cmd_query,
    cmd_report_html,
    cmd_report_scores,
    cmd_runs,
)
from memdiag.cli.calibrate import cmd_calibrate, non_negative, parse_windows, positive
from memdiag.cli.common import REPORT_EXTRA, err
from memdiag.cli.explain import cmd_explain
from memdiag.cli.memory import cmd_breaks, cmd_explain_memory
from memdiag.cli.pipeline import cmd_demo, cmd_publish, cmd_run, cmd_sink, cmd_status, cmd_worker
from memdiag.settings import ConfigError

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
        "SIGTERM.",
    )
    worker.set_defaults(func=cmd_worker)

    sink = add(
        "sink",
        "run the DuckDB sink (long-running) against MEMDIAG_BROKER",
        "Consumes memdiag.diagnostics, memdiag.weights, memdiag.graph_weights and "
        "memdiag.deadletter in batches "
        "and upserts them into DuckDB. It holds the file only while it writes a batch, so "
        "analysts can open it read-only in between.",
    )
    sink.add_argument("--db", metavar="PATH", help="DuckDB file (default MEMDIAG_DUCKDB_PATH)")
    sink.set_defaults(func=cmd_sink)

    publish = add(
        "publish",
        "publish a JSON Lines file of events to MEMDIAG_BROKER, with progress",
        "Sends events to memdiag.events keyed by session_id, judgements to "
        "memdiag.judgements keyed by run_id and the recall pipeline's events to "
        "memdiag.memory keyed by agent_id, batching consecutive events of one key into one "
        "message; a line that is an OTLP/JSON TracesData goes whole to memdiag.otlp_spans. "
        "Lines that are not valid events are sent too: the worker dead-letters them with a "
        "reason.",
    )
    publish.add_argument("file", metavar="FILE.jsonl")
    publish.add_argument(
        "--batch-size", type=int, default=500, help="most events per message (default 500)"
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

    def question(name: str, help: str) -> argparse.ArgumentParser:
        q = questions.add_parser(name, help=help, description=help)
        _db_and_json(q, "print the result as JSON")
        q.set_defaults(func=cmd_query)
        return q

    q = question(
        "failure-distribution",
        "failed sessions per failure category, all seven listed (zeros included)",
    )
    q.add_argument("--org", help="only this org_id")
    q.add_argument("--project", help="only this project_id")
    q.add_argument("--since", help="only outcomes at or after this time")
    q = question(
        "misleading",
        "observations seen in >= 3 failed sessions and in no accepted one, most failures first",
    )
    q.add_argument("--org", help="only sessions of this org_id")
    q.add_argument("--since", help="only sessions whose outcome is at or after this time")
    q.add_argument("--limit", type=int, default=100, help="most rows (default 100)")
    q.add_argument(
        "--graph",
        action="store_true",
        help="the knowledge graph's misleading entities and edges (SOURCE|TARGET|RELATIONSHIP) "
        "instead of observations",
    )
    q = question(
        "unused-memories",
        "dead weight: memories judged in at least N turns and used in none, with their "
        "strength and last injection (what a consolidation job would prune or demote)",
    )
    q.add_argument("--min-injections", type=int, default=5, metavar="N",
                   help="judged (session, turn) pairs at least (default 5)")  # fmt: skip
    q.add_argument("--since", help="only turns at or after this time")
    q.add_argument("--limit", type=int, default=100, help="most rows (default 100)")
    q = question(
        "observation-stats",
        "how often one observation was used and ignored, its weight and its strength",
    )
    q.add_argument("observation_id", metavar="OBS_ID")
    q = question("observation-history", "one observation's verdicts, most recent first")
    q.add_argument("observation_id", metavar="OBS_ID")
    q.add_argument("--limit", type=int, default=100, help="most rows (default 100)")
    q = question(
        "pipeline-health",
        "per agent: memories written, indexed, pending, unindexed; pipeline coverage, semantic "
        "recall rate, ambient trigger rate; broken agents first",
    )
    q.add_argument("--agent", metavar="AGENT_ID", help="only this agent_id")
    q = question(
        "recall-trend",
        "per agent: semantic recall rate (SRR) and ambient trigger rate (ATR) by day (hour, "
        "week) or by memory-count bucket: does recall decay over time, or as memory grows",
    )
    q.add_argument("--agent", metavar="AGENT_ID", help="only this agent_id")
    q.add_argument("--by", choices=("day", "hour", "week", "memory-count"), default="day",
                   help="UTC days (default), hours or weeks, or the agent's memory count at "
                   "each probe (1, 2, 3-4, 5-8, ...)")  # fmt: skip
    explain = add(
        "explain",
        "one session's story: searches, turns, outcome, misleading memories",
        "Everything DuckDB knows of one session, in event time: each search with its\n"
        "followup verdict and why (its predecessor and the gap), each evaluated turn with\n"
        "every injected memory used or ignored (match ratio, matched keywords), the outcome\n"
        "with its failure category and the rule that fired, and the weight step the session\n"
        "gave each memory, the misleading ones first. Says 'never searched' when the agent\n"
        "did not ask its memory. An unknown id lists sessions that exist.",
    )
    explain.add_argument("session_id", metavar="SESSION_ID")
    _db_and_json(explain, "print the explanation as JSON")
    explain.add_argument(
        "--html", metavar="FILE", help="also write it as a self-contained HTML page"
    )
    explain.set_defaults(func=cmd_explain)

    em = add(
        "explain-memory",
        "one memory's recall story: written, indexed, reachable, its probes and what outranked it",
        "Everything DuckDB knows of one memory of one agent (memory ids are an agent's own):\n"
        "when it was written and indexed, its status and name key, whether a path reaches it\n"
        "(indexed, or in the agent's latest ambient context) or none does (unreachable), how\n"
        "many of the agent's memories share its name key, and its probes, the latest first,\n"
        "each with why it missed (not_indexed, below_threshold, aliased, outranked) and the\n"
        "first k results that came back instead, the look-alikes marked. The latest miss says\n"
        "where to look: the indexer, the threshold, the names, the ranking. An unknown id\n"
        "lists the agent's memories whose latest probe missed.\n"
        "e.g.     memdiag explain-memory ep-proving-medqa-004 --agent proving-medqa",
    )
    em.add_argument("memory_id", metavar="MEMORY_ID")
    em.add_argument("--agent", required=True, metavar="AGENT_ID", help="the agent it belongs to")
    em.add_argument("--limit", type=positive, default=20, help="most probes shown (default 20)")
    _db_and_json(em, "print the explanation as JSON")
    em.set_defaults(func=cmd_explain_memory)

    brk = add(
        "breaks",
        "do sessions fail more while their agent's memory pipeline is down?",
        "Joins each session's outcome, by its agent and event time, to the spans in which\n"
        "that agent's memory pipeline was down (no memory indexed within\n"
        "MEMDIAG_INDEX_DEADLINE_SECONDS of a write, until the next index: the view\n"
        "pipeline_break_spans), and compares the failure rate (rejected or rework) of the\n"
        "sessions during breaks with that of the sessions while healthy, for all agents and\n"
        "per agent: both rates, the difference in points with a 95% bootstrap interval (each\n"
        "side resampled apart, seeded; Newcombe's score interval when a side is at 0% or\n"
        "100%), and the ratio in --json. Sessions without an agent_id, or\n"
        "of agents that sent no memory events, are counted apart. A side with fewer than 20\n"
        "sessions is marked too few. Correlation, not cause: a break often comes with other\n"
        "trouble.",
    )
    _db_and_json(brk, "print the comparison as JSON")
    brk.add_argument("--resamples", type=non_negative, default=10_000,
                     help="bootstrap resamples (default 10000; 0: no intervals)")  # fmt: skip
    brk.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    brk.set_defaults(func=cmd_breaks)

    cal = add(
        "calibrate",
        "how well followups, ignored memories and 'never searched' predict failed sessions",
        "Measures the live proxies against session outcomes, per session: precision, recall\n"
        "and lift of '>= 1 followup', '>= 1 ignored memory' and 'never searched' as\n"
        "predictors of a failed session, and the ROC AUC of the followup rate (over the\n"
        "sessions that searched), each with a seeded bootstrap interval over sessions; then\n"
        "the same for several followup windows, recomputed from the stored verdicts, with\n"
        "the share of resamples in which each window predicts best. Correlation only: see\n"
        "the README's 'Calibrating the proxies' for how to read it.",
    )
    cal.add_argument(
        "--windows",
        type=parse_windows,
        default=(10.0, 30.0, 60.0, 120.0),
        metavar="S,S,...",
        help="followup windows to compare, in seconds (default 10,30,60,120; the stream's "
        "AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS is always added)",
    )
    cal.add_argument("--org", help="only sessions of this org_id")
    cal.add_argument("--project", help="only sessions of this project_id")
    cal.add_argument("--since", help="only sessions whose outcome is at or after this time")
    cal.add_argument(
        "--resamples",
        type=non_negative,
        default=2000,
        help="bootstrap resamples (default 2000; 0: no intervals)",
    )
    cal.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    cal.add_argument(
        "--by",
        choices=("session", "agent"),
        default="session",
        help="what the bootstrap resamples: sessions (default), or whole agents with all "
        "their sessions (sessions of one agent are not independent)",
    )
    _db_and_json(cal, "print the calibration as JSON")
    cal.set_defaults(func=cmd_calibrate)

    report = add(
        "report",
        "write a report from DuckDB (see `memdiag report -h`)",
        "Reports read from the DuckDB file.",
    )
    reports = report.add_subparsers(dest="report", metavar="REPORT", required=True)
    scores = reports.add_parser(
        "scores",
        help="one benchmark run's scores.json: accuracy, reader vs retrieval failures",
        description=(
            "Per condition of the run: questions, correct, accuracy, and the wrong answers "
            "split into reader failures (the gold evidence was in the context), retrieval "
            "failures (it was not) and unattributed (no gold evidence). Repeats of a question "
            "are folded (each weighs 1/n) and their spread shown. Each metric (accuracy, "
            "recall_at_1/5/10 and mrr of the gold evidence in the ranked context, the graded "
            "score, latency_ms, tokens, input_tokens, output_tokens) with its mean, a 95% "
            "bootstrap interval over questions and its stdev across repeats; with several "
            "conditions, each paired against the baseline condition. The file's JSON Schema "
            "is schemas/scores.schema.json."
        ),
    )
    scores.add_argument("--run-id", required=True, metavar="RUN", help="the benchmark run")
    scores.add_argument("--out", metavar="FILE", help="write scores.json here")
    scores.add_argument("--baseline-condition", metavar="C",
                        help="pair every other condition against this one (default: the "
                        "condition named 'baseline', if the run has it)")  # fmt: skip
    _db_and_json(scores, "print the scores JSON to stdout")
    scores.set_defaults(func=cmd_report_scores)
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

    runs_p = add(
        "runs",
        "list benchmark runs with their provenance: what makes two of them comparable",
        "Each run in DuckDB, newest first: its judged answers (the one that counts per\n"
        "question, condition and repeat), questions, conditions, repeats, re-judged answers,\n"
        "accuracy, mean graded score, time span, and its provenance (run group, suite id,\n"
        "version and checksum, fixture checksum, config fingerprint, git head, service\n"
        "version). A field a run's judgements disagree on lists every value: the run mixes them.",
    )
    runs_p.add_argument("--limit", type=int, default=50, help="most runs (default 50)")
    _db_and_json(runs_p, "print the runs as JSON")
    runs_p.set_defaults(func=cmd_runs)

    doctor_p = add(
        "doctor",
        "before comparing runs: what would make the comparison weak",
        "Checks one run (or a baseline and a candidate) in DuckDB: too few questions, "
        "judgements\nwithout gold evidence, unattributed answers, repeats that disagree, a "
        "run that mixes\nsuites or configurations, re-judged answers, and for two runs: "
        "questions one side\nlacks, suite checksums that differ (they cannot be compared), "
        "an identical config\nfingerprint. Exit 0 when nothing weakens the comparison, 1 "
        "when something does, 2 on\nan error (or no data).",
    )
    doctor_p.add_argument("--run", metavar="RUN", help="one run to check (or --baseline)")
    _two_runs(doctor_p, required=False)
    doctor_p.add_argument("--min-questions", type=int, default=30, metavar="N",
                          help="fewer distinct questions are too few (default 30)")  # fmt: skip
    _db_and_json(doctor_p, "print the findings as JSON")
    doctor_p.set_defaults(func=cmd_doctor)

    compare = add(
        "compare",
        "compare two benchmark runs question by question: is the candidate better?",
        "Pairs the judgements of two runs by (question_id, repeat_index) and reports both\n"
        "accuracies and the delta, the exact McNemar p-value of the discordant pairs, a\n"
        "paired bootstrap confidence interval of the delta (resampling questions with their\n"
        "repeats; seeded), where the answers moved between correct, reader failure and\n"
        "retrieval failure, latency and token deltas, and every unpaired question.\n"
        "Two conditions of one run compare with --baseline-condition/--candidate-condition.",
    )
    _two_runs(compare, required=True)
    compare.add_argument(
        "--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)"
    )
    compare.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    _db_and_json(compare, "print the comparison as JSON")
    compare.set_defaults(func=cmd_compare)

    gate = add(
        "gate",
        "a release verdict: did the candidate regress beyond a policy? (exit 0/1/2)",
        "Pairs the judgements of two runs by (question_id, repeat_index), as compare does, and\n"
        "judges each metric of the policy on the 95% paired bootstrap interval of candidate -\n"
        "baseline (10,000 resamples over questions, seed 0), not on the point estimate:\n"
        "accuracy, recall_at_1/5/10, mrr and score regress when the lower bound is below\n"
        "-max_regression; latency_ms, tokens, input_tokens and output_tokens when the upper\n"
        "bound is above +max_regression.\n\n"
        "Exit 0: no regression beyond the policy. Exit 1: a judged regression, and only that\n"
        "(unlike other commands, where 1 is an error). Exit 2: anything else: cannot judge\n"
        "(too few paired questions or repeats, a different suite_checksum, a metric no pair\n"
        "carries, no data) or an error (usage, bad policy, unreadable database). Each exit\n"
        "ends with a one-line reason. A metric that regressed while another could not be\n"
        'judged is 2 as well (the policy was not judged whole): treat 2 as "not released"\n'
        "and read the reason; never retry it blindly.\n\n"
        "The policy (TOML):\n\n"
        "    [sample]\n"
        "    min_questions = 30          # distinct paired question_ids, required\n"
        "    min_repeats = 3             # paired repeats of every question, optional\n"
        "    [metrics.accuracy]\n"
        "    max_regression = 0.02       # fractions 0-1; latency_ms in ms; tokens in tokens\n"
        "    [provenance]\n"
        '    same_config = "note"        # or "refuse": both runs with one config_fingerprint',
    )
    _two_runs(gate, required=False)  # checked by the command: --explain needs neither
    gate.add_argument("--policy", metavar="FILE", help="the policy, TOML (required)")
    gate.add_argument("--markdown", metavar="FILE",
                      help="also write a Markdown summary a CI job can post as-is")  # fmt: skip
    gate.add_argument("--explain", action="store_true",
                      help="print the policy in words and exit (needs only --policy)")  # fmt: skip
    _db_and_json(gate, "print one JSON object with the status, verdict and reason, on every exit")
    gate.error = _json_error(gate)  # type: ignore[method-assign]
    gate.set_defaults(func=cmd_gate)

    status_p = add(
        "status",
        "one screen: followups, used/ignored, failures, misleading memories, runs, dead letters",
        "How memory is doing, read from DuckDB: the followup rate (with its caveat), the share\n"
        "of injected memories used, failed sessions by category, the misleading memories,\n"
        "reader vs retrieval failures of the recent benchmark runs, dead letters by reason,\n"
        "and how fresh the data is (the newest event time in DuckDB).",
    )
    _db_and_json(status_p, "print the figures as JSON")
    status_p.add_argument(
        "--top", type=int, default=5, help="misleading memories shown (default 5)"
    )
    status_p.add_argument("--runs", type=int, default=5, help="benchmark runs shown (default 5)")
    status_p.add_argument(
        "--recall-window", default="24h", metavar="DURATION",
        help="flag an agent whose semantic recall rate (SRR) in this window up to its newest "
        "memory event fell from the window before (default 24h; 30m, 6h, 7d)",
    )  # fmt: skip
    status_p.add_argument(
        "--recall-drop", type=float, default=20.0, metavar="POINTS",
        help="by more than this many percentage points, absolute (default 20), and by at "
        "least 2 standard errors",
    )  # fmt: skip
    status_p.add_argument(
        "--recall-min-probed", type=int, default=10, metavar="N",
        help="only when each window has at least N probed memories (default 10)",
    )  # fmt: skip
    status_p.set_defaults(func=cmd_status)

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
        "A rules file has one rule a line, optionally named (NAME: RULE); # comments.",
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


def _two_runs(p: argparse.ArgumentParser, required: bool) -> None:
    """The two sides of a comparison (doctor, compare, gate), each a run or one condition."""
    p.add_argument("--baseline", required=required, metavar="RUN_A", help="the run to beat")
    p.add_argument("--candidate", required=required, metavar="RUN_B", help="the run to judge")
    p.add_argument("--baseline-condition", metavar="C", help="only this condition of RUN_A")
    p.add_argument("--candidate-condition", metavar="C", help="only this condition of RUN_B")


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


def _common_run(p: argparse.ArgumentParser) -> None:
    _db_and_json(p, "print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="give up if a stage has not caught up after this many seconds (default 600)",
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM stops `run` in order, like Ctrl-C


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
        err.print(f"[red]configuration error:[/red] {exc}")
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except ModuleNotFoundError as exc:
        if exc.name not in REPORT_EXTRA:
            raise
        err.print(
            f"[red]error:[/red] this command needs {exc.name}, which the worker's install "
            "leaves out: pip install 'memdiag\\[report]'"  # \[: not Rich markup
        )
        return 1
    except Exception as exc:  # noqa: BLE001 - a user-facing command: say what, not a traceback
        from memdiag.broker import BrokerError
        from memdiag.kafka import KafkaUnavailable
        from memdiag.runner import PipelineError

        failed = BrokerError | PipelineError | KafkaUnavailable
        if isinstance(exc, failed) or type(exc).__name__ == "DatabaseError":
            from rich.markup import escape

            err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)  # one line
            return 1
        raise
