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
        check = stream_check(con, window)
    finally:
        con.close()
    if not len(sessions):
        err.print(
            "[red]error:[/red] no session with an outcome to calibrate against"
            + (" (with these filters)" if args.org or args.project or args.since else "")
        )
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


def verdict(r: dict[str, Any]) -> str:
    """The window table in one sentence."""
    rows = [w for w in r["windows"] if w["rate_auc_ci"] and w["rate_auc_ci"]["low"] is not None]
    if not rows:
        return "too few sessions of each outcome to measure the followup rate"
    if all(w["rate_auc_ci"]["low"] <= 0.5 <= w["rate_auc_ci"]["high"] for w in rows):
        return (
            "[bold]on this data no window's followup rate predicts failures better than "
            "chance[/bold] (every AUC interval contains 0.5)"
        )
    best = next(w for w in r["windows"] if w["window_seconds"] == r["best_window_seconds"])
    return (
        f"[bold]best window on this data: {best['window_seconds']:g} s[/bold] (AUC "
        f"{best['rate_auc']:.3f}, best in {best.get('p_best') or 0:.0%} of the resamples)"
    )


def print_calibration(r: dict[str, Any]) -> None:
    pop, boot = r["population"], r["bootstrap"]
    out.print(
        f"[bold]calibration[/bold] on {pop['sessions']:,} sessions with an outcome: "
        f"{pop['failed']:,} failed (base rate {_pct(pop['base_rate'])}). Intervals: "
        f"{boot['level']:.0%} percentile bootstrap over {boot['clusters']:,} {boot['unit']}s, "
        f"{boot['resamples']:,} resamples, seed {boot['seed']}."
    )
    table = Table(title="predictors of a failed session", title_justify="left")
    for col in ("predictor", "flagged", "failed of those", "precision", "recall", "lift"):
        table.add_column(col, justify="left" if col == "predictor" else "right", no_wrap=True)
    for p in r["predictors"]:
        table.add_row(
            p["predictor"],
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
        + ("—" if ra["auc"] is None else f"{ra['auc']:.3f}")
        + _ci(ra["ci"], pct=False)
        + f" over the {ra['sessions']:,} sessions that searched (0.5 = no better than chance)"
    )
    out.print(
        f"never searched: {pop['never_searched']:,} sessions, "
        f"{_pct(pop['failure_rate_never_searched'])} failed, against "
        f"{_pct(pop['failure_rate_searched'])} of the sessions that searched"
    )
    w = Table(
        title="the followup window: which length predicts failures best", title_justify="left"
    )
    for col in (
        "window",
        "followups",
        "sessions ≥ 1",
        "precision",
        "recall",
        "rate AUC",
        "best in",
    ):
        w.add_column(col, justify="right", no_wrap=True)
    for row in r["windows"]:
        best = row["window_seconds"] == r["best_window_seconds"]
        w.add_row(
            f"{row['window_seconds']:g} s" + (" (stream)" if row["stream"] else ""),
            f"{row['followups']:,}",
            f"{row['flagged']:,}",
            _pct(row["precision"]) + _ci(row["precision_ci"]),
            _pct(row["recall"]) + _ci(row["recall_ci"]),
            ("—" if row["rate_auc"] is None else f"{row['rate_auc']:.3f}")
            + _ci(row["rate_auc_ci"], pct=False)
            + (" ◀" if best else ""),
            "—" if row.get("p_best") is None else f"{row['p_best']:.0%}",
        )
    out.print(w)
    out.print(verdict(r))
    out.print(
        "[dim]best in: the share of resamples in which that window has the highest AUC; "
        "overlapping intervals mean this data does not tell the windows apart.[/dim]"
    )
    for note in r["notes"]:
        out.print(f"[yellow]note:[/yellow] {escape(note)}")
    check = r["stream_check"]
    if check["disagree"]:
        out.print(
            f"[yellow]note:[/yellow] at {check['window_seconds']:g} s the recomputed verdict "
            f"differs from the stream's on {check['disagree']:,} of {check['checked']:,} "
            "searches: the worker ran with another AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS"
        )
    if pop["unknown_verdicts"]:
        out.print(
            f"[yellow]note:[/yellow] {pop['unknown_verdicts']:,} searches were written before "
            "memdiag stored disjoint_new_query: they count as no followup under every window"
        )
    out.print("[dim]caveats: " + escape("; ".join(r["caveats"])) + ".[/dim]")
