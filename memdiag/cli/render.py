"""How results look in a terminal: Rich tables for runs, queries, scores, comparisons and
the status screen."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from memdiag.cli.common import err, out
from memdiag.contract import FOLLOWUP_CAVEAT


def print_run_report(r: dict[str, Any]) -> None:
    table = Table(title=f"memdiag run — {r['input']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    rate = r["followup_rate"]
    table.add_row("events", f"{r['events']:,}")
    if r.get("span_records"):
        table.add_row("OTLP span records", f"{r['span_records']:,}")
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
    pipeline = r.get("memory_pipeline")
    if pipeline and pipeline["agents"]:
        table.add_row("memory pipeline", pipeline_line(pipeline))
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
    out.print(f"[dim]followup rate: {FOLLOWUP_CAVEAT}.[/dim]")
    out.print(f'[dim]query it: duckdb -readonly {r["db"]} "SELECT * FROM followup_rate"[/dim]')  # noqa: S608 - a hint printed for the user, not executed
    runs = [run["run_id"] for run in r["benchmark_runs"]]
    if len(runs) >= 2:
        out.print(
            f"[dim]compare runs: memdiag compare --baseline {runs[0]} --candidate {runs[1]} "
            f"--db {r['db']}[/dim]"
        )


_HEADERS = {
    "ts": "time (UTC)",
    "match_ratio": "ratio",
    "matched_count": "matched",
    "keyword_count": "keywords",
}


def rich_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> Table:
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


def print_observation_stats(r: dict[str, Any]) -> None:
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
    if r.get("strength") is not None:
        table.add_row(
            "strength", f"{r['strength']:.3f} (after {r['strength_steps']:,} judged turns)"
        )
    out.print(table)
    if not judged:
        err.print(
            "no turn has judged this observation yet (check the id, or whether its "
            "injections got responses)"
        )


# -- benchmark: report scores, compare ------------------------------------------------


def _side_name(side: dict[str, Any]) -> str:
    from rich.markup import escape  # run ids and conditions are the harness's own strings

    return escape(side["run_id"] + (f" [{side['condition']}]" if side["condition"] else ""))


def print_comparison(r: dict[str, Any]) -> None:
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
    metrics = paired_metrics_table(
        f"metrics: candidate − baseline, {ci['level']:.0%} interval over questions "
        "(fractions in %, their deltas in points; latency_ms in ms)",
        r["metrics"],
    )
    if metrics.row_count:
        out.print(metrics)
    un = r["unpaired"]
    for side, items in (("baseline", un["baseline_only"]), ("candidate", un["candidate_only"])):
        if items:
            shown = ", ".join(f"{i['question_id']}#{i['repeat_index']}" for i in items[:10])
            more = f" and {len(items) - 10} more (--json lists all)" if len(items) > 10 else ""
            out.print(f"[yellow]only in the {side}:[/yellow] {shown}{more} — not compared")


def _paired_cells(p: dict[str, Any]) -> list[str]:
    """Baseline, candidate, delta and interval of one paired metric (for a table: fractions
    in %, their deltas in points; latency in ms, tokens in tokens)."""
    from memdiag.analytics.metrics import fmt

    u, ci = p["unit"], p["ci"]
    return [
        fmt(u, p["baseline_mean"], bare=True),
        fmt(u, p["candidate_mean"], bare=True),
        fmt(u, p["delta"], True, bare=True),
        f"[{fmt(u, ci['low'], True, bare=True)}, {fmt(u, ci['high'], True, bare=True)}]",
    ]


def paired_metrics_table(title: str, metrics: dict[str, dict[str, Any] | None]) -> Table:
    """One row per paired metric (``compare``, ``report scores``); a metric no pair carries
    (no score sent, say) is left out."""
    table = Table(title=title, title_justify="left")
    for col in ("metric", "baseline", "candidate", "delta", "interval", "pairs"):
        table.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for name, p in metrics.items():
        if p is not None:
            table.add_row(name, *_paired_cells(p), f"{p['pairs']:,}")
    return table


def print_gate(v: Any) -> None:
    """The gate's verdict: the metrics judged, the notes, then the one-line reason."""
    from rich.markup import escape

    from memdiag.analytics.gate import CANNOT_JUDGE, ERROR, PASS, REGRESSION
    from memdiag.analytics.metrics import fmt

    if v.metrics:
        title = f"gate: {v.baseline.get('run_id')} → {v.candidate.get('run_id')}"
        table = Table(title=escape(title),
                      title_justify="left", box=None, pad_edge=False)  # fmt: skip
        for col in ("metric", "base", "cand", "Δ", "95% interval", "allowed", ""):
            table.add_column(col, justify="left" if col in ("metric", "") else "right",
                             no_wrap=True)  # fmt: skip
        for mv in v.metrics:
            d = mv.as_dict()
            cells = _paired_cells(d) if mv.paired is not None else ["—"] * 4
            side = "≥ " if d["higher_is_better"] else "≤ "
            mark = {PASS: "[green]pass[/green]", REGRESSION: "[red bold]regression[/red bold]",
                    CANNOT_JUDGE: "[yellow]cannot judge[/yellow]"}[mv.verdict]  # fmt: skip
            allowed = side + fmt(d["unit"], d["limit"], True, bare=d["unit"] != "fraction")
            table.add_row(d["metric"], *cells, allowed, mark)
        out.print(table)
    for n in v.notes:
        out.print(f"[dim]note: {escape(n)}[/dim]")
    colour = {PASS: "green", REGRESSION: "red"}.get(v.verdict, "yellow")
    to = err if v.verdict == ERROR else out  # an error is not a result
    to.print(f"[{colour} bold]{escape(v.reason)}[/{colour} bold]", soft_wrap=True)


# -- status -----------------------------------------------------------------------------


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
    head.add_row("memory pipeline", pipeline_line(st.get("pipeline")))
    fell = recall_fell_line(st.get("pipeline"))
    if fell:
        head.add_row("recall", fell)
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

    graph = st["misleading"].get("graph", [])
    title = f"misleading memories: {st['misleading']['count']}"
    if graph:
        title += f" (and {len(graph)} of the knowledge graph)"
    mis = Table(title=title, title_justify="left", box=None)
    mis.add_column("observation")
    mis.add_column("failed", justify="right")
    mis.add_column("weight", justify="right")
    for m in st["misleading"]["top"]:
        mis.add_row(m["observation_id"], str(m["fail_count"]), _cell(m["weight"]))
    for g in graph:  # the knowledge graph's, marked as such
        mis.add_row(f"[dim]{g['kind']}[/dim] {g['id']}", str(g["failed_sessions"] or "—"),
                    _cell(g["weight"]))  # fmt: skip
    out.print(Columns([cats, mis], padding=(0, 4)))
    unused = st.get("unused_memories") or {"top": []}
    if unused["top"]:
        unused_table = Table(
            title=f"dead weight: judged in {unused['min_injections']}+ turns, used in none",
            title_justify="left",
            box=None,
        )
        for col in ("memory", "judged turns", "strength"):
            unused_table.add_column(col, justify="left" if col == "memory" else "right")
        for u in unused["top"]:
            unused_table.add_row(
                u["observation_id"], f"{u['judged_turns']:,}", _cell(u["strength"])
            )
        out.print(unused_table)

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


def pipeline_line(p: dict[str, Any] | None) -> str:
    """The recall pipeline at a glance: agents broken, then the worst coverage and recall."""
    if p is None:
        return "[dim]not in this file yet (start `memdiag sink` on it once to upgrade it)[/dim]"
    if not p["agents"]:
        return "[dim]no memory events (memdiag.memory)[/dim]"
    broken = p["broken"]
    parts = [
        f"[bold red]{len(broken)} of {p['agents']} agents broken[/bold red] "
        f"({', '.join(b['agent_id'] for b in broken[:4])}{', …' if len(broken) > 4 else ''})"
        if broken
        else f"{p['agents']} agents, none broken"
    ]
    for key, label in (("worst_coverage", "worst coverage"), ("worst_recall", "worst recall")):
        w = p[key]
        if w is not None:
            parts.append(f"{label} {_pct(w['value'])} ({w['agent_id']})")
    return " · ".join(parts)


def recall_fell_line(p: dict[str, Any] | None) -> str | None:
    """The agents whose SRR fell from their previous window (``status``), those that stopped
    probing, and how many could be judged; None without memory events."""
    from rich.markup import escape

    from memdiag.analytics.status import span_text

    if p is None or not p["agents"]:
        return None
    f = p.get("recall_fell")
    if f is None:
        return "[dim]fall check: start `memdiag sink` on this file once to upgrade it[/dim]"
    window = span_text(f["window_seconds"])
    rule = (f"the last {window} against the {window} before: over {f['drop_points']:g} "
            f"points and {f['min_z']:g} standard errors, {f['min_probed']}+ probed memories "
            "each")  # fmt: skip
    judged = f"{f['checked']} of {f['probing_agents']} probing agents judged"
    parts = [
        f"{escape(a['agent_id'])} {_pct(a['previous_semantic_recall_rate'])} → "
        f"{_pct(a['semantic_recall_rate'])} (as of {_minute(a['window_end'])})"
        for a in f["agents"][:4]
    ]
    if len(f["agents"]) > 4:
        parts.append(f"and {len(f['agents']) - 4} more")
    stopped = [escape(a["agent_id"]) for a in f["stopped_probing"]]
    if not f["checked"] and not f["stopped_probing"]:
        return (
            f"[dim]not judged: no agent has {f['min_probed']}+ probed memories in both the "
            f"last {window} and the {window} before ({f['probing_agents']} probing)[/dim]"
        )
    n = len(f["agents"])
    text = "no agent's recall fell"
    if n:
        text = f"[bold red]fell for {n} agent{'s' if n != 1 else ''}[/bold red]: {', '.join(parts)}"
    if stopped:
        text += f"; [yellow]probes stopped[/yellow]: {', '.join(stopped[:4])}"
    return f"{text} [dim]({judged}; {rule})[/dim]"


def _minute(v: datetime | None) -> str | None:
    return None if v is None else v.astimezone(UTC).strftime("%m-%d %H:%M")


def print_pipeline_health(rows: list[dict[str, Any]], agent: str | None) -> None:
    if not rows:
        err.print(
            f"no memory events for agent {agent!r}"
            if agent
            else "no memory events yet: "
            "publish memory_written, memory_indexed, recall_probe and ambient_context to "
            "memdiag.memory"
        )
        return
    broken = sum(1 for r in rows if r["broken"])
    table = Table(
        title=f"recall pipeline: {len(rows)} agent{'s' if len(rows) != 1 else ''}, "
        f"{broken} broken (red)",
        title_justify="left",
        box=None,
    )
    longest = max(len(r["agent_id"]) for r in rows)
    table.add_column("agent", overflow="fold", min_width=min(longest, 24))
    for header in ("written", "unindexed", "unreach.", "PC", "SRR", "ATR"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("broken since", no_wrap=True)
    for r in rows:
        table.add_row(
            f"[bold red]{r['agent_id']}[/bold red]" if r["broken"] else r["agent_id"],
            f"{r['written']:,}",
            f"{r['unindexed']:,}",
            f"{r['unreachable']:,}",
            _pct(r["pipeline_coverage"]),
            _pct(r["semantic_recall_rate"]),
            _pct(r["ambient_trigger_rate"]),
            _minute(r["broken_since"]) or "—",
        )
    out.print(table)
    missing = [r for r in rows if r["missed"]]
    if missing:
        why = Table(title="why probes missed (each probed memory's latest probe)",
                    title_justify="left", box=None)  # fmt: skip
        why.add_column("agent", overflow="fold", min_width=min(longest, 24))
        for header in ("probed", "missed", "not indexed", "below thr.", "aliased", "outranked"):
            why.add_column(header, justify="right", no_wrap=True)
        for r in missing:
            aliased = f"{r['aliased_misses']:,} ({_pct(r['aliasing_rate'])})"
            why.add_row(
                r["agent_id"],
                f"{r['probed']:,}",
                f"{r['missed']:,}",
                f"{r['not_indexed_misses']:,}",
                f"{r['below_threshold_misses']:,}",
                f"[yellow]{aliased}[/yellow]" if r["aliased_misses"] else aliased,
                f"{r['outranked_misses']:,}",
            )
        out.print(why)
    out.print(
        "[dim]PC (pipeline coverage): indexed / written. SRR (semantic recall rate): probed "
        "memories their own probe found in its top k above its threshold. ATR (ambient trigger "
        "rate): written memories in the latest ambient context. Unreach.: past the deadline "
        "unindexed and not in the latest ambient context: no path brings them back. Aliased: "
        "a memory with the same name key (another day's daily note) came back instead, its "
        "share of the probed memories in brackets. Times UTC; --json for every column; "
        "`memdiag explain-memory ID --agent A` for one memory.[/dim]"
    )
    if broken:
        out.print(
            "[dim]broken: a memory is unindexed (not indexed within "
            "MEMDIAG_INDEX_DEADLINE_SECONDS) and nothing was indexed since it was written. An "
            "agent that never reports memory_indexed shows as broken: memdiag cannot know "
            "otherwise.[/dim]"
        )


def print_recall_trend(rows: list[dict[str, Any]], by: str, agent: str | None) -> None:
    """``query recall-trend``: one table per agent, oldest bucket (or smallest memory count)
    first, with a bar of the SRR."""
    from rich.markup import escape

    if not rows:
        err.print(
            f"no recall probes or ambient contexts for agent {escape(repr(agent))}"
            if agent
            else "no recall probes or ambient contexts yet: publish recall_probe and "
            "ambient_context to memdiag.memory"
        )
        return
    agents: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        agents.setdefault(r["agent_id"], []).append(r)
    by_count = by == "memory-count"
    for name, series in agents.items():
        what = "memory count" if by_count else f"{by} (UTC)"
        table = Table(title=f"{escape(name)}: recall by {what}", title_justify="left", box=None)
        table.add_column("memories" if by_count else by, no_wrap=True)
        if not by_count:
            table.add_column("written", justify="right")
        for header in ("probed", "SRR", "", "contexts", "ATR"):
            table.add_column(header, justify="right" if header else "left", no_wrap=True)
        for r in series:
            if by_count:
                lo, hi = r["memory_count_from"], r["memory_count_to"]
                first = [f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"]
            else:
                start = r["bucket_start"].astimezone(UTC)
                fmt = "%Y-%m-%d %H:%M" if by == "hour" else "%Y-%m-%d"
                first = [start.strftime(fmt), f"{r['written']:,}"]
            srr = r["semantic_recall_rate"]
            bar = "" if srr is None else "█" * round(10 * srr)
            contexts, atr = f"{r['ambient_contexts']:,}", _pct(r["ambient_trigger_rate"])
            table.add_row(*first, f"{r['probed']:,}", _pct(srr), bar, contexts, atr)
        out.print(table)
    out.print(
        "[dim]SRR: of the memories probed in the bucket, those their own (latest) probe there "
        "found. ATR: the mean, over the bucket's ambient contexts, of the share of the agent's "
        "memories written by then that the context names. "
        + ("Memories: the agent's written memories at each probe or context. "
           if by_count else "Written: the agent's memories written by the bucket's end. ")
        + "--json for every column.[/dim]"
    )  # fmt: skip
