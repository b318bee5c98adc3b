"""The pipeline's commands: ``run``, ``demo``, ``worker``, ``sink``, ``publish``, ``status``."""

from __future__ import annotations

import argparse
import asyncio
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from rich.markup import escape

from memdiag.cli.common import (
    FileProgress,
    err,
    notifier,
    out,
    print_json,
    require_report_extra,
    settings_of,
)
from memdiag.cli.render import print_run_report, print_status
from memdiag.contract.words import SEMANTIC


def _run_pipeline(args: argparse.Namespace) -> Any:
    from memdiag.runner import run_pipeline

    with FileProgress(args, "publishing") as progress:
        return run_pipeline(
            Path(args.input),
            settings_of(args),
            notifier(args),
            progress,
            args.timeout,
            existing=args.existing,
        )


def cmd_run(args: argparse.Namespace) -> int:
    from memdiag.runner import summary

    result = _run_pipeline(args)
    figures = summary(result.db_path)
    report = {
        "input": str(args.input),
        "db": result.db_path,
        "events": result.publish.events,
        "span_records": result.publish.span_records,
        "messages": result.publish.messages,
        "seconds": round(result.seconds, 2),
        "stage_seconds": {k: round(v, 2) for k, v in result.stage_seconds.items()},
        **figures,
    }
    if args.json:
        print_json(report)
    else:
        print_run_report(report)
    return 0


def sample_path() -> Path:
    return Path(str(resources.files("memdiag").joinpath("data", "sample.jsonl")))


def policy_path() -> Path:
    """The bundled example gate policy (what `memdiag demo` suggests gating with)."""
    from memdiag.analytics.gate import bundled_policy

    return bundled_policy()


def cmd_report_html(args: argparse.Namespace) -> int:
    path = write_html_report(settings_of(args).duckdb_path, Path(args.out))
    if args.json:
        print_json({"report": str(path)})
    else:
        out.print(f"report: {path}")
    return 0


def write_html_report(db: str, target: Path) -> Path:
    from memdiag.analytics.db import connect
    from memdiag.views.report import render

    con = connect(db, read_only=True)
    try:
        page = render(con, db)
    finally:
        con.close()
    target.write_text(page, encoding="utf-8")
    return target.resolve()


def cmd_demo(args: argparse.Namespace) -> int:
    """`run` on the bundled sample, then the status screen and the HTML report."""
    from memdiag.analytics.db import connect
    from memdiag.analytics.status import status

    require_report_extra()  # its HTML report: say so before the pipeline runs, not after
    args.input = str(sample_path())
    if not args.db:  # the demo's own file: made again each time
        args.db = "memdiag-demo.duckdb"
        args.existing = args.existing or "replace"
    notifier(args)(f"demo: the bundled sample ({args.input}) into {args.db}")
    if args.json:
        return cmd_run(args)
    result = _run_pipeline(args)
    con = connect(result.db_path, read_only=True)
    try:
        figures = status(con)
        latest = con.execute(
            "SELECT session_id FROM session_diagnostics WHERE outcome <> 'accepted' "
            "ORDER BY ts DESC, session_id LIMIT 1"
        ).fetchone()
    finally:
        con.close()
    out.print(
        f"[bold]{result.publish.events:,} events[/bold] through broker, worker and sink into "
        f"{result.db_path} in {result.seconds:.1f}s"
    )
    print_status(figures, args)
    report = write_html_report(result.db_path, Path(args.report))
    out.print(f"\n[bold]report:[/bold] {report}")
    db = shlex.quote(args.db)
    out.print(f"[bold]see it live:[/bold] memdiag serve --db {db}  (then open "
              "http://127.0.0.1:8765/)")  # fmt: skip
    explain = f"memdiag explain {shlex.quote(latest[0])} --db {args.db} · " if latest else ""
    out.print(
        f"[dim]next: {explain}memdiag calibrate --db {args.db} · memdiag query misleading "
        f"--db {args.db} · memdiag query pipeline-health --db {args.db} · memdiag compare "
        f"--baseline longmem-baseline --candidate longmem-rerank --db {args.db} · memdiag gate "
        f"--baseline longmem-baseline --candidate longmem-rerank --policy "
        f"{shlex.quote(str(policy_path()))} --db {args.db}[/dim]"
    )
    return 0


# -- long-running processes ------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> int:
    from memdiag.procs import tune_malloc

    allocator = tune_malloc()  # first, before the semantic model or Faust allocate anything
    from memdiag.streams.worker import main

    settings = settings_of(args)
    if settings.detector == SEMANTIC:  # the model loads (and is checked) before anything runs
        from memdiag import semantic

        try:
            semantic.model()
        except semantic.ModelMissing as exc:
            err.print(f"[red]error:[/red] {escape(str(exc))}")
            return 2
    main(settings, allocator)
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from memdiag.analytics.main import main

    main(settings_of(args))
    return 0


# -- publish ---------------------------------------------------------------------------


def _not_json_lines(path: Path) -> str | None:
    """What is wrong with a file whose first line is not a JSON document (a pretty-printed
    array or object, most often): every line would be dead-lettered as not JSON."""
    import orjson

    with path.open("rb") as f:
        for raw in f:
            line = raw.strip()
            if not line:
                continue
            try:
                orjson.loads(line)
                return None
            except orjson.JSONDecodeError:
                pass
            shape = "not JSON"
            if line.startswith(b"["):
                shape = "one JSON array over many lines"
            elif line.startswith(b"{"):
                shape = "JSON over many lines"
            return (
                f"the first line of {path} is not a JSON document ({shape}?). memdiag takes JSON "
                "Lines, one event a line; each line that is not JSON is dead-lettered as "
                f"not_json. An array converts with: jq -c '.[]' {path} > events.jsonl"
            )
    return None


def cmd_publish(args: argparse.Namespace) -> int:
    from memdiag.kafka import ensure_topics, wait_for_kafka
    from memdiag.publish import publish_file

    settings = settings_of(args)
    path = Path(args.file)
    if path.is_dir():
        err.print(
            f"[red]error:[/red] {path} is a folder: give a JSON Lines file (one event a line)"
        )
        return 2
    if not path.is_file():
        err.print(f"[red]error:[/red] no such file: {path}")
        return 2
    hint = _not_json_lines(path)
    if hint:
        err.print(f"[yellow]warning:[/yellow] {hint}")

    async def go(progress: FileProgress) -> Any:
        await wait_for_kafka(settings, "memdiag publish", give_up_after=10.0)
        await ensure_topics(settings)
        return await publish_file(path, settings, batch_size=args.batch_size, progress=progress)

    with FileProgress(args, f"publishing {path.name}") as progress:
        stats = asyncio.run(go(progress))
    result = {
        "file": str(path),
        "broker": settings.broker,
        "lines": stats.lines,
        "events": stats.events,
        "messages": stats.messages,
        "unkeyed_lines": stats.unkeyed_lines,
        "span_records": stats.span_records,
        "bytes": stats.bytes,
        "acknowledged": stats.acknowledged,
        "too_large": stats.too_large,
    }
    if args.json:
        print_json(result)
    else:
        spans = (
            f" and {stats.span_records:,} OTLP span records (to {settings.topics.otlp_spans})"
            if stats.span_records
            else ""
        )
        out.print(
            f"published {stats.events:,} events{spans} from {path} in {stats.messages:,} "
            f"messages to {settings.broker}"
            + (
                f" ({stats.unkeyed_lines} without a session key, sent for the worker to judge)"
                if stats.unkeyed_lines
                else ""
            )
        )
        if stats.too_large:
            out.print(
                f"{stats.too_large:,} lines were too large for the broker (its "
                f"message.max.bytes): they went to {settings.topics.deadletter} in their place "
                "(reason too_large); `memdiag query dead-letters` shows them"
            )
    return 0
