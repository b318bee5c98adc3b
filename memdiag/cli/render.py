"""How each answer looks in a terminal (``--json`` prints the answer itself).

One renderer per question of :mod:`memdiag.views.questions`, registered in :data:`TERMINAL`.
The rules every one keeps:

- nothing is cut off: ids and text wrap inside their column, numbers never do, and a table
  that cannot fit the terminal's width even so is printed stacked, one record a block
  (:func:`show`); off a terminal the width is wide (``COLUMNS`` if set);
- a shortened list says so: "5 of 6", and how to see the rest;
- caveats stand beside the number they qualify.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from memdiag.cli.common import err, out, print_json, settings_of
from memdiag.contract import FOLLOWUP_CAVEAT, MISLEADING_CAVEAT

# -- tables that never cut --------------------------------------------------------------


def table(
    title: str | None,
    columns: Sequence[str],
    right: Sequence[str] = (),
    wrap: Sequence[str] = (),
    box: bool = True,
) -> Table:
    """A table that never cuts: ``right`` columns are numbers (right-aligned), ``wrap``
    columns are prose that wraps at word boundaries, and every other column (ids, names,
    times) keeps each value on one line. :func:`show` stacks it when it cannot fit."""
    from rich import box as boxes

    t = Table(
        title=title, title_justify="left", box=boxes.HEAVY_HEAD if box else None, pad_edge=box
    )
    for c in columns:
        if c in wrap:
            t.add_column(c, overflow="fold")
        else:
            t.add_column(c, justify="right" if c in right else "left", no_wrap=True)
    return t


def _text(value: Any) -> Text:
    return value if isinstance(value, Text) else Text.from_markup(str(value))


def min_width(t: Table) -> int:
    """The narrowest ``t`` prints without cutting a cell: its one-line columns at their
    widest cell (header included), its wrapping ones at their longest word, with the
    padding and rules between them."""
    need = 0
    for c in t.columns:
        texts = [_text(c.header), *(_text(v) for v in c.cells)]
        if c.no_wrap:
            need += max(x.cell_len for x in texts)
        else:
            need += max((len(w) for x in texts for w in x.plain.split()), default=1)
    n = len(t.columns)
    pad = t.padding[1] + t.padding[3] if len(t.padding) == 4 else 2
    need += pad * n - (0 if t.pad_edge else pad)
    return need + (n + 1 if t.box is not None else 0)


def show(t: Table, to: Any = None) -> None:
    """Print ``t``; stacked (one block a row, ``column: value``) when even wrapped it is wider
    than the console, so that no cell is ever cut."""
    console = to or out
    if min_width(t) <= console.width:
        console.print(t)
        return
    if t.title:
        console.print(_text(t.title))
    headers = [_text(c.header).plain for c in t.columns]
    cells = [list(c.cells) for c in t.columns]
    for i in range(t.row_count):
        for h, column in zip(headers, cells, strict=True):
            line = Text.from_markup(f"  [dim]{escape(h) or '·'}:[/dim] ")
            line.append(_text(column[i]))
            console.print(line, overflow="fold")
        if i < t.row_count - 1:
            console.print()


def cut(shown: int, total: int, what: str, how: str) -> str | None:
    """ "5 of 6 misleading memories shown: memdiag query misleading for all", when cut."""
    if total <= shown:
        return None
    return f"{shown:,} of {total:,} {what} shown: {how}"


def note(text: str | None, to: Any = None) -> None:
    if text:
        (to or err).print(f"[dim]{text}[/dim]", soft_wrap=False)


# -- cells --------------------------------------------------------------------------------


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def cell(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return escape(str(v))


def minute(v: datetime | None) -> str:
    return "—" if v is None else v.astimezone(UTC).strftime("%m-%d %H:%M")


def when(v: datetime | None) -> str:
    return "—" if v is None else v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(v: datetime | None) -> str:
    if v is None:
        return "never"
    seconds = (datetime.now(UTC) - v.astimezone(UTC)).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def filters_text(args: argparse.Namespace) -> str:
    parts = [
        f"{k}={getattr(args, k)}"
        for k in ("org", "project", "since")
        if getattr(args, k, None) not in (None, "")
    ]
    return f" ({', '.join(parts)})" if parts else ""


def link(args: argparse.Namespace, path: str) -> str | None:
    """The page of ``memdiag serve`` at ``path``, when MEMDIAG_SERVE_URL says where it is."""
    from memdiag.contract.pages import url

    return url(settings_of(args).serve_url, path) or None


# -- run and demo -------------------------------------------------------------------------


def print_run_report(r: dict[str, Any]) -> None:
    t = table(f"memdiag run — {escape(r['input'])}", ["", "value"], wrap=["value"])
    t.show_header = False
    rate = r["followup_rate"]
    rows: list[tuple[str, str]] = [("events", f"{r['events']:,}")]
    if r.get("span_records"):
        rows.append(("OTLP span records", f"{r['span_records']:,}"))
    rows += [
        ("searches", f"{r['searches']:,} (agent and viewer, empty results included)"),
        ("agent searches", f"{r['agent_searches']:,} (the followup rate's denominator)"),
        ("followups", f"{r['followups']:,}"),
        ("followup rate", "n/a" if rate is None else f"{rate:.1%}"),
    ]
    fb = r["feedback"]
    judged = fb["used"] + fb["ignored"]
    rows.append(
        (
            "injected memories used",
            f"{fb['used']:,} of {judged:,} ({fb['used'] / judged:.0%})" if judged else "n/a",
        )
    )
    outcomes = r["sessions_by_outcome"]
    if outcomes:
        rows.append(
            (
                "sessions",
                ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1])),
            )
        )
        top = sorted(
            ((k, v) for k, v in r["failure_categories"].items() if v), key=lambda kv: -kv[1]
        )
        if top:
            rows.append(("failures by category", ", ".join(f"{k} {v}" for k, v in top)))
        rows.append(("misleading memories", f"{r['misleading_observations']:,}"))
    pipeline = r.get("memory_pipeline")
    if pipeline and pipeline["agents"]:
        rows.append(("memory pipeline", pipeline_line(pipeline)))
    for run in r["benchmark_runs"]:
        rows.append(
            (
                f"run {escape(run['run_id'])}",
                f"accuracy {run['accuracy']:.1%}; of its {run['judgements']:,} answers, "
                f"reader failures {run['reader_failures']}, retrieval failures "
                f"{run['retrieval_failures']}"
                + (f", unattributed {run['unattributed']}" if run.get("unattributed") else ""),
            )
        )
    dead = ", ".join(f"{k} {v}" for k, v in r["dead_letters_by_reason"].items())
    rows.append(("dead letters", f"{r['dead_letters']:,}" + (f"  ({dead})" if dead else "")))
    rows.append(("time", f"{r['seconds']:.1f}s"))
    for k, v in rows:
        t.add_row(f"[bold]{k}[/bold]", v)
    show(t)
    out.print(f"[dim]followup rate: {FOLLOWUP_CAVEAT}.[/dim]")
    hint = f'duckdb -readonly {escape(r["db"])} "SELECT * FROM followup_rate"'  # noqa: S608 - printed, not run
    out.print(f"[dim]query it: {hint}[/dim]")
    runs = [run["run_id"] for run in r["benchmark_runs"]]
    if len(runs) >= 2:
        out.print(
            f"[dim]compare runs: memdiag compare --baseline {escape(runs[0])} --candidate "
            f"{escape(runs[1])} --db {escape(r['db'])}[/dim]"
        )


# -- status -------------------------------------------------------------------------------


def print_status(st: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.panel import Panel

    db = settings_of(args).duckdb_path
    fu, fb = st["followup"], st["feedback"]
    head = table(None, ["", "value"], wrap=["value"], box=False)
    head.show_header = False
    proxies = st.get("proxies") or {}
    rows = [
        (
            "followup rate",
            f"{pct(fu['rate'])} of {fu['agent_searches']:,} agent searches "
            f"[dim]({fu['caveat']})[/dim]" + _proxy_note(proxies.get("followups")),
        ),
        (
            "memories used",
            f"{pct(fb['used_share'])} of {fb['used'] + fb['ignored']:,} "
            f"injected-and-answered ({fb['observations']:,} observations) [dim]({fb['caveat']})"
            "[/dim]" + _proxy_note(proxies.get("ignored")),
        ),
    ]
    sessions = st["sessions"]
    total = sum(sessions.values())
    failed = total - sessions.get("accepted", 0)
    rows.append(
        (
            "sessions",
            f"{total:,}: "
            + ", ".join(f"{k} {v:,}" for k, v in sessions.items())
            + (f"  ({failed / total:.0%} failed)" if total else ""),
        )
    )
    rows.append(("memory pipeline", pipeline_line(st.get("pipeline"))))
    fell = recall_fell_line(st.get("pipeline"))
    if fell:
        rows.append(("recall", fell))
    fresh = st["freshness"]
    rows.append(
        (
            "freshness",
            f"newest event {when(fresh['newest_event'])} UTC; last written "
            f"{ago(fresh['last_written'])}",
        )
    )
    for k, v in rows:
        head.add_row(f"[bold]{k}[/bold]", v)
    title = f"memdiag status — {escape(db)}{escape(filters_text(args))}"
    out.print(Panel(head, title=title, title_align="left", expand=False))

    cats = table(
        "failed sessions by category", ["category", "sessions", ""], ["sessions"], box=False
    )
    most = max((c["sessions"] for c in st["failure_categories"]), default=0) or 1
    for c in st["failure_categories"]:
        cats.add_row(
            c["failure_category"], f"{c['sessions']:,}", "█" * round(12 * c["sessions"] / most)
        )
    m = st["misleading"]
    graph = m.get("graph", [])
    title = f"misleading memories: {m['count']:,}"
    if m.get("graph_count", len(graph)):
        title += f" (and {m.get('graph_count', len(graph)):,} of the knowledge graph)"
    mis = table(
        title, ["memory", "failed sessions", "weight"], ["failed sessions", "weight"], box=False
    )
    for row in m["top"]:
        mis.add_row(escape(row["observation_id"]), str(row["fail_count"]), cell(row["weight"]))
    for g in graph:
        mis.add_row(
            f"[dim]{g['kind']}[/dim] {escape(g['id'])}",
            str(g["failed_sessions"] or "—"),
            cell(g["weight"]),
        )
    show(cats)
    show(mis)
    note(
        cut(
            len(m["top"]),
            m["count"],
            "misleading memories",
            "memdiag query misleading (--top N here)",
        ),
        out,
    )
    note(
        cut(
            len(graph),
            m.get("graph_count", len(graph)),
            "graph entities and edges",
            "memdiag query misleading --graph",
        ),
        out,
    )
    if m["count"]:
        note(f"misleading: {MISLEADING_CAVEAT}", out)
    unused = st.get("unused_memories") or {"top": []}
    if unused["top"]:
        u = table(
            f"dead weight: judged in {unused['min_injections']}+ turns, used in none: "
            f"{unused.get('count', len(unused['top'])):,}",
            ["memory", "judged turns", "strength"],
            ["judged turns", "strength"],
            box=False,
        )
        for row in unused["top"]:
            u.add_row(
                escape(row["observation_id"]), f"{row['judged_turns']:,}", cell(row["strength"])
            )
        show(u)
        note(
            cut(
                len(unused["top"]),
                unused.get("count", 0),
                "dead-weight memories",
                "memdiag query unused-memories",
            ),
            out,
        )
    runs = table(
        "benchmark runs (most recent first)",
        ["run", "accuracy", "reader fail", "retrieval fail", "unattributed", "judgements"],
        ["accuracy", "reader fail", "retrieval fail", "unattributed", "judgements"],
        box=False,
    )
    for r in st["runs"]:
        runs.add_row(
            escape(r["run_id"]),
            pct(r["accuracy"]),
            str(r["reader_failures"]),
            str(r["retrieval_failures"]),
            str(r["unattributed"]),
            f"{r['judgements']:,}",
        )
    dead = table("dead letters", ["reason", "count"], ["count"], box=False)
    for d in st["dead_letters"]:
        dead.add_row(d["reason"], f"{d['dead_letters']:,}")
    if not st["dead_letters"]:
        dead.add_row("none", "0")
    if st["runs"]:
        show(runs)
    else:
        out.print("no benchmark runs")
    show(dead)
    _pipeline_links(st, args)


def _proxy_note(p: dict[str, Any] | None) -> str:
    """A proxy ``calibrate`` finds uninformative on this file, said beside it."""
    if not p or p.get("informative", True):
        return ""
    return f"\n[yellow]{escape(p['words'])}[/yellow]"


def _pipeline_links(st: dict[str, Any], args: argparse.Namespace) -> None:
    """With MEMDIAG_SERVE_URL set: the pages of the causes (a broken agent, the first
    misleading memory)."""
    from memdiag.contract.pages import agent_path, memory_path

    p = st.get("pipeline") or {}
    for b in (p.get("broken") or [])[:3]:
        if href := link(args, agent_path(b["agent_id"])):
            out.print(f"[dim]broken {escape(b['agent_id'])}: {escape(href)}[/dim]")
    for m in st["misleading"]["top"][:1]:
        if href := link(args, memory_path(m["observation_id"])):
            out.print(f"[dim]misleading {escape(m['observation_id'])}: {escape(href)}[/dim]")


def pipeline_line(p: dict[str, Any] | None) -> str:
    """The recall pipeline at a glance: agents broken, then the worst coverage and recall."""
    if p is None:
        return "[dim]not in this file yet (start `memdiag sink` on it once to upgrade it)[/dim]"
    if not p["agents"]:
        return "[dim]no memory events (memdiag.memory)[/dim]"
    broken = p["broken"]
    names = ", ".join(escape(b["agent_id"]) for b in broken[:4])
    more = f" and {len(broken) - 4} more" if len(broken) > 4 else ""
    parts = [
        f"[bold red]{len(broken)} of {p['agents']} agents broken[/bold red] ({names}{more})"
        if broken
        else f"{p['agents']} agents, none broken"
    ]
    for key, label in (("worst_coverage", "worst coverage"), ("worst_recall", "worst recall")):
        w = p[key]
        if w is not None:
            parts.append(f"{label} {pct(w['value'])} ({escape(w['agent_id'])})")
    return " · ".join(parts)


def recall_fell_line(p: dict[str, Any] | None) -> str | None:
    """The agents whose SRR fell from their previous window (``status``), those that stopped
    probing, and how many could be judged; None without memory events."""
    from memdiag.analytics.status import span_text

    if p is None or not p["agents"]:
        return None
    f = p.get("recall_fell")
    if f is None:
        return "[dim]fall check: start `memdiag sink` on this file once to upgrade it[/dim]"
    window = span_text(f["window_seconds"])
    rule = (
        f"the last {window} against the {window} before: over {f['drop_points']:g} "
        f"points and {f['min_z']:g} standard errors, {f['min_probed']}+ probed memories "
        "each"
    )
    judged = f"{f['checked']} of {f['probing_agents']} probing agents judged"
    parts = [
        f"{escape(a['agent_id'])} {pct(a['previous_semantic_recall_rate'])} → "
        f"{pct(a['semantic_recall_rate'])} (as of {minute(a['window_end'])})"
        for a in f["agents"][:4]
    ]
    if len(f["agents"]) > 4:
        parts.append(f"and {len(f['agents']) - 4} more (--json lists all)")
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
        more = f" and {len(stopped) - 4} more" if len(stopped) > 4 else ""
        text += f"; [yellow]probes stopped[/yellow]: {', '.join(stopped[:4])}{more}"
    return f"{text} [dim]({judged}; {rule})[/dim]"


# -- the queries --------------------------------------------------------------------------


def print_failure_distribution(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    total = sum(r["sessions"] for r in rows)
    t = table(
        f"failed sessions by category{escape(filters_text(args))}: {total:,}",
        ["failure_category", "sessions", "share"],
        ["sessions", "share"],
    )
    for r in rows:
        t.add_row(
            r["failure_category"],
            f"{r['sessions']:,}",
            pct(r["share"]),
        )
    show(t)


def print_misleading(rows: Any, args: argparse.Namespace) -> None:
    f = escape(filters_text(args))
    if args.graph:
        if not rows:
            out.print(f"no misleading graph entities or edges{f}")
            return
        t = table(
            f"misleading graph entities and edges{f}: {rows.total:,}, in >= 3 failed "
            "sessions and no accepted one",
            ["kind", "id", "failed", "accepted", "weight"],
            ["failed", "accepted", "weight"],
        )
        for r in rows:
            t.add_row(
                r["kind"],
                escape(r["id"]),
                cell(r["failed_sessions"]),
                cell(r["accepted_sessions"]),
                cell(r["weight"]),
            )
    else:
        if not rows:
            out.print(f"no misleading memories{f}")
            return
        t = table(
            f"misleading memories{f}: {rows.total:,}, in >= 3 failed sessions and no accepted one",
            ["memory", "failed", "accepted", "weight", "latest failed session"],
            ["failed", "accepted", "weight"],
        )
        for r in rows:
            t.add_row(
                escape(r["observation_id"]),
                f"{r['fail_count']:,}",
                f"{r['success_count']:,}",
                cell(r["weight"]),
                cell(r["latest_failed_session_id"]),
            )
    show(t)
    note(cut(len(rows), rows.total, "rows", "--limit N for more"))
    note(f"misleading: {MISLEADING_CAVEAT}; `memdiag explain SESSION_ID` reads one", out)


def print_unused_memories(rows: Any, args: argparse.Namespace) -> None:
    since = f" since {escape(args.since)}" if getattr(args, "since", None) else ""
    if not rows:
        err.print(
            f"no memory judged in {args.min_injections}+ turns{since} went unused in all of them"
        )
        return
    t = table(
        f"memories judged in {args.min_injections}+ turns{since}, used in none: {rows.total:,}",
        ["observation_id", "judged_turns", "sessions", "strength", "weight", "last judged (UTC)"],
        ["judged_turns", "sessions", "strength", "weight"],
    )
    for r in rows:
        t.add_row(
            escape(r["observation_id"]),
            f"{r['judged_turns']:,}",
            f"{r['sessions']:,}",
            cell(r["strength"]),
            cell(r["weight"]),
            cell(r["last_judged_at"]),
        )
    show(t)
    note(cut(len(rows), rows.total, "rows", "--limit N for more"))


def print_observation_stats(r: dict[str, Any], args: argparse.Namespace) -> None:
    from memdiag.contract.pages import memory_path

    t = table(f"memory {escape(r['observation_id'])}", ["", "value"], wrap=["value"])
    t.show_header = False
    rows = [
        ("used", f"{r['used']:,}"),
        ("ignored", f"{r['ignored']:,}"),
        ("used share", pct(r["used_share"])),
    ]
    if r["weight"] is not None:
        rows += [
            ("weight", f"{r['weight']:.3f}"),
            (
                "failed_sessions / accepted_sessions",
                f"{r['failed_sessions']} / {r['accepted_sessions']}",
            ),
            (
                "misleading",
                "[bold red]yes[/bold red] (co-occurrence with failure, not cause)"
                if r["misleading"]
                else "no",
            ),
        ]
    if r.get("strength") is not None:
        rows.append(
            ("strength", f"{r['strength']:.3f} (after {r['strength_steps']:,} judged turns)")
        )
    if r.get("dead_weight"):
        rows.append(("dead weight", "[yellow]yes[/yellow]: judged often, used in none"))
    for k, v in rows:
        t.add_row(f"[bold]{k}[/bold]", v)
    show(t)
    if not r["used"] + r["ignored"]:
        err.print("no turn has judged it yet: its injections got no response")
    if href := link(args, memory_path(r["observation_id"])):
        note(f"its page: {href}", out)


def print_observation_history(rows: Any, args: argparse.Namespace) -> None:
    from memdiag.analytics.explain import verdict_rule
    from memdiag.contract.words import SEMANTIC

    semantic = any(r.get("detector") == SEMANTIC for r in rows)
    t = table(
        f"{escape(args.observation_id)}: {len(rows):,} verdicts, the most recent first",
        [
            "time (UTC)",
            "session_id",
            "turn_id",
            "signal",
            "ratio",
            "matched",
            "keywords",
            *(["similarity", "rule"] if semantic else []),
            "outcome",
        ],
        ["ratio", "matched", "keywords", "similarity"],
    )
    for r in rows:
        outcome = (
            "—"
            if r["outcome"] is None
            else r["outcome"] + (f" · {r['failure_category']}" if r["failure_category"] else "")
        )
        t.add_row(
            cell(r["ts"]),
            escape(r["session_id"]),
            escape(r["turn_id"]),
            r["signal"],
            f"{r['match_ratio']:.2f}",
            str(r["matched_count"]),
            str(r["keyword_count"]),
            *(
                [
                    "—" if r["similarity"] is None else f"{r['similarity']:.3f}",
                    verdict_rule(r),
                ]
                if semantic
                else []
            ),
            escape(outcome),
        )
    show(t)
    note(cut(len(rows), rows.total, "verdicts", "--limit N for more"))


def print_pipeline_health(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    if not rows:
        err.print(
            "no memory events yet: publish memory_written, memory_indexed, recall_probe "
            "and ambient_context to memdiag.memory"
        )
        return
    broken = sum(1 for r in rows if r["broken"])
    t = table(
        f"recall pipeline: {len(rows)} agent{'s' if len(rows) != 1 else ''}, {broken} broken (red)",
        ["agent", "written", "unindexed", "unreach.", "PC", "SRR", "ATR", "broken"],
        ["written", "unindexed", "unreach.", "PC", "SRR", "ATR", "broken"],
        box=False,
    )
    for r in rows:
        name = escape(r["agent_id"])
        t.add_row(
            f"[bold red]{name}[/bold red]" if r["broken"] else name,
            f"{r['written']:,}",
            f"{r['unindexed']:,}",
            f"{r['unreachable']:,}",
            pct(r["pipeline_coverage"]),
            pct(r["semantic_recall_rate"]),
            pct(r["ambient_trigger_rate"]),
            minute(r["broken_since"]),
        )
    show(t)
    missing = [r for r in rows if r["missed"]]
    if missing:
        why = table(
            "why probes missed (each probed memory's latest name probe)",
            ["agent", "probed", "missed", "not indexed", "below thr.", "aliased", "outranked"],
            ["probed", "missed", "not indexed", "below thr.", "aliased", "outranked"],
            box=False,
        )
        for r in missing:
            aliased = f"{r['aliased_misses']:,} ({pct(r['aliasing_rate'])})"
            why.add_row(
                escape(r["agent_id"]),
                f"{r['probed']:,}",
                f"{r['missed']:,}",
                f"{r['not_indexed_misses']:,}",
                f"{r['below_threshold_misses']:,}",
                f"[yellow]{aliased}[/yellow]" if r["aliased_misses"] else aliased,
                f"{r['outranked_misses']:,}",
            )
        show(why)
    tasked = [r for r in rows if r.get("task_probed")]
    if tasked:
        gap = table(
            "recall by query source (each memory's latest probe of each)",
            ["agent", "probed", "SRR", "task probed", "task recall", "gap"],
            ["probed", "SRR", "task probed", "task recall", "gap"],
            box=False,
        )
        for r in tasked:
            points = r["query_formulation_gap"]
            text = "n/a" if points is None else f"{points * 100:+.0f} pts"
            gap.add_row(
                escape(r["agent_id"]),
                f"{r['probed']:,}",
                pct(r["semantic_recall_rate"]),
                f"{r['task_probed']:,}",
                pct(r["task_recall_rate"]),
                f"[yellow]{text}[/yellow]" if points is not None and points > 0 else text,
            )
        show(gap)
    out.print(
        "[dim]PC (pipeline coverage): indexed / written. SRR (semantic recall rate): probed "
        "memories their own name's probe found in its top k above its threshold. ATR (ambient "
        "trigger rate): written memories in the latest ambient context (query recall-trend's "
        "ATR is the mean over a bucket's contexts, so the two differ). Unreach.: past the deadline "
        "unindexed and not in the latest ambient context: no path brings them back. Aliased: "
        "a memory with the same name key (another day's daily note) came back instead, its "
        "share of the probed memories in brackets. "
        + (
            "Task probed: memories probed with a query made from a task they should serve (not "
            "in SRR); gap: SRR minus their recall, the query-formulation failure (the pipeline "
            "finds the memory by its name, a task's words do not reach it). "
            if tasked
            else ""
        )
        + "Times UTC; --json for every column; "
        "`memdiag explain-memory ID --agent A` for one memory.[/dim]"
    )
    if broken:
        out.print(
            "[dim]broken: a memory is unindexed (not indexed within "
            "MEMDIAG_INDEX_DEADLINE_SECONDS) and nothing was indexed since it was written. An "
            "agent that never reports memory_indexed shows as broken: memdiag cannot know "
            "otherwise.[/dim]"
        )
    _unindexed_links(rows, args)


def _unindexed_links(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Each agent's unindexed memories by id (the oldest first), and where to read more."""
    from memdiag.contract.pages import agent_path

    for r in rows:
        if not r["unindexed"]:
            continue
        ids = r.get("unindexed_memory_ids") or []
        more = f" ({len(ids)} of {r['unindexed']:,})" if r["unindexed"] > len(ids) else ""
        href = link(args, agent_path(r["agent_id"]))
        out.print(f"[bold]{escape(r['agent_id'])}[/bold] unindexed{more}: "
                  + ", ".join(escape(i) for i in ids))  # fmt: skip
        literal = "'" + r["agent_id"].replace("'", "''") + "'"
        hint = "SELECT memory_id FROM memory_pipeline WHERE status = 'unindexed' AND agent_id = "
        every = href or hint + literal  # printed for a person to paste, never run here
        note(f"  one: memdiag explain-memory ID --agent {escape(r['agent_id'])}"
             + (f" · all: {escape(every)}" if more else ""), out)  # fmt: skip


def print_recall_trend(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """``query recall-trend``: one table per agent, oldest bucket (or smallest memory count)
    first, with a bar of the SRR."""
    by = args.by
    if not rows:
        err.print(
            "no recall probes or ambient contexts yet: publish recall_probe and "
            "ambient_context to memdiag.memory"
        )
        return
    agents: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        agents.setdefault(r["agent_id"], []).append(r)
    by_count = by == "memory-count"
    tasked = False
    for name, series in agents.items():
        what = "memory count" if by_count else f"{by} (UTC)"
        first = ["memories"] if by_count else [by, "written"]
        task = any(r.get("task_probed") for r in series)
        tasked = tasked or task
        more = ["task probed", "task recall"] if task else []
        t = table(
            f"{escape(name)}: recall by {what}",
            [*first, "probed", "SRR", "", "contexts", "ATR", *more],
            [*first[1:], "probed", "SRR", "contexts", "ATR", *more],
            box=False,
        )
        for r in series:
            if by_count:
                lo, hi = r["memory_count_from"], r["memory_count_to"]
                cells = [f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"]
            else:
                start = r["bucket_start"].astimezone(UTC)
                cells = [
                    start.strftime("%Y-%m-%d %H:%M" if by == "hour" else "%Y-%m-%d"),
                    f"{r['written']:,}",
                ]
            srr = r["semantic_recall_rate"]
            bar = "" if srr is None else "█" * round(10 * srr)
            t.add_row(
                *cells,
                f"{r['probed']:,}",
                pct(srr),
                bar,
                f"{r['ambient_contexts']:,}",
                pct(r["ambient_trigger_rate"]),
                *([f"{r['task_probed']:,}", pct(r["task_recall_rate"])] if task else []),
            )
        show(t)
    out.print(
        "[dim]SRR: of the memories probed in the bucket, those their own name's (latest) probe "
        "there found. ATR: the mean, over the bucket's ambient contexts, of the share of the "
        "agent's memories written by then that the context names (pipeline-health's ATR is the "
        "latest context's alone). "
        + (
            "Task recall: the same of the probes made from a task's words, apart from SRR (below "
            "it: the query-formulation gap). "
            if tasked
            else ""
        )
        + (
            "Memories: the agent's written memories at each probe or context. "
            if by_count
            else "Written: the agent's memories written by the bucket's end. "
        )
        + "--json for every column.[/dim]"
    )


def print_failed_sessions(rows: Any, args: argparse.Namespace) -> None:
    f = escape(filters_text(args))
    if not rows:
        out.print(f"no failed session{f}")
        return
    t = table(
        f"failed sessions{f}, the newest first: {rows.total:,}",
        [
            "session_id",
            "agent",
            "outcome",
            "category",
            "searches",
            "followups",
            "ignored",
            "misleading",
            "outcome at (UTC)",
        ],
        ["searches", "followups", "ignored", "misleading"],
    )
    for r in rows:
        t.add_row(
            escape(r["session_id"]),
            cell(r["agent_id"]),
            r["outcome"],
            cell(r["failure_category"]),
            f"{r['search_count']:,}",
            f"{r['followup_count']:,}",
            f"{r['ignored']:,}",
            f"{r['misleading']:,}",
            cell(r["ts"]),
        )
    show(t)
    note(cut(len(rows), rows.total, "failed sessions", "--limit N for more"))
    note("one session's story: memdiag explain SESSION_ID", out)


def print_dead_letters(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    if not rows:
        reason = getattr(args, "reason", None)
        out.print(f"no dead letters with reason {escape(reason)}" if reason
                  else "no dead letters: every input was processed")  # fmt: skip
        return
    total = sum(r["dead_letters"] for r in rows)
    out.print(
        f"[bold]dead letters: {total:,}[/bold] in {len(rows)} reason{'s' if len(rows) != 1 else ''}"
    )
    for r in rows:
        out.print(
            f"\n[bold]{escape(r['reason'])}[/bold]: {r['dead_letters']:,}, the newest "
            f"{when(r['latest'])} UTC"
        )
        out.print(f"  what to do: {escape(r['advice'])}")
        for s in r["samples"]:
            out.print(f"  [dim]·[/dim] {escape(s['source'])}: {escape(s['detail'])}")
            payload = (s["payload"] or "")[:160]
            more = "…" if len(s["payload"] or "") > 160 or s["payload_truncated"] else ""
            out.print(Text(f"    {payload!r}{more}", style="dim"), overflow="fold")
        note(
            cut(
                len(r["samples"]),
                r["dead_letters"],
                "samples",
                "--samples N; every row is in DuckDB's dead_letters",
            ),
            out,
        )


# -- explain --------------------------------------------------------------------------------


def print_explanation(ex: dict[str, Any], args: argparse.Namespace) -> None:
    from memdiag.analytics.explain import (
        pipeline_down,
        plural,
        search_summary,
        timeline,
        turn_summary,
        verdict_text,
    )
    from memdiag.contract.pages import session_path

    scope = [f"session [bold]{escape(ex['session_id'])}[/bold]"]
    for key in ("agent_id", "org_id", "project_id"):
        if ex[key] is not None:
            scope.append(f"{key.removesuffix('_id')} {escape(ex[key])}")
    out.print(" · ".join(scope))
    o = ex["outcome"]
    if o is None:
        out.print("[yellow]no outcome yet[/yellow]: the session is open, or its outcome is late")
    elif o["failed"]:
        out.print(
            f"[red bold]{escape(o['outcome'])}[/red bold] · "
            f"[bold]{escape(str(o['failure_category'] or 'unknown'))}[/bold] — "
            f"{escape(o['rule'] or '')}"
        )
    else:
        out.print(f"[green bold]{escape(o['outcome'])}[/green bold]")
    down = pipeline_down(ex)
    if down is not None:
        out.print(f"[bold red]{down[0]}[/bold red]{escape(down[1])}")
    summary = [search_summary(ex), turn_summary(ex)]
    if o is not None and o["misleading_observation_ids"]:
        summary.append(
            plural(len(o["misleading_observation_ids"]), "misleading memory", "misleading memories")
        )
    out.print(escape(" · ".join(summary)))
    if ex["never_searched"]:
        out.print(
            "[bold red]never searched[/bold red]: the agent did not ask its memory in this "
            "session" + (" (and the session failed)" if o is not None and o["failed"] else "")
        )
    if ex["dead_letters"]:
        dead = ex["dead_letters"]
        out.print(
            f"[bold red]{plural(dead[0]['in_all'], 'input')} of this session not taken"
            "[/bold red] (dead letters"
            + (f", the newest {len(dead)}" if dead[0]["in_all"] > len(dead) else "")
            + "):"
        )
        for d in dead:
            what = " ".join(x for x in (d["event_kind"], d["event_id"]) if x) or "a message"
            # taken from a refused (hostile) payload: no control character reaches the terminal
            what = "".join(c if c.isprintable() else repr(c)[1:-1] for c in what)
            out.print(f"  {escape(d['reason'])}: {escape(what)} — {escape(d['detail'])}")
    t = table("timeline (event time)", ["at", "event", "what"], ["at"], ["what"], box=False)
    for item in timeline(ex):
        at = f"+{item['at']:,.1f} s"
        if item["kind"] == "search":
            s = item["search"]
            what = escape(s["verdict"])
            if s["is_followup"]:
                what = f"[bold]{what}[/bold]"
            count = f"{s['result_count']} result{'s' if s['result_count'] != 1 else ''}"
            query = f" [dim]{escape(repr(s['query']))}[/dim]" if s["query"] is not None else ""
            t.add_row(at, f"search {escape(s['event_id'])}", f"{count} · {what}{query}")
        elif item["kind"] == "turn":
            turn = item["turn"]
            t.add_row(
                at,
                f"turn {escape(turn['turn_id'])}",
                f"{len(turn['memories'])} memories: {turn['used']} used, {turn['ignored']} ignored",
            )
            for m in turn["memories"]:
                colour = "green" if m["signal"] == "used" else "red"
                t.add_row(
                    "",
                    f"  {escape(m['observation_id'])}",
                    f"[{colour}]{m['signal']}[/{colour}] {escape(verdict_text(m))}"
                    + _strength_step(m),
                )
        else:
            oc = item["outcome"]
            what = oc["outcome"] + (
                f" · {oc['failure_category'] or 'unknown'}" if oc["failed"] else ""
            )
            t.add_row(at, f"outcome {escape(oc['event_id'])}", escape(what))
    show(t)
    if ex["unjudged_memories"]:
        out.print(
            "injected but never judged (their turn had no response): "
            + ", ".join(escape(x) for x in ex["unjudged_memories"])
        )
    if o is not None and o["ignored_observation_ids"]:
        out.print(
            "ignored in every evaluated turn: "
            + ", ".join(escape(x) for x in o["ignored_observation_ids"])
        )
    if o is not None and o["helpful_observation_ids"]:
        out.print(
            "reported helpful by the runtime: "
            + ", ".join(escape(x) for x in o["helpful_observation_ids"])
        )
    if o is not None and o["failed"]:
        calls = o["tool_calls"] or []
        if calls:
            out.print(
                "tool calls: "
                + "; ".join(
                    escape(f"{c['tool']}" + (f" {c['file']}" if c["file"] else ""))
                    + (" ok" if c["success"] else " [red]failed[/red]")
                    for c in calls
                )
            )
        for e in o["errors"] or []:
            out.print(f"error ({escape(str(e['tool']))}): {escape(str(e['message']))}")
    if ex["weights"]:
        w = table(
            "weight step of each memory (misleading first)",
            ["memory", "misleading", "before", "after", "alpha", "weight now", "strength"],
            ["before", "after", "alpha", "weight now", "strength"],
            box=False,
        )
        for r in ex["weights"]:
            mis = "[red bold]yes[/red bold]" if r["misleading"] else "no"
            if r["misleading"] and r["misleading_now"] is False:
                mis += " [dim](no longer)[/dim]"
            w.add_row(
                escape(r["observation_id"]),
                mis,
                f"{r['previous_weight']:.3f}",
                f"{r['new_weight']:.3f}",
                f"{r['alpha']:g}" + (" (doubled)" if r["aggressive"] else ""),
                cell(r["weight_now"]),
                cell(r.get("strength_now")),
            )
        show(w)
        if any(r["misleading"] for r in ex["weights"]):
            note(f"misleading: {MISLEADING_CAVEAT}", out)
    if href := link(args, session_path(ex["session_id"])):
        note(f"its page: {href}", out)


def _strength_step(m: dict[str, Any]) -> str:
    """A verdict's strength step, when the owner's has reached DuckDB."""
    if m.get("strength") is None:
        return ""
    return f" [dim]· strength {m['previous_strength']:.3f} → {m['strength']:.3f}[/dim]"


def print_memory(ex: dict[str, Any], args: argparse.Namespace) -> None:
    m = ex["memory"]
    head = f"memory [bold]{escape(ex['memory_id'])}[/bold] · agent {escape(ex['agent_id'])}"
    if m is not None and m["name"]:
        head += f" · name {escape(repr(m['name']))} (key {escape(repr(m['name_key']))})"
    out.print(head)
    if m is None:
        out.print("[yellow]no memory_written or memory_indexed of it[/yellow]: only probed")
    else:
        status = m["status"]
        colour = {"indexed": "green", "unindexed": "red", "pending": "yellow"}.get(status, "")
        line = f"[{colour}]{status}[/{colour}]" if colour else status
        line += f" · written {when(m['written_at'])} · indexed {when(m['indexed_at'])}"
        if m["index_delay_seconds"] is not None:
            line += f" ({m['index_delay_seconds']:,.1f} s later)"
        out.print(line)
        paths = []
        if m["indexed_at"] is not None:
            paths.append("search (indexed)")
        if m["in_ambient"]:
            paths.append(f"the latest ambient context ({when(m['ambient_at'])})")
        if ex["unreachable"]:
            out.print(
                "[bold red]unreachable[/bold red]: past the index deadline unindexed and "
                "not in the latest ambient context; no path brings it back"
            )
        elif paths:
            out.print("reached by: " + escape(", ".join(paths)))
        else:
            out.print("[yellow]not reachable yet[/yellow]: pending its index, within the deadline")
        if m["look_alikes"]:
            out.print(
                f"{m['look_alikes']} other memor{'ies' if m['look_alikes'] != 1 else 'y'} "
                "of the agent are look-alikes of its name (the same name key, or half the "
                "tokens): they can alias it"
            )
        if m["broken_since"] is not None:
            out.print(f"[red]the agent's pipeline is broken since {when(m['broken_since'])}[/red]")
    latest, task = ex["latest"], ex.get("latest_task")
    if latest is None and task is None:
        out.print("[dim]never probed: publish recall_probe events to see whether it is found[/dim]")
        return
    if latest is None:
        out.print("[dim]no probe made from its name: only task probes (SRR counts none)[/dim]")
    elif latest["hit"]:
        out.print("latest probe by its name: [green]hit[/green]")
    else:
        out.print(
            f"latest probe by its name: [red]missed[/red], [bold]{latest['miss_reason']}[/bold]: "
            f"look at {escape(latest['look_at'] or '')}"
        )
    if task is not None and task["hit"]:
        out.print("latest probe by a task: [green]hit[/green]")
    elif task is not None:
        out.print(
            "latest probe by a task: [red]missed[/red]"
            + (f": look at {escape(task['look_at'])}" if task["look_at"] else "")
        )
    t = table(
        "probes (latest first)",
        ["at", "query", "verdict", "rank", "score", "first k results"],
        ["rank", "score"],
        ["first k results"],
        box=False,
    )
    for p in ex["probes"]:
        verdict = "[green]hit[/green]" if p["hit"] else f"[red]{p['miss_reason'] or 'missed'}[/red]"
        tops = []
        for top in p["top"]:
            label = escape(top["memory_id"])
            if top["name"]:
                label += f" [dim]{escape(top['name'])}[/dim]"
            if top["is_target"]:
                label = f"[bold]{label}[/bold]"
            elif top["look_alike"]:
                label = f"[yellow]{label} (look-alike)[/yellow]"
            tops.append(label)
        t.add_row(
            when(p["ts"]),
            p["query_source"],
            verdict,
            cell(p["rank"]),
            "—" if p["score"] is None else f"{p['score']:.2f}",
            ", ".join(tops) or "[dim]none kept[/dim]",
        )
    show(t)
    ps = ex["probe_summary"]
    note(cut(ps["shown"], ps.get("total", ps["shown"]), "probes", "--limit N for more"), out)
    out.print(
        "[dim]hit: in the first k results at or above the threshold. Query: made from the "
        "memory's name (SRR's) or from a task it should serve. Reasons, of name probes: "
        "not_indexed, below_threshold, aliased (a look-alike name came back), outranked. "
        "Times UTC; --json for all.[/dim]"
    )


def print_breaks(r: dict[str, Any], args: argparse.Namespace) -> None:
    from memdiag.analytics.breaks import difference_text, side_text

    apart = r["apart"]
    head = (
        f"{r['placed']:,} of {r['sessions']:,} sessions placed against their agent's memory "
        "pipeline"
    )
    if apart["no_agent_id"] or apart["no_memory_events"]:
        head += (
            f" ({apart['no_agent_id']:,} name no agent, {apart['no_memory_events']:,} are "
            "of agents without memory events: counted apart)"
        )
    out.print(head)
    if not r["placed"]:
        err.print(
            "no session can be placed: sessions need an agent_id, and their agent memory "
            "events on memdiag.memory"
        )
        return
    t = table(
        "failed sessions: during pipeline breaks vs while healthy",
        ["agent", "breaks", "during breaks", "while healthy", "Δ points [95% CI]"],
        ["breaks", "during breaks", "while healthy", "Δ points [95% CI]"],
        box=False,
    )

    def row(name: str, x: dict[str, Any], breaks: str) -> None:
        diff = difference_text(x)
        if x["too_few"]:
            diff = f"[dim]{diff} *[/dim]"
        elif x["difference_ci"] and (x["difference_ci"]["low"] or 0) > 0:
            diff = f"[bold red]{diff}[/bold red]"
        t.add_row(name, breaks, side_text(x["broken"]), side_text(x["healthy"]), diff)

    row("[bold]all agents[/bold]", r["overall"], "")
    for a in r["agents"]:
        row(escape(a["agent_id"]), a, str(len(a["breaks"])) if a["breaks"] else "—")
    show(t)
    out.print(
        f"[dim]During a break: the outcome fell in a span in which the agent's pipeline "
        f"was down (pipeline_break_spans). Intervals: {r['resamples']:,} bootstrap "
        f"resamples of each side apart, seed {r['seed']}. *: too few, under "
        f"{r['min_sessions']} sessions on a side. Bold red: the interval is above 0.[/dim]"
    )
    out.print("[dim]caveats: " + "; ".join(escape(c) for c in r["caveats"]) + "[/dim]")


def print_labels(r: dict[str, Any]) -> None:
    """``calibrate --labels``: both rules on labelled pairs, and the suggested threshold."""
    lab = r["labels"]

    def f(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    out.print(f"[bold]{lab['pairs']:,} labelled pairs[/bold] from {escape(r['file'])}: "
              f"{lab['tune_pairs']:,} to choose the threshold on (tune), "
              f"{lab['test_pairs']:,} to check it (test)")  # fmt: skip
    out.print(f"similarity: {r['model']['package']} {r['model']['version']}, "
              f"{r['model']['dims']} dimensions (memdiag.semantic)")  # fmt: skip
    t = table("used, as the labels say it: keyword rule against keyword OR similarity",
              ["pairs", "rule", "precision", "recall", "F1", "TP", "FP", "FN", "TN"],
              ["precision", "recall", "F1", "TP", "FP", "FN", "TN"])  # fmt: skip
    chosen = f"semantic (>= {lab['threshold']:.2f})"
    for split in ("tune", "test"):
        if lab[split] is None:
            continue
        for rule, name in (("keyword", "keyword"), ("semantic", chosen)):
            s = lab[split][rule]
            t.add_row(split, name, f(s["precision"]), f(s["recall"]), f(s["f1"]),
                      *(f"{s[k]:,}" for k in ("tp", "fp", "fn", "tn")))  # fmt: skip
    show(t)
    everything = lab["sweep"][0]["f1"]
    if everything is not None:
        out.print(f"[dim]for scale: calling every tune pair used scores F1 {everything:.2f}[/dim]")
    t = table("per kind of pair: verdicts right, and the similarity (min / median / max)",
              ["kind", "pairs", "used", "keyword right", "semantic right", "similarity"],
              ["pairs", "used", "keyword right", "semantic right"])  # fmt: skip
    for k in lab["kinds"]:
        sim = k["similarity"]
        t.add_row(escape(str(k["kind"])), f"{k['pairs']:,}", f"{k['used']:,}",
                  f"{k['keyword_right']:,}", f"{k['semantic_right']:,}",
                  f"{sim['min']:.2f} / {sim['median']:.2f} / {sim['max']:.2f}")  # fmt: skip
    show(t)
    best = [s for s in lab["sweep"] if s["f1"] is not None]
    chosen_t = lab["threshold"]
    shown = [s for s in best if round(s["threshold"] * 100) % 5 == 0 or s["threshold"] == chosen_t]
    t = table("tune pairs by threshold (the best F1 of 0.00-1.00, higher on a tie)",
              ["threshold", "precision", "recall", "F1"],
              ["threshold", "precision", "recall", "F1"])  # fmt: skip
    for s in shown:
        mark = " ←" if s["threshold"] == lab["threshold"] else ""
        t.add_row(f"{s['threshold']:.2f}{mark}", f(s["precision"]), f(s["recall"]), f(s["f1"]))
    show(t)
    out.print(f"suggested MEMDIAG_SIMILARITY_THRESHOLD={lab['threshold']:.2f} "
              "(the tune pairs' best F1 of 'used')")  # fmt: skip


def print_calibration(r: dict[str, Any], args: argparse.Namespace) -> None:
    if "labels" in r:
        print_labels(r)
        return

    def p(x: float | None) -> str:
        return "—" if x is None else f"{x:.1%}"

    def ci(c: dict[str, Any] | None, as_pct: bool = True) -> str:
        if c is None or c["low"] is None:
            return ""
        if as_pct:
            return f" [dim]({c['low']:.0%}–{c['high']:.0%})[/dim]"
        return f" [dim]({c['low']:.2f}–{c['high']:.2f})[/dim]"

    def num(x: float | None, digits: int = 2) -> str:
        return "—" if x is None else f"{x:.{digits}f}"

    pop, boot = r["population"], r["bootstrap"]
    intervals = (
        f"Intervals: {boot['level']:.0%} percentile bootstrap over {boot['clusters']:,} "
        f"{boot['unit']}s, {boot['resamples']:,} resamples, seed {boot['seed']}."
        if boot["resamples"]
        else "No intervals (--resamples 0)."
    )
    out.print(
        f"[bold]calibration[/bold] on {pop['sessions']:,} sessions with an outcome: "
        f"{pop['failed']:,} failed (base rate {p(pop['base_rate'])}). {intervals}"
    )
    for n in r["notes"]:
        out.print(f"[yellow]note:[/yellow] {escape(n)}")
    g = table(
        f"followups per session ({r['rate_auc']['window_seconds']:g} s window), over the "
        "sessions that searched",
        [
            "outcome",
            "sessions",
            "never searched",
            "followups: mean",
            "median",
            "rate: mean",
            "median ",
        ],
        ["sessions", "never searched", "followups: mean", "median", "rate: mean", "median "],
    )
    for name, grp in r["groups"].items():
        g.add_row(
            name,
            f"{grp['sessions']:,}",
            f"{grp['never_searched']:,}",
            num(grp["followups"]["mean"]),
            num(grp["followups"]["median"], 1),
            num(grp["rate"]["mean"]),
            num(grp["rate"]["median"]),
        )
    show(g)
    t = table(
        "predictors of a failed session",
        ["predictor", "over", "flagged", "failed of those", "precision", "recall", "lift"],
        ["flagged", "failed of those", "precision", "recall", "lift"],
    )
    for x in r["predictors"]:
        t.add_row(
            x["predictor"],
            f"{x['sessions']:,} {x['population']}",
            f"{x['flagged']:,}",
            f"{x['failed_flagged']:,}",
            p(x["precision"]) + ci(x["precision_ci"]),
            p(x["recall"]) + ci(x["recall_ci"]),
            "—" if x["lift"] is None else f"{x['lift']:.2f}×",
        )
    show(t)
    ra = r["rate_auc"]
    out.print(
        f"followup rate ({ra['window_seconds']:g} s window) as a score: ROC AUC "
        + num(ra["auc"], 3)
        + ci(ra["ci"], as_pct=False)
        + f" over the {ra['sessions']:,} sessions that searched (0.5 = chance)"
    )
    out.print(
        f"never searched: {pop['never_searched']:,} sessions, "
        f"{p(pop['failure_rate_never_searched'])} failed, against "
        f"{p(pop['failure_rate_searched'])} of the sessions that searched"
    )
    w = table(
        "the followup window: which length predicts failures best",
        ["window", "followups", "sessions ≥ 1", "precision", "recall", "rate AUC", "best in"],
        ["window", "followups", "sessions ≥ 1", "precision", "recall", "rate AUC", "best in"],
    )
    for row in r["windows"]:
        best = row["window_seconds"] == r["best_window_seconds"]
        w.add_row(
            f"{row['window_seconds']:g} s" + (" (stream)" if row["stream"] else ""),
            f"{row['followups']:,}",
            f"{row['flagged']:,}",
            p(row["precision"]) + ci(row["precision_ci"]),
            p(row["recall"]) + ci(row["recall_ci"]),
            num(row["rate_auc"], 3) + ci(row["rate_auc_ci"], as_pct=False) + (" ◀" if best else ""),
            "—" if row["p_best"] is None else f"{row['p_best']:.0%}",
        )
    show(w)
    out.print(f"[bold]{escape(r['verdict'])}[/bold]")
    out.print(
        "[dim]best in: the share of resamples in which that window has the highest AUC "
        "(ties shared); overlapping intervals mean this data does not tell the windows "
        "apart.[/dim]"
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
            f"[dim]the recomputation at {check['window_seconds']:g} s reproduces the "
            f"stream's verdict on all {check['checked']:,} judged searches[/dim]"
        )
    out.print("[dim]caveats: " + escape("; ".join(r["caveats"])) + ".[/dim]")
    if r.get("semantic"):
        print_semantic_verdicts(r["semantic"])
    if r.get("substring_reading"):
        print_substring_reading(r["substring_reading"])
    if r.get("semantic_reading"):
        print_semantic_reading(r["semantic_reading"])


def _spread_row(name: str, s: dict[str, Any]) -> list[str]:
    """A similarity distribution as a table row: its name, how many, min, quantiles, max."""
    return [name, f"{s['n']:,}"] + [
        "—" if s[k] is None else f"{s[k]:.3f}"
        for k in ("min", "p10", "p25", "median", "p75", "p90", "max")
    ]


SPREAD_COLUMNS = ["verdicts", "n", "min", "p10", "p25", "median", "p75", "p90", "max"]


def print_semantic_verdicts(s: dict[str, Any]) -> None:
    """``calibrate``: what the semantic rule did to the stored verdicts."""
    n = s["verdicts"]
    if not n:
        out.print(
            "\n[bold]the semantic rule[/bold] — no verdict judged with MEMDIAG_DETECTOR=semantic "
            f"with these filters ({s['in_file']:,} in the file)"
        )
        return
    out.print(
        f"\n[bold]the semantic rule[/bold] — {n:,} verdicts judged with MEMDIAG_DETECTOR=semantic "
        "(in every session, with an outcome or not): "
        f"{s['used']:,} used ({s['used_by_keyword']:,} by the keyword rule, "
        f"{s['ignored_to_used']:,} by the similarity alone: ignored → used, "
        f"{s['flipped_share']:.1%} of all), {s['ignored']:,} ignored"
    )
    t = table("similarity of each signal, and of each rule", SPREAD_COLUMNS, SPREAD_COLUMNS[1:])
    for name, d in s["similarity"].items():
        t.add_row(*_spread_row(name, d))
    for name, d in s["similarity_by_rule"].items():
        t.add_row(*_spread_row(f"  {name}", d))
    show(t)


def print_semantic_reading(s: dict[str, Any]) -> None:
    """``calibrate --events``: the file's turns under the semantic rule."""
    if "unavailable" in s:
        out.print(f"\n[bold]the semantic rule[/bold] — not read: {escape(s['unavailable'])}")
        return
    n = s["judged"]
    out.print(
        f"\n[bold]the semantic rule[/bold] — {n:,} injected memories of {escape(s['source'])}, "
        f"similarity threshold {s['threshold']:g} ({s['model']['package']} "
        f"{s['model']['version']})"
    )
    if not n:
        out.print("[dim]no turn of the file has both its injection and its response[/dim]")
        return
    out.print(
        f"used: {s['used_keyword']:,} by the keyword rule, {s['used_semantic']:,} by keyword OR "
        f"similarity: {s['ignored_to_used']:,} verdicts ({s['flipped_share']:.1%}) turn "
        "ignored → used"
    )
    t = table("similarity, by the keyword rule's verdict", SPREAD_COLUMNS, SPREAD_COLUMNS[1:])
    t.add_row(*_spread_row("used by keywords", s["similarity"]["keyword_used"]))
    t.add_row(*_spread_row("ignored by keywords", s["similarity"]["keyword_ignored"]))
    show(t)
    out.print(
        "ignored → used at other thresholds: "
        + ", ".join(
            f"{a['threshold']:g}: {a['ignored_to_used']:,}"
            + (" (this one)" if a["threshold"] == s["threshold"] else "")
            for a in s["at_thresholds"]
        )
    )
    if s["examples"]:
        out.print("the flips nearest the threshold (read them before trusting it):")
    for e in s["examples"]:
        out.print(
            f"  {escape(str(e['session_id']))} {escape(str(e['turn_id']))} "
            f"{escape(str(e['observation_id']))}: similarity {e['similarity']:.3f} "
            f"[dim]{escape(repr(e['memory']))}[/dim]"
        )


def print_substring_reading(s: dict[str, Any]) -> None:
    """``calibrate --events``: memdiag's whole words against AgentOS's substrings."""
    n = s["judged"]
    out.print(f"\n[bold]whole words or substrings[/bold] — {n:,} injected memories of "
              f"{escape(s['source'])}")  # fmt: skip
    if not n:
        out.print("[dim]no turn of the file has both its injection and its response[/dim]")
        return
    out.print(
        f"used: {s['used_whole_words']:,} by whole words (memdiag), {s['used_substrings']:,} by "
        f"substrings (AgentOS); {s['ignored_to_used'] + s['used_to_ignored']:,} verdicts "
        f"({s['flipped_share']:.1%}) flip: {s['ignored_to_used']:,} ignored → used, "
        f"{s['used_to_ignored']:,} used → ignored"
    )
    for e in s["examples"]:
        why = "; ".join(
            f"{label} {', '.join(words)}"
            for label, words in (("only as substrings:", e["only_as_substring"]),
                                 ("only as words:", e["only_as_word"])) if words
        )  # fmt: skip
        out.print(
            f"  {escape(str(e['session_id']))} {escape(str(e['turn_id']))} "
            f"{escape(str(e['observation_id']))}: {e['whole_words']} → {e['substrings']} "
            f"[dim]({escape(why)})[/dim]"
        )
    skipped = {k: v for k, v in s["skipped"].items() if v}
    if skipped:
        said = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in skipped.items())
        out.print(f"[dim]skipped: {said}[/dim]")


# -- benchmarks ---------------------------------------------------------------------------


def side_name(side: dict[str, Any]) -> str:
    """A side of a comparison: its run, or its run group and how many runs are its repeats."""
    if side.get("run_id") is None and side.get("run_group_id") is not None:
        runs = side.get("runs") or []
        who = f"group {side['run_group_id']} ({len(runs)} run{'s' if len(runs) != 1 else ''})"
    else:
        who = str(side.get("run_id"))
    return escape(who + (f" [{side['condition']}]" if side.get("condition") else ""))


POSITIONAL = {"by_gold_rank": "best gold rank", "by_context_length": "context length (ids)"}


def _rate(b: dict[str, Any]) -> str:
    return "—" if b["correct_rate"] is None else f"{b['correct_rate']:.0%} of {b['answers']:,}"


def print_positional_compared(pos: dict[str, Any]) -> None:
    """Buried evidence, baseline against candidate per bucket (``compare``)."""
    for name, label in POSITIONAL.items():
        rows = pos[name]
        if not any(r["baseline"]["answers"] or r["candidate"]["answers"] for r in rows):
            continue
        cols = [label, "baseline correct", "candidate correct", "Δ", "reader failures"]
        t = table(f"buried evidence by {label}: answers with all their gold in the context",
                  cols, cols[1:])  # fmt: skip
        for r in rows:
            d = r["correct_rate_delta"]
            t.add_row(
                r["bucket"], _rate(r["baseline"]), _rate(r["candidate"]),
                "—" if d is None else f"{d * 100:+.1f} pts",
                f"{r['baseline']['reader_failures']:,} → {r['candidate']['reader_failures']:,}",
            )  # fmt: skip
        show(t)


def print_positional(conditions: list[dict[str, Any]]) -> None:
    """Buried evidence per condition (``report scores``): the correct rate per bucket."""
    names = [escape(c["condition"]) or "(none)" for c in conditions]
    for name, label in POSITIONAL.items():
        if not any(b["answers"] for c in conditions for b in c["positional"][name]):
            continue
        t = table(f"buried evidence by {label}: correct rate of the answers with all their "
                  "gold in the context", [label, *names], names)  # fmt: skip
        for i, bucket in enumerate(conditions[0]["positional"][name]):
            t.add_row(bucket["bucket"], *(_rate(c["positional"][name][i]) for c in conditions))
        show(t)


def print_runs(rows: Any, args: argparse.Namespace) -> None:
    if not rows:
        err.print("no benchmark judgements in this database (publish judgement events first)")
        return
    t = table(
        f"benchmark runs: {rows.total:,}",
        ["run", "judged", "questions", "repeats", "re-judged", "accuracy", "last (UTC)"],
        ["judged", "questions", "repeats", "re-judged", "accuracy"],
    )
    for r in rows:
        t.add_row(
            escape(r["run_id"]),
            f"{r['judgements']:,}",
            f"{r['questions']:,}",
            f"{r['repeats']:,}",
            f"{r['rejudged']:,}",
            f"{r['accuracy']:.1%}",
            minute(r["last_at"]),
        )
    show(t)
    note(cut(len(rows), rows.total, "runs", "--limit N for more"))
    labels = (
        ("conditions", "conditions"),
        ("suite_id", "suite"),
        ("suite_version", "version"),
        ("suite_checksum", "suite checksum"),
        ("fixture_checksum", "fixtures"),
        ("config_fingerprint", "config"),
        ("git_head", "git"),
        ("service_version", "service"),
        ("run_group_id", "group"),
    )
    for r in rows:
        said = [f"{label} {escape(str(r[k]))}" for k, label in labels if r[k]]
        out.print(
            f"[bold]{escape(r['run_id'])}[/bold]: " + (" · ".join(said) or "no provenance given")
        )


def print_doctor(r: dict[str, Any], args: argparse.Namespace) -> None:
    from memdiag.analytics.doctor import NOTE, REFUSE

    colours = {REFUSE: "red bold", "weak": "yellow", NOTE: "dim"}
    for f in r["findings"]:
        c = colours[f["level"]]
        out.print(f"[{c}]{f['level']:<6}[/{c}] {escape(f['subject'])}: {escape(f['message'])}")
    if r["status"] == 0:
        out.print("[green]nothing weakens this comparison[/green]")


def paired_cells(p: dict[str, Any]) -> list[str]:
    """Baseline, candidate, delta and interval of one paired metric (fractions in %, their
    deltas in points; latency in ms, tokens in tokens)."""
    from memdiag.analytics.metrics import fmt

    u, ci = p["unit"], p["ci"]
    return [
        fmt(u, p["baseline_mean"], bare=True),
        fmt(u, p["candidate_mean"], bare=True),
        fmt(u, p["delta"], True, bare=True),
        "—"  # --resamples 0: no interval
        if ci is None
        else f"[{fmt(u, ci['low'], True, bare=True)}, {fmt(u, ci['high'], True, bare=True)}]",
    ]


def paired_metrics_table(title: str, metrics: dict[str, dict[str, Any] | None]) -> Table:
    """One row per paired metric (``compare``, ``report scores``); a metric no pair carries
    (no score sent, say) is left out."""
    cols = ["metric", "baseline", "candidate", "delta", "interval", "pairs"]
    t = table(title, cols, cols[1:])
    for name, p in metrics.items():
        if p is not None:
            t.add_row(name, *(escape(c) for c in paired_cells(p)), f"{p['pairs']:,}")
    return t


def print_comparison(r: dict[str, Any], args: argparse.Namespace) -> None:
    b, c = r["baseline"], r["candidate"]
    ci = r["bootstrap_ci"]
    m = r["mcnemar"]
    out.print(f"[bold]{escape(r['verdict'])}[/bold]")
    summary = table(None, ["", "value"], wrap=["value"], box=False)
    summary.show_header = False
    for k, v in (
        ("baseline", f"{side_name(b)}: accuracy {b['accuracy']:.1%}"),
        ("candidate", f"{side_name(c)}: accuracy {c['accuracy']:.1%}"),
        (
            "delta",
            f"{r['delta'] * 100:+.1f} pts, no interval (--resamples 0)"
            if ci is None
            else f"{r['delta'] * 100:+.1f} pts, {ci['level']:.0%} CI {ci['low'] * 100:+.1f} to "
            f"{ci['high'] * 100:+.1f} (paired bootstrap over questions, {ci['resamples']:,} "
            f"resamples, seed {ci['seed']})",
        ),
        (
            "McNemar",
            f"exact p = {m['p_value']:.3g}, questions not repeats ({m['right_to_wrong']} "
            f"right→wrong, {m['wrong_to_right']} wrong→right, {m['ties']} tied and left out; "
            f"{r['pairs']:,} pairs over {r['questions']:,} questions)",
        ),
    ):
        summary.add_row(f"[bold]{k}[/bold]", v)
    for label, key, unit in (
        ("latency", "latency_ms_delta", " ms"),
        ("tokens", "tokens_delta", ""),
    ):
        d = r[key]
        if d:
            summary.add_row(
                f"[bold]{label}[/bold]",
                f"{d['mean']:+,.1f}{unit} mean (questions weigh the same), "
                f"{d['median']:+,.1f}{unit} median per pair",
            )
    show(summary)
    states = r["transitions"]["states"]
    t = table(
        "where the answers moved (rows: baseline, columns: candidate)",
        ["baseline ↓ / candidate →", *states],
        states,
    )
    for s in states:
        row = r["transitions"]["baseline_to_candidate"][s]
        t.add_row(s, *(f"[bold]{row[x]}[/bold]" if s == x else str(row[x]) for x in states))
    show(t)
    metrics = paired_metrics_table(
        "metrics: candidate − baseline"
        + ("" if ci is None else f", {ci['level']:.0%} interval over questions")
        + " (fractions in %, their deltas in points; latency_ms in ms)",
        r["metrics"],
    )
    if metrics.row_count:
        show(metrics)
    print_positional_compared(r["positional"])
    un = r["unpaired"]
    for side, items in (("baseline", un["baseline_only"]), ("candidate", un["candidate_only"])):
        if items:
            shown = ", ".join(escape(f"{i['question_id']}#{i['repeat_index']}") for i in items[:10])
            more = f" and {len(items) - 10} more (--json lists all)" if len(items) > 10 else ""
            out.print(f"[yellow]only in the {side}:[/yellow] {shown}{more} — not compared")


def print_gate(v: Any, args: argparse.Namespace) -> None:
    """The gate's verdict: the metrics judged, the notes, then the one-line reason."""
    from memdiag.analytics.gate import CANNOT_JUDGE, ERROR, PASS, REGRESSION, Explained
    from memdiag.analytics.metrics import fmt

    if isinstance(v, Explained):
        out.print(v.words, markup=False, highlight=False)
        return
    if v.metrics:
        title = f"gate: {side_name(v.baseline)} → {side_name(v.candidate)}"
        cols = ["metric", "base", "cand", "Δ", "95% interval", "allowed", ""]
        t = table(title, cols, cols[1:6], box=False)
        for mv in v.metrics:
            d = mv.as_dict()
            cells = paired_cells(d) if mv.paired is not None else ["—"] * 4
            side = "≥ " if d["higher_is_better"] else "≤ "
            mark = {
                PASS: "[green]pass[/green]",
                REGRESSION: "[red bold]regression[/red bold]",
                CANNOT_JUDGE: "[yellow]cannot judge[/yellow]",
            }[mv.verdict]
            allowed = side + fmt(d["unit"], d["limit"], True, bare=d["unit"] != "fraction")
            t.add_row(d["metric"], *(escape(c) for c in cells), escape(allowed), mark)
        show(t)
    for n in v.notes:
        out.print(f"[dim]note: {escape(n)}[/dim]")
    colour = {PASS: "green", REGRESSION: "red"}.get(v.verdict, "yellow")
    to = err if v.verdict == ERROR else out  # an error is not a result
    to.print(f"[{colour} bold]{escape(v.reason)}[/{colour} bold]", soft_wrap=True)


def print_scores(report: dict[str, Any], args: argparse.Namespace) -> None:
    from memdiag.analytics.metrics import METRICS, fmt

    t = table(
        f"scores — run {escape(args.run_id)}",
        [
            "condition",
            "questions",
            "accuracy",
            "correct",
            "reader fail",
            "retrieval fail",
            "unattributed",
            "repeat spread",
        ],
        [
            "questions",
            "accuracy",
            "correct",
            "reader fail",
            "retrieval fail",
            "unattributed",
            "repeat spread",
        ],
    )
    for c in report["conditions"]:
        spread = c["spread"]
        t.add_row(
            escape(c["condition"]) or "(none)",
            f"{c['questions']:,}",
            f"{c['accuracy']:.1%}",
            f"{c['correct']:g}",
            f"{c['reader_failure_with_evidence']:g}",
            f"{c['retrieval_failure']:g}",
            f"{c['unattributed']:g}",
            "—"
            if len(spread.get("repeats_used", ())) < 2 or spread["min"] == spread["max"]
            else f"{spread['min']:.1%}–{spread['max']:.1%}",
        )
    show(t)
    names = [escape(c["condition"]) or "(none)" for c in report["conditions"]]
    means = table(
        "metrics: mean [95% interval over questions] ± stdev across repeats",
        ["metric", *names],
        names,
    )
    for name, m in METRICS.items():
        cells = []
        for c in report["conditions"]:
            s = c["metrics"][name]
            if s is None:
                cells.append("—")
                continue
            low, high = (fmt(m.unit, s["ci"][k], bare=True) for k in ("low", "high"))
            spread_text = (
                fmt(m.unit, s["stdev_across_repeats"], bare=True)
                if s.get("repeats_in_spread", 2) >= 2
                else "—"  # fewer than two repeats answered every question: none measured
            )
            cells.append(
                escape(f"{fmt(m.unit, s['mean'], bare=True)} [{low}, {high}] ± {spread_text}")
            )
        if any(x != "—" for x in cells):
            means.add_row(name, *cells)
    show(means)
    for cmp in report["comparisons"]:
        title = (
            f"{cmp['candidate_condition']} − {cmp['baseline_condition']}, paired over "
            f"{cmp['questions']:,} questions ({cmp['pairs']:,} pairs)"
        )
        show(paired_metrics_table(escape(title), cmp["metrics"]))
    print_positional(report["conditions"])
    prov = report["provenance"]
    out.print(
        f"[dim]{prov['judgements']:,} judgements, {prov['first_event_ts']} to "
        f"{prov['last_event_ts']}; reader fail = the gold evidence was in the context and "
        "the answer was still wrong[/dim]"
    )
    if args.out:
        out.print(f"wrote {escape(args.out)}")


# -- what a command does with its answer before printing it (files it writes) ---------------


def _write_explain_html(ex: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    if args.html:
        from memdiag.views.report import explain_page

        target = Path(args.html)
        target.write_text(explain_page(ex, settings_of(args).duckdb_path), encoding="utf-8")
        if not args.json:
            err.print(f"wrote {target.resolve()}")
    return ex


def _write_scores(report: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    if args.out:
        import json

        from memdiag.cli.common import json_default

        text = json.dumps(report, indent=2, default=json_default) + "\n"
        Path(args.out).write_text(text, encoding="utf-8")
    return report


def _write_markdown(v: Any, args: argparse.Namespace) -> Any:
    from memdiag.analytics import gate as g

    if args.markdown and isinstance(v, g.Verdict):
        try:
            Path(args.markdown).write_text(g.markdown(v), encoding="utf-8")
        except OSError as exc:
            return g.error(f"cannot write {args.markdown}: {exc.strerror}", v.policy)
    return v


#: question name -> how the terminal shows its answer
TERMINAL: dict[str, Callable[[Any, argparse.Namespace], None]] = {
    "status": print_status,
    "failure-distribution": print_failure_distribution,
    "misleading": print_misleading,
    "unused-memories": print_unused_memories,
    "observation-stats": print_observation_stats,
    "observation-history": print_observation_history,
    "pipeline-health": print_pipeline_health,
    "recall-trend": print_recall_trend,
    "failed-sessions": print_failed_sessions,
    "dead-letters": print_dead_letters,
    "explain": print_explanation,
    "explain-memory": print_memory,
    "breaks": print_breaks,
    "calibrate": print_calibration,
    "runs": print_runs,
    "doctor": print_doctor,
    "compare": print_comparison,
    "gate": print_gate,
    "scores": print_scores,
}

#: question name -> what the command does with the answer first (the files it writes); it
#: may return another answer (a markdown file that cannot be written is the gate's error)
BEFORE: dict[str, Callable[[Any, argparse.Namespace], Any]] = {
    "explain": _write_explain_html,
    "scores": _write_scores,
    "gate": _write_markdown,
}


def print_answer(name: str, answer: Any, args: argparse.Namespace) -> None:
    """The answer as JSON (``--json``) or for the terminal."""
    if getattr(args, "json", False):
        print_json(answer.as_dict() if hasattr(answer, "as_dict") else answer)
    else:
        TERMINAL[name](answer, args)
