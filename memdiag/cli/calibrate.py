"""``memdiag calibrate``: how much are the followup proxy, ignored memories and "never
searched" worth as predictors of a failed session, on this DuckDB file."""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape
from rich.table import Table

from memdiag.cli.common import err, open_db, out, print_json, settings_of


def parse_windows(text: str) -> tuple[float, ...]:
    try:
        windows = tuple(float(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give window lengths in seconds, comma-separated (10,30,60,120)"
        ) from None
    if not windows or any(w < 0 for w in windows):
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more windows >= 0 seconds")
    return windows


def non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 0")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value


def cmd_calibrate(args: argparse.Namespace) -> int:
    from memdiag.analytics import queries
    from memdiag.analytics.calibrate import calibrate, load, stream_check

    try:
        since = queries.parse_since(args.since)
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    window = settings_of(args).followup_window_seconds
    con = open_db(args)
    try:
        sessions = load(con, args.org, args.project, since)
        check = stream_check(con, window, args.org, args.project, since)
    finally:
        con.close()
    if not len(sessions):
        filtered = " with these filters" if args.org or args.project or args.since else ""
        why = (
            f"; {sessions.unknown:,} were judged before memdiag stored disjoint_new_query: "
            "re-run their events through memdiag to calibrate them"
            if sessions.unknown
            else ""
        )
        err.print(f"[red]error:[/red] no session with an outcome to calibrate{filtered}{why}")
        return 1
    result = calibrate(sessions, args.windows, window, args.resamples, args.seed, by=args.by)
    result["stream_check"] = {"window_seconds": window, **check}
    if args.json:
        print_json(result)
    else:
        print_calibration(result)
    return 0


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _ci(ci: dict[str, Any] | None, pct: bool = True) -> str:
    if ci is None or ci["low"] is None:
        return ""
    if pct:
        return f" [dim]({ci['low']:.0%}–{ci['high']:.0%})[/dim]"
    return f" [dim]({ci['low']:.2f}–{ci['high']:.2f})[/dim]"


def _num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def print_calibration(r: dict[str, Any]) -> None:
    pop, boot = r["population"], r["bootstrap"]
    intervals = (
        f"Intervals: {boot['level']:.0%} percentile bootstrap over {boot['clusters']:,} "
        f"{boot['unit']}s, {boot['resamples']:,} resamples, seed {boot['seed']}."
        if boot["resamples"]
        else "No intervals (--resamples 0)."
    )
    out.print(
        f"[bold]calibration[/bold] on {pop['sessions']:,} sessions with an outcome: "
        f"{pop['failed']:,} failed (base rate {_pct(pop['base_rate'])}). {intervals}"
    )
    for note in r["notes"]:
        out.print(f"[yellow]note:[/yellow] {escape(note)}")
    g = Table(
        title=f"followups per session ({r['rate_auc']['window_seconds']:g} s window), "
        "over the sessions that searched",
        title_justify="left",
    )
    for col in ("outcome", "sessions", "never searched", "followups: mean", "median",
                "rate: mean", "median"):  # fmt: skip
        g.add_column(col, justify="left" if col == "outcome" else "right", no_wrap=True)
    for name, grp in r["groups"].items():
        g.add_row(
            name,
            f"{grp['sessions']:,}",
            f"{grp['never_searched']:,}",
            _num(grp["followups"]["mean"]),
            _num(grp["followups"]["median"], 1),
            _num(grp["rate"]["mean"]),
            _num(grp["rate"]["median"]),
        )
    out.print(g)
    table = Table(title="predictors of a failed session", title_justify="left")
    for col in ("predictor", "over", "flagged", "failed of those", "precision", "recall", "lift"):
        table.add_column(col, justify="left" if col in ("predictor", "over") else "right")
    for p in r["predictors"]:
        table.add_row(
            p["predictor"],
            f"{p['sessions']:,} {p['population']}",
            f"{p['flagged']:,}",
            f"{p['failed_flagged']:,}",
            _pct(p["precision"]) + _ci(p["precision_ci"]),
            _pct(p["recall"]) + _ci(p["recall_ci"]),
            "—" if p["lift"] is None else f"{p['lift']:.2f}×",
        )
    out.print(table)
    ra = r["rate_auc"]
    out.print(
        f"followup rate ({ra['window_seconds']:g} s window) as a score: ROC AUC "
        + _num(ra["auc"], 3)
        + _ci(ra["ci"], pct=False)
        + f" over the {ra['sessions']:,} sessions that searched (0.5 = chance)"
    )
    out.print(
        f"never searched: {pop['never_searched']:,} sessions, "
        f"{_pct(pop['failure_rate_never_searched'])} failed, against "
        f"{_pct(pop['failure_rate_searched'])} of the sessions that searched"
    )
    w = Table(
        title="the followup window: which length predicts failures best", title_justify="left"
    )
    for col in ("window", "followups", "sessions ≥ 1", "precision", "recall", "rate AUC",
                "best in"):  # fmt: skip
        w.add_column(col, justify="right", no_wrap=True)
    for row in r["windows"]:
        best = row["window_seconds"] == r["best_window_seconds"]
        w.add_row(
            f"{row['window_seconds']:g} s" + (" (stream)" if row["stream"] else ""),
            f"{row['followups']:,}",
            f"{row['flagged']:,}",
            _pct(row["precision"]) + _ci(row["precision_ci"]),
            _pct(row["recall"]) + _ci(row["recall_ci"]),
            _num(row["rate_auc"], 3) + _ci(row["rate_auc_ci"], pct=False) + (" ◀" if best else ""),
            "—" if row["p_best"] is None else f"{row['p_best']:.0%}",
        )
    out.print(w)
    out.print(f"[bold]{escape(r['verdict'])}[/bold]")
    out.print(
        "[dim]best in: the share of resamples in which that window has the highest AUC (ties "
        "shared); overlapping intervals mean this data does not tell the windows apart.[/dim]"
    )
    check = r["stream_check"]
    lo, hi = check["window_at_least"], check["window_below"]
    span = (
        f"between {lo or 0:g} s and " + (f"less than {hi:g} s" if hi is not None else "any length")
        if check["checked"]
        else "unknown (no judged search)"
    )
    if check["disagree"]:
        out.print(
            f"[yellow]note:[/yellow] at {check['window_seconds']:g} s the recomputed verdict "
            f"differs from the stream's on {check['disagree']:,} of {check['checked']:,} "
            f"searches: the worker's AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS was {span}, not "
            f"{check['window_seconds']:g} s; '(stream)' marks the latter"
        )
    else:
        out.print(
            f"[dim]the recomputation at {check['window_seconds']:g} s reproduces the stream's "
            f"verdict on all {check['checked']:,} judged searches[/dim]"
        )
    out.print("[dim]caveats: " + escape("; ".join(r["caveats"])) + ".[/dim]")
