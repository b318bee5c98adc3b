"""The ``memdiag`` command.

Results go to stdout (``--json`` for scripts); progress and notes go to stderr, so a script
can pipe the results and a person still sees what is happening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from memdiag import __version__
from memdiag.settings import ConfigError, Settings

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

EPILOG = """\
Configuration comes from the environment (MEMDIAG_BROKER, MEMDIAG_TOPIC_PREFIX,
MEMDIAG_DUCKDB_PATH, AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS, ...; see the README).
Start here:  memdiag demo        then:  memdiag run --input events.jsonl --db my.duckdb
"""


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "db", None):
        overrides["duckdb_path"] = args.db
    return Settings.from_env(**overrides)


def _say(args: argparse.Namespace) -> Any:
    def say(text: str) -> None:
        if not getattr(args, "quiet", False):
            err.print(f"[dim]·[/dim] {text}")

    return say


class _FileProgress:
    """A progress bar over a file's bytes on stderr; silent with --quiet or off a terminal."""

    def __init__(self, args: argparse.Namespace, label: str):
        self._bar: Progress | None = None
        if not getattr(args, "quiet", False) and err.is_terminal:
            self._bar = Progress(
                TextColumn(f"[bold]{label}[/bold]"),
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task("", total=total)
        self._bar.update(self._task, completed=done)

    def __enter__(self) -> _FileProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def _json_default(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.astimezone(UTC).isoformat()
    return str(v)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=_json_default) + "\n")


# -- run / demo ------------------------------------------------------------------------


def _run_pipeline(args: argparse.Namespace) -> Any:
    from memdiag.runner import run_pipeline

    with _FileProgress(args, "publishing") as progress:
        return run_pipeline(Path(args.input), _settings(args), _say(args), progress, args.timeout)


def cmd_run(args: argparse.Namespace) -> int:
    from memdiag.runner import summary

    result = _run_pipeline(args)
    figures = summary(result.db_path)
    report = {
        "input": str(args.input),
        "db": result.db_path,
        "events": result.publish.events,
        "messages": result.publish.messages,
        "seconds": round(result.seconds, 2),
        "stage_seconds": {k: round(v, 2) for k, v in result.stage_seconds.items()},
        **figures,
    }
    if args.json:
        _print_json(report)
    else:
        _print_run_report(report)
    return 0


def _print_run_report(r: dict[str, Any]) -> None:
    table = Table(title=f"memdiag run — {r['input']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    rate = r["followup_rate"]
    table.add_row("events", f"{r['events']:,}")
    table.add_row("searches", f"{r['searches']:,}")
    table.add_row("agent searches", f"{r['agent_searches']:,}")
    table.add_row("followups", f"{r['followups']:,}")
    table.add_row("followup rate", "n/a" if rate is None else f"{rate:.1%}")
    fb = r["feedback"]
    judged = fb["used"] + fb["ignored"]
    table.add_row(
        "injected memories used",
        f"{fb['used']:,} of {judged:,} ({fb['used'] / judged:.0%})" if judged else "n/a",
    )
    outcomes = r["sessions_by_outcome"]
    if outcomes:
        table.add_row(
            "sessions",
            ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1])),
        )
        top = [(k, v) for k, v in r["failure_categories"].items() if v]
        top.sort(key=lambda kv: -kv[1])
        if top:
            table.add_row("failures by category", ", ".join(f"{k} {v}" for k, v in top))
        table.add_row("misleading memories", f"{r['misleading_observations']:,}")
    for run in r["benchmark_runs"]:
        table.add_row(
            f"run {run['run_id']}",
            f"accuracy {run['accuracy']:.1%} of {run['judgements']:,}; reader failures "
            f"{run['reader_failures']}, retrieval failures {run['retrieval_failures']}",
        )
    dead = ", ".join(f"{k} {v}" for k, v in r["dead_letters_by_reason"].items())
    table.add_row("dead letters", f"{r['dead_letters']:,}" + (f"  ({dead})" if dead else ""))
    table.add_row("time", f"{r['seconds']:.1f}s")
    out.print(table)
    out.print(
        "[dim]followup rate: a live proxy for 'the first results did not satisfy'; it also "
        "counts genuine query refinement.[/dim]"
    )
    out.print(f'[dim]query it: duckdb -readonly {r["db"]} "SELECT * FROM followup_rate"[/dim]')  # noqa: S608 - a hint printed for the user, not executed
    runs = [run["run_id"] for run in r["benchmark_runs"]]
    if len(runs) >= 2:
        out.print(
            f"[dim]compare runs: memdiag compare --baseline {runs[0]} --candidate {runs[1]} "
            f"--db {r['db']}[/dim]"
        )


def sample_path() -> Path:
    return Path(str(resources.files("memdiag").joinpath("data", "sample.jsonl")))


def cmd_demo(args: argparse.Namespace) -> int:
    """`run` on the bundled sample, then the status screen and the HTML report."""
    from analytics.db import connect
    from analytics.status import status

    args.input = str(sample_path())
    if not args.db:
        args.db = "memdiag-demo.duckdb"
    _say(args)(f"demo: the bundled sample ({args.input}) into {args.db}")
    if args.json:
        return cmd_run(args)
    result = _run_pipeline(args)
    con = connect(result.db_path, read_only=True)
    try:
        figures = status(con)
    finally:
        con.close()
    out.print(
        f"[bold]{result.publish.events:,} events[/bold] through broker, worker and sink into "
        f"{result.db_path} in {result.seconds:.1f}s"
    )
    print_status(figures, result.db_path)
    report = write_html_report(result.db_path, Path(args.report))
    out.print(f"\n[bold]report:[/bold] {report}")
    out.print(
        f"[dim]next: memdiag query misleading --db {args.db} · memdiag compare --baseline "
        f"longmem-baseline --candidate longmem-rerank --db {args.db} · memdiag report scores "
        f"--run-id longmem-rerank --db {args.db}[/dim]"
    )
    return 0


# -- long-running processes ------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    from streams.worker import main

    main(_settings(args))
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from analytics.main import main

    main(_settings(args))
    return 0


# -- publish ---------------------------------------------------------------------------


def cmd_publish(args: argparse.Namespace) -> int:
    from memdiag.kafka import ensure_topics
    from memdiag.publish import publish_file

    settings = _settings(args)
    path = Path(args.file)
    if not path.is_file():
        err.print(f"[red]error:[/red] no such file: {path}")
        return 2

    async def go(progress: _FileProgress) -> Any:
        await ensure_topics(settings)
        return await publish_file(path, settings, batch_size=args.batch_size, progress=progress)

    with _FileProgress(args, f"publishing {path.name}") as progress:
        stats = asyncio.run(go(progress))
    result = {
        "file": str(path),
        "broker": settings.broker,
        "lines": stats.lines,
        "events": stats.events,
        "messages": stats.messages,
        "unkeyed_lines": stats.unkeyed_lines,
        "bytes": stats.bytes,
    }
    if args.json:
        _print_json(result)
    else:
        out.print(
            f"published {stats.events:,} events from {path} in {stats.messages:,} messages "
            f"to {settings.broker}"
            + (
                f" ({stats.unkeyed_lines} without a session key, sent for the worker to judge)"
                if stats.unkeyed_lines
                else ""
            )
        )
    return 0


# -- query -----------------------------------------------------------------------------


def _open_db(args: argparse.Namespace) -> Any:
    from analytics.db import connect

    return connect(_settings(args).duckdb_path, read_only=True)


_HEADERS = {
    "ts": "time (UTC)",
    "match_ratio": "ratio",
    "matched_count": "matched",
    "keyword_count": "keywords",
}


def _table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> Table:
    table = Table(title=title, title_justify="left")
    for c in columns:
        numeric = bool(rows) and _numeric(rows[0].get(c))
        table.add_column(_HEADERS.get(c, c), justify="right" if numeric else "left", no_wrap=True)
    for r in rows:
        table.add_row(*(_cell(r.get(c)) for c in columns))
    return table


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _filters(args: argparse.Namespace) -> str:
    parts = [
        f"{k}={v}"
        for k, v in (
            ("org", args.org),
            ("project", getattr(args, "project", None)),
            ("since", args.since),
        )
        if v
    ]
    return f" ({', '.join(parts)})" if parts else ""


def cmd_query(args: argparse.Namespace) -> int:
    from analytics import queries

    since = None
    if getattr(args, "since", None):
        try:
            since = queries.parse_since(args.since)
        except ValueError as exc:
            err.print(f"[red]error:[/red] {exc}")
            return 2
    con = _open_db(args)
    try:
        if args.question == "observation-stats":
            result: Any = queries.observation_stats(con, args.observation_id)
        elif args.question == "observation-history":
            result = queries.observation_history(con, args.observation_id, args.limit)
        elif args.question == "failure-distribution":
            result = queries.failure_distribution(con, args.org, args.project, since)
        else:
            result = queries.misleading(con, args.org, since, args.limit)
    finally:
        con.close()
    if args.json:
        _print_json(result)
        return 0
    if args.question == "observation-stats":
        _print_observation_stats(result)
    elif args.question == "observation-history":
        if not result:
            err.print(f"no verdicts recorded for observation {args.observation_id}")
        else:
            out.print(
                _table(
                    f"{args.observation_id}: most recent {len(result)} verdicts",
                    result,
                    [
                        "ts",
                        "session_id",
                        "turn_id",
                        "signal",
                        "match_ratio",
                        "matched_count",
                        "keyword_count",
                    ],
                )
            )
    elif args.question == "failure-distribution":
        total = sum(r["sessions"] for r in result)
        for r in result:
            r["share"] = f"{r['sessions'] / total:.1%}" if total else "—"
        out.print(
            _table(
                f"failed sessions by category{_filters(args)}: {total:,}",
                result,
                ["failure_category", "sessions", "share"],
            )
        )
    else:
        if not result:
            out.print(f"no misleading observations{_filters(args)}")
        else:
            out.print(
                _table(
                    f"misleading observations{_filters(args)}: "
                    "in >= 3 failed sessions, no accepted one",
                    result,
                    ["observation_id", "fail_count", "success_count", "weight"],
                )
            )
    return 0


def _print_observation_stats(r: dict[str, Any]) -> None:
    judged = r["used"] + r["ignored"]
    table = Table(
        title=f"observation {r['observation_id']}", show_header=False, title_justify="left"
    )
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("used", f"{r['used']:,}")
    table.add_row("ignored", f"{r['ignored']:,}")
    table.add_row("used share", "—" if r["used_share"] is None else f"{r['used_share']:.1%}")
    if r["weight"] is not None:
        table.add_row("weight", f"{r['weight']:.3f}")
        table.add_row(
            "sessions failed / accepted", f"{r['failed_sessions']} / {r['accepted_sessions']}"
        )
        table.add_row("misleading", "yes" if r["misleading"] else "no")
    out.print(table)
    if not judged:
        err.print(
            "no turn has judged this observation yet (check the id, or whether its "
            "injections got responses)"
        )


# -- benchmark: report scores, compare ------------------------------------------------


def cmd_report_scores(args: argparse.Namespace) -> int:
    from analytics import scores as sc

    con = _open_db(args)
    try:
        report = sc.scores(con, args.run_id, _settings(args).duckdb_path)
    except sc.UnknownRun as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        con.close()
    text = json.dumps(report, indent=2, default=_json_default) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        sys.stdout.write(text)
        return 0
    table = Table(title=f"scores — run {args.run_id}", title_justify="left")
    for col in (
        "condition",
        "questions",
        "accuracy",
        "correct",
        "reader fail",
        "retrieval fail",
        "unattributed",
        "repeat spread",
    ):
        table.add_column(col, justify="left" if col == "condition" else "right", no_wrap=True)
    for c in report["conditions"]:
        spread = c["spread"]
        table.add_row(
            c["condition"] or "(none)",
            f"{c['questions']:,}",
            f"{c['accuracy']:.1%}",
            f"{c['correct']:g}",
            f"{c['reader_failure_with_evidence']:g}",
            f"{c['retrieval_failure']:g}",
            f"{c['unattributed']:g}",
            "—" if spread["min"] == spread["max"] else f"{spread['min']:.1%}–{spread['max']:.1%}",
        )
    out.print(table)
    prov = report["provenance"]
    out.print(
        f"[dim]{prov['judgements']:,} judgements, {prov['first_event_ts']} to "
        f"{prov['last_event_ts']}; reader fail = the gold evidence was in the context and the "
        "answer was still wrong[/dim]"
    )
    if args.out:
        out.print(f"wrote {args.out}")
    return 0


def cmd_report_html(args: argparse.Namespace) -> int:
    path = write_html_report(_settings(args).duckdb_path, Path(args.out))
    if args.json:
        _print_json({"report": str(path)})
    else:
        out.print(f"report: {path}")
    return 0


def write_html_report(db: str, target: Path) -> Path:
    from analytics.db import connect
    from analytics.report import render

    con = connect(db, read_only=True)
    try:
        page = render(con, db)
    finally:
        con.close()
    target.write_text(page, encoding="utf-8")
    return target.resolve()


def cmd_compare(args: argparse.Namespace) -> int:
    from analytics import scores as sc

    con = _open_db(args)
    try:
        r = sc.compare(
            con,
            args.baseline,
            args.candidate,
            args.baseline_condition,
            args.candidate_condition,
            resamples=args.resamples,
            seed=args.seed,
        )
    except sc.UnknownRun as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        con.close()
    if args.json:
        _print_json(r)
        return 0
    _print_comparison(r)
    return 0


def _side_name(side: dict[str, Any]) -> str:
    return side["run_id"] + (f" [{side['condition']}]" if side["condition"] else "")


def _print_comparison(r: dict[str, Any]) -> None:
    b, c = r["baseline"], r["candidate"]
    ci = r["bootstrap_ci"]
    m = r["mcnemar"]
    out.print(f"[bold]{r['verdict']}[/bold]")
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("baseline", f"{_side_name(b)}: accuracy {b['accuracy']:.1%}")
    summary.add_row("candidate", f"{_side_name(c)}: accuracy {c['accuracy']:.1%}")
    summary.add_row(
        "delta",
        f"{r['delta'] * 100:+.1f} pts, {ci['level']:.0%} CI {ci['low'] * 100:+.1f} to "
        f"{ci['high'] * 100:+.1f} (paired bootstrap over questions, {ci['resamples']:,} "
        f"resamples, seed {ci['seed']})",
    )
    summary.add_row(
        "McNemar",
        f"exact p = {m['p_value']:.3g} ({m['right_to_wrong']} right→wrong, "
        f"{m['wrong_to_right']} wrong→right; {r['pairs']:,} pairs over {r['questions']:,} "
        "questions)",
    )
    for label, key, unit in (
        ("latency", "latency_ms_delta", " ms"),
        ("tokens", "tokens_delta", ""),
    ):
        d = r[key]
        if d:
            summary.add_row(
                label, f"{d['mean']:+,.1f}{unit} mean, {d['median']:+,.1f}{unit} median per pair"
            )
    out.print(summary)
    states = r["transitions"]["states"]
    table = Table(
        title="where the answers moved (rows: baseline, columns: candidate)", title_justify="left"
    )
    table.add_column("baseline ↓ / candidate →")
    for s in states:
        table.add_column(s, justify="right")
    for s in states:
        row = r["transitions"]["baseline_to_candidate"][s]
        table.add_row(s, *(f"[bold]{row[t]}[/bold]" if s == t else str(row[t]) for t in states))
    out.print(table)
    un = r["unpaired"]
    for side, items in (("baseline", un["baseline_only"]), ("candidate", un["candidate_only"])):
        if items:
            shown = ", ".join(f"{i['question_id']}#{i['repeat_index']}" for i in items[:10])
            more = f" and {len(items) - 10} more (--json lists all)" if len(items) > 10 else ""
            out.print(f"[yellow]only in the {side}:[/yellow] {shown}{more} — not compared")


# -- status -----------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from analytics.status import status

    con = _open_db(args)
    try:
        st = status(con, top=args.top, runs=args.runs)
    finally:
        con.close()
    if args.json:
        _print_json(st)
    else:
        print_status(st, _settings(args).duckdb_path)
    return 0


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _ago(when: datetime | None) -> str:
    if when is None:
        return "never"
    seconds = (datetime.now(UTC) - when.astimezone(UTC)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def print_status(st: dict[str, Any], db: str) -> None:
    from rich.columns import Columns
    from rich.panel import Panel

    fu, fb = st["followup"], st["feedback"]
    head = Table(show_header=False, box=None, pad_edge=False)
    head.add_column(style="bold")
    head.add_column()
    head.add_row(
        "followup rate",
        f"{_pct(fu['rate'])} of {fu['agent_searches']:,} agent searches "
        f"[dim]({fu['caveat']})[/dim]",
    )
    head.add_row(
        "memories used",
        f"{_pct(fb['used_share'])} of {fb['used'] + fb['ignored']:,} injected-and-answered "
        f"({fb['observations']:,} observations) [dim]({fb['caveat']})[/dim]",
    )
    sessions = st["sessions"]
    total = sum(sessions.values())
    failed = total - sessions.get("accepted", 0)
    head.add_row(
        "sessions",
        f"{total:,}: "
        + ", ".join(f"{k} {v:,}" for k, v in sessions.items())
        + (f"  ({failed / total:.0%} failed)" if total else ""),
    )
    fresh = st["freshness"]
    newest = fresh["newest_event"]
    head.add_row(
        "freshness",
        f"newest event {newest.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S') if newest else '—'}"
        f" UTC; last written {_ago(fresh['last_written'])}",
    )
    out.print(Panel(head, title=f"memdiag status — {db}", title_align="left"))

    cats = Table(title="failed sessions by category", title_justify="left", box=None)
    cats.add_column("category")
    cats.add_column("sessions", justify="right")
    cats.add_column("", no_wrap=True)
    most = max((c["sessions"] for c in st["failure_categories"]), default=0) or 1
    for c in st["failure_categories"]:
        cats.add_row(
            c["failure_category"], f"{c['sessions']:,}", "█" * round(12 * c["sessions"] / most)
        )

    mis = Table(
        title=f"misleading memories: {st['misleading']['count']}", title_justify="left", box=None
    )
    mis.add_column("observation")
    mis.add_column("failed", justify="right")
    mis.add_column("weight", justify="right")
    for m in st["misleading"]["top"]:
        mis.add_row(m["observation_id"], str(m["fail_count"]), _cell(m["weight"]))
    out.print(Columns([cats, mis], padding=(0, 4)))

    runs = Table(title="benchmark runs (most recent first)", title_justify="left", box=None)
    for col in ("run", "accuracy", "reader fail", "retrieval fail", "unattributed", "judgements"):
        runs.add_column(col, justify="left" if col == "run" else "right")
    for r in st["runs"]:
        runs.add_row(
            r["run_id"],
            _pct(r["accuracy"]),
            str(r["reader_failures"]),
            str(r["retrieval_failures"]),
            str(r["unattributed"]),
            f"{r['judgements']:,}",
        )
    dead = Table(title="dead letters", title_justify="left", box=None)
    dead.add_column("reason")
    dead.add_column("count", justify="right")
    for d in st["dead_letters"]:
        dead.add_row(d["reason"], f"{d['dead_letters']:,}")
    if not st["dead_letters"]:
        dead.add_row("none", "0")
    out.print(
        Columns(
            [runs if st["runs"] else Table(title="no benchmark runs", box=None), dead],
            padding=(0, 4),
        )
    )


# -- alert ------------------------------------------------------------------------------


def cmd_alert(args: argparse.Namespace) -> int:
    from memdiag.alert import RuleError, parse_rule, parse_rules_file
    from memdiag.alerting import watch

    try:
        rules = [parse_rule(r) for r in args.rule or []]
        if args.rules:
            rules += parse_rules_file(Path(args.rules).read_text("utf-8"))
    except (RuleError, OSError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    if not rules:
        err.print(
            "[red]error:[/red] no rule: pass --rule 'followup_rate > 0.3 for 5m' or --rules FILE"
        )
        return 2
    settings = _settings(args)
    _say(args)(
        f"watching {settings.topics.counters} on {settings.broker} with {len(rules)} rule(s)"
        + (f", posting to {args.webhook}" if args.webhook else "")
    )

    def show(alert: Any) -> None:
        d = alert.as_dict()
        if args.json:
            sys.stdout.write(json.dumps(d) + "\n")
            sys.stdout.flush()
            return
        colour = "red" if d["state"] == "firing" else "green"
        value = "no data" if d["value"] is None else f"{d['value']:.4g}"
        out.print(
            f"[{colour}]{d['state'].upper():8}[/{colour}] {d['rule']}  value {value} "
            f"(window {d['window_minutes']}m ending {d['at']})"
        )

    asyncio.run(
        watch(
            settings,
            rules,
            show,
            webhook=args.webhook,
            from_beginning=args.from_beginning,
            stop_after_idle=args.stop_after_idle,
        )
    )
    return 0


# -- the parser ------------------------------------------------------------------------


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
    run.add_argument("--input", required=True, metavar="FILE.jsonl", help="events, one a line")
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
        "The Faust worker: reads memdiag.events, keeps per-session and per-observation "
        "state, derives the diagnostics and the weight updates. Stop it with Ctrl-C or "
        "SIGTERM.",
    )
    worker.set_defaults(func=cmd_worker)

    sink = add(
        "sink",
        "run the DuckDB sink (long-running) against MEMDIAG_BROKER",
        "Consumes memdiag.diagnostics, memdiag.weights and memdiag.deadletter in batches "
        "and upserts them into DuckDB. It holds the file only while it writes a batch, so "
        "analysts can open it read-only in between.",
    )
    sink.add_argument("--db", metavar="PATH", help="DuckDB file (default MEMDIAG_DUCKDB_PATH)")
    sink.set_defaults(func=cmd_sink)

    publish = add(
        "publish",
        "publish a JSON Lines file of events to MEMDIAG_BROKER, with progress",
        "Sends events to memdiag.events keyed by session_id and judgements to "
        "memdiag.judgements keyed by run_id, batching consecutive events of one key into "
        "one message. Lines that are not valid events are sent too: the worker "
        "dead-letters them with a reason.",
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
    q = question("observation-stats", "how often one observation was used and ignored")
    q.add_argument("observation_id", metavar="OBS_ID")
    q = question("observation-history", "one observation's verdicts, most recent first")
    q.add_argument("observation_id", metavar="OBS_ID")
    q.add_argument("--limit", type=int, default=100, help="most rows (default 100)")
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
            "are folded (each weighs 1/n) and their spread shown. The file's JSON Schema is "
            "schemas/scores.schema.json."
        ),
    )
    scores.add_argument("--run-id", required=True, metavar="RUN", help="the benchmark run")
    scores.add_argument("--out", metavar="FILE", help="write scores.json here")
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
    compare.add_argument("--baseline", required=True, metavar="RUN_A")
    compare.add_argument("--candidate", required=True, metavar="RUN_B")
    compare.add_argument("--baseline-condition", metavar="C", help="only this condition of RUN_A")
    compare.add_argument("--candidate-condition", metavar="C", help="only this condition of RUN_B")
    compare.add_argument(
        "--resamples", type=int, default=10_000, help="bootstrap resamples (default 10000)"
    )
    compare.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    _db_and_json(compare, "print the comparison as JSON")
    compare.set_defaults(func=cmd_compare)

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
    status_p.set_defaults(func=cmd_status)

    alert = add(
        "alert",
        "watch the counter topic and say when alert rules fire and resolve",
        "Reads the per-minute rollups on memdiag.counters (MEMDIAG_BROKER) and prints, or\n"
        "POSTs as JSON to --webhook, each time a rule starts or stops holding.\n\n"
        "A rule:  EXPR OP NUMBER [for DURATION]   (the window, 5m by default, in event time)\n"
        "  EXPR:  followup_rate | ignored_share | reader_failures | retrieval_failures |\n"
        "         misleading | dead_letters | count(S) | rate(S) | ratio(S1, S2)\n"
        "  S:     a counter, e.g. memdiag.dead_letter_total{reason=not_json}\n"
        "e.g.     memdiag alert --rule 'followup_rate > 0.3 for 5m'\n"
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


def _db_and_json(p: argparse.ArgumentParser, json_help: str) -> None:
    """The two options of every command that reads DuckDB and prints results."""
    p.add_argument("--db", metavar="PATH", help="DuckDB file (default MEMDIAG_DUCKDB_PATH)")
    p.add_argument("--json", action="store_true", help=json_help)


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
    except Exception as exc:  # noqa: BLE001 - a user-facing command: say what, not a traceback
        from memdiag.broker import BrokerError
        from memdiag.runner import PipelineError

        if isinstance(exc, BrokerError | PipelineError) or type(exc).__name__ == "DatabaseError":
            err.print(f"[red]error:[/red] {exc}")
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
