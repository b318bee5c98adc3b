"""The analyst's commands: ``query``, ``report scores``, ``report html``, ``compare``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from memdiag.cli.common import (
    REPORT_EXTRA,
    err,
    json_default,
    open_db,
    out,
    print_json,
    settings_of,
)
from memdiag.cli.render import (
    paired_metrics_table,
    print_comparison,
    print_gate,
    print_observation_stats,
    print_pipeline_health,
    print_recall_trend,
    rich_table,
)


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


def _since(args: argparse.Namespace) -> str:
    return f" since {args.since}" if args.since else ""


def cmd_query(args: argparse.Namespace) -> int:
    from memdiag.analytics import queries

    since = None
    if getattr(args, "since", None):
        try:
            since = queries.parse_since(args.since)
        except ValueError as exc:
            err.print(f"[red]error:[/red] {exc}")
            return 2
    con = open_db(args)
    try:
        if args.question == "observation-stats":
            result: Any = queries.observation_stats(con, args.observation_id)
        elif args.question == "observation-history":
            result = queries.observation_history(con, args.observation_id, args.limit)
        elif args.question == "failure-distribution":
            result = queries.failure_distribution(con, args.org, args.project, since)
        elif args.question == "pipeline-health":
            result = queries.pipeline_health(con, args.agent)
        elif args.question == "recall-trend":
            result = queries.recall_trend(con, args.by, args.agent)
        elif args.question == "unused-memories":
            if args.min_injections < 1:
                err.print("[red]error:[/red] --min-injections must be at least 1")
                return 2
            result = queries.unused_memories(con, args.min_injections, since, args.limit)
        elif args.graph:
            result = queries.misleading_graph(con, args.org, since, args.limit)
        else:
            result = queries.misleading(con, args.org, since, args.limit)
    finally:
        con.close()
    if args.json:
        print_json(result)
        return 0
    if args.question == "observation-stats":
        print_observation_stats(result)
    elif args.question == "pipeline-health":
        print_pipeline_health(result, args.agent)
    elif args.question == "recall-trend":
        print_recall_trend(result, args.by, args.agent)
    elif args.question == "observation-history":
        if not result:
            err.print(f"no verdicts recorded for observation {args.observation_id}")
        else:
            out.print(
                rich_table(
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
    elif args.question == "unused-memories":
        if not result:
            err.print(f"no memory judged in {args.min_injections}+ turns{_since(args)} went "
                      "unused in all of them")  # fmt: skip
        else:
            out.print(
                rich_table(
                    f"memories judged in {args.min_injections}+ turns{_since(args)}, used in "
                    f"none: {len(result)}",
                    result,
                    [
                        "observation_id",
                        "judged_turns",
                        "sessions",
                        "strength",
                        "weight",
                        "last_injected_at",
                    ],  # fmt: skip
                )
            )
    elif args.question == "failure-distribution":
        total = sum(r["sessions"] for r in result)
        for r in result:
            r["share"] = f"{r['sessions'] / total:.1%}" if total else "—"
        out.print(
            rich_table(
                f"failed sessions by category{_filters(args)}: {total:,}",
                result,
                ["failure_category", "sessions", "share"],
            )
        )
    elif args.graph:
        if not result:
            out.print(f"no misleading graph entities or edges{_filters(args)}")
        else:
            out.print(
                rich_table(
                    f"misleading graph entities and edges{_filters(args)}: "
                    "in >= 3 failed sessions, no accepted one",
                    result,
                    ["kind", "id", "failed_sessions", "accepted_sessions", "weight"],
                )
            )
    else:
        if not result:
            out.print(f"no misleading observations{_filters(args)}")
        else:
            out.print(
                rich_table(
                    f"misleading observations{_filters(args)}: "
                    "in >= 3 failed sessions, no accepted one",
                    result,
                    ["observation_id", "fail_count", "success_count", "weight"],
                )
            )
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from memdiag.analytics.doctor import NOTE, REFUSE, doctor

    base = args.run or args.baseline
    if base is None or (args.run and args.baseline):
        err.print("[red]error:[/red] give --run RUN, or --baseline RUN_A [--candidate RUN_B]")
        return 2
    if args.candidate and not args.baseline:
        err.print("[red]error:[/red] --candidate needs --baseline")
        return 2
    candidate = None if args.candidate is None else (args.candidate, args.candidate_condition)
    con = open_db(args)
    try:
        findings = doctor(con, (base, args.baseline_condition), candidate, args.min_questions)
    finally:
        con.close()
    no_data = any(f.check == "no_data" for f in findings)
    status = 2 if no_data else (1 if any(f.level != NOTE for f in findings) else 0)
    if args.json:
        print_json({"status": status, "findings": [f.as_dict() for f in findings]})
        return status
    colours = {REFUSE: "red bold", "weak": "yellow", NOTE: "dim"}
    for f in findings:
        out.print(f"[{colours[f.level]}]{f.level:<6}[/{colours[f.level]}] {f.subject}: "
                  f"{f.message}")  # fmt: skip
    if status == 0:
        out.print("[green]nothing weakens this comparison[/green]")
    return status


def cmd_runs(args: argparse.Namespace) -> int:
    from memdiag.analytics import queries

    con = open_db(args)
    try:
        result = queries.runs(con, args.limit)
    finally:
        con.close()
    if args.json:
        print_json(result)
        return 0
    if not result:
        err.print("no benchmark judgements in this database (publish judgement events first)")
        return 0
    for r in result:
        r["accuracy"] = f"{r['accuracy']:.1%}"
    out.print(
        rich_table(
            f"benchmark runs: {len(result)}",
            result,
            [
                "run_id",
                "judgements",
                "questions",
                "conditions",
                "repeats",
                "rejudged",
                "accuracy",
                "last_at",
            ],  # fmt: skip
        )
    )
    labels = (("suite_id", "suite"), ("suite_version", "version"),
              ("suite_checksum", "suite checksum"), ("fixture_checksum", "fixtures"),
              ("config_fingerprint", "config"), ("git_head", "git"),
              ("service_version", "service"), ("run_group_id", "group"))  # fmt: skip
    for r in result:
        said = [f"{label} {r[k]}" for k, label in labels if r[k]]
        out.print(f"[bold]{r['run_id']}[/bold]: " + (" · ".join(said) or "no provenance given"))
    return 0


def cmd_report_scores(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from memdiag.analytics import scores as sc

    con = open_db(args)
    try:
        report = sc.scores(con, args.run_id, settings_of(args).duckdb_path, args.baseline_condition)
    except sc.UnknownRun as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        con.close()
    text = json.dumps(report, indent=2, default=json_default) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    if args.json:
        sys.stdout.write(text)
        return 0
    table = Table(title=f"scores — run {escape(args.run_id)}", title_justify="left")
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
            escape(c["condition"]) or "(none)",
            f"{c['questions']:,}",
            f"{c['accuracy']:.1%}",
            f"{c['correct']:g}",
            f"{c['reader_failure_with_evidence']:g}",
            f"{c['retrieval_failure']:g}",
            f"{c['unattributed']:g}",
            "—" if spread["min"] == spread["max"] else f"{spread['min']:.1%}–{spread['max']:.1%}",
        )
    out.print(table)
    _print_metrics(report)
    prov = report["provenance"]
    out.print(
        f"[dim]{prov['judgements']:,} judgements, {prov['first_event_ts']} to "
        f"{prov['last_event_ts']}; reader fail = the gold evidence was in the context and the "
        "answer was still wrong[/dim]"
    )
    if args.out:
        out.print(f"wrote {args.out}")
    return 0


def _print_metrics(report: dict[str, Any]) -> None:
    """Each condition's metric means with their intervals, then the paired comparisons."""
    from rich.markup import escape

    from memdiag.analytics.metrics import METRICS, fmt

    means = Table(title="metrics: mean [95% interval over questions] ± stdev across repeats",
                  title_justify="left")  # fmt: skip
    means.add_column("metric", no_wrap=True)
    for c in report["conditions"]:
        means.add_column(escape(c["condition"]) or "(none)", justify="right", no_wrap=True)
    for name, m in METRICS.items():
        cells = []
        for c in report["conditions"]:
            s = c["metrics"][name]
            if s is None:
                cells.append("—")
                continue
            low, high = (fmt(m.unit, s["ci"][k], bare=True) for k in ("low", "high"))
            spread = fmt(m.unit, s["stdev_across_repeats"], bare=True)
            cells.append(f"{fmt(m.unit, s['mean'], bare=True)} [{low}, {high}] ± {spread}")
        if any(cell != "—" for cell in cells):
            means.add_row(name, *cells)
    out.print(means)
    for cmp in report["comparisons"]:
        title = (f"{cmp['candidate_condition']} − {cmp['baseline_condition']}, paired over "
                 f"{cmp['questions']:,} questions ({cmp['pairs']:,} pairs)")  # fmt: skip
        out.print(paired_metrics_table(escape(title), cmp["metrics"]))


def cmd_report_html(args: argparse.Namespace) -> int:
    path = write_html_report(settings_of(args).duckdb_path, Path(args.out))
    if args.json:
        print_json({"report": str(path)})
    else:
        out.print(f"report: {path}")
    return 0


def write_html_report(db: str, target: Path) -> Path:
    from memdiag.analytics.db import connect
    from memdiag.analytics.report import render

    con = connect(db, read_only=True)
    try:
        page = render(con, db)
    finally:
        con.close()
    target.write_text(page, encoding="utf-8")
    return target.resolve()


def cmd_compare(args: argparse.Namespace) -> int:
    from memdiag.analytics import scores as sc

    con = open_db(args)
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
        print_json(r)
        return 0
    print_comparison(r)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    """Exit 0/1/2 as the contract says, whatever happens: a missing extra is a 2 here."""
    try:
        return _gate(args)
    except ModuleNotFoundError as exc:
        if exc.name not in REPORT_EXTRA:
            raise
        reason = (f"error: memdiag gate needs {exc.name}, which the worker's install leaves "
                  "out: pip install 'memdiag[report]'")  # fmt: skip
        if args.json:
            print_json({"status": 2, "verdict": "error", "reason": reason})
        else:
            err.print(reason, markup=False)
        return 2


def _gate(args: argparse.Namespace) -> int:
    import duckdb

    from memdiag.analytics import gate as g
    from memdiag.analytics.db import DatabaseError
    from memdiag.analytics.scores import NeedsCondition, UnknownRun
    from memdiag.settings import ConfigError

    policy, db = None, args.db or "the DuckDB file"
    try:
        if args.policy is None:
            raise g.PolicyError("--policy FILE is required")
        policy = g.load_policy(args.policy)
        if args.explain:
            words = g.explain(policy)
            if args.json:
                print_json({"status": 0, "verdict": "explain", "reason": "the policy in words",
                            "explain": words, "policy": policy.as_dict()})  # fmt: skip
            else:
                sys.stdout.write(words + "\n")
            return 0
        missing = [f"--{n}" for n in ("baseline", "candidate") if getattr(args, n) is None]
        if missing:
            raise g.PolicyError(f"{' and '.join(missing)} required (or --explain)")
        db = settings_of(args).duckdb_path
        con = open_db(args)
        try:
            verdict = g.run_gate(con, args.baseline, args.candidate, policy,
                                 args.baseline_condition, args.candidate_condition)  # fmt: skip
        finally:
            con.close()
    except (g.PolicyError, ConfigError, NeedsCondition) as exc:
        verdict = g.error(f"{exc}", policy)
    except UnknownRun as exc:
        verdict = g.cannot_judge(str(exc), policy)
    except (DatabaseError, duckdb.Error, OSError) as exc:
        hint = (
            " (a file written by an older memdiag: let `memdiag sink --db` open it once to "
            "add the new columns)"
            if isinstance(exc, duckdb.BinderException | duckdb.CatalogException)
            else ""
        )
        verdict = g.error(f"cannot read {db}: {str(exc).splitlines()[0]}{hint}", policy)
    except Exception as exc:  # noqa: BLE001 - exit 1 means a regression: nothing else may
        verdict = g.error(f"{type(exc).__name__}: {exc}", policy)
    if args.markdown:
        try:
            Path(args.markdown).write_text(g.markdown(verdict), encoding="utf-8")
        except OSError as exc:
            verdict = g.error(f"cannot write {args.markdown}: {exc.strerror}", policy)
    if args.json:
        print_json(verdict.as_dict())
        return verdict.status
    print_gate(verdict)
    return verdict.status
    print_gate(verdict)
    return verdict.status
