"""``memdiag explain SESSION_ID``: one session on one screen, as JSON, or as an HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from memdiag.cli.common import err, open_db, out, print_json, settings_of


def cmd_explain(args: argparse.Namespace) -> int:
    from memdiag.analytics.explain import UnknownSession, explain

    con = open_db(args)
    try:
        ex = explain(con, args.session_id)
    except UnknownSession as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return 1
    finally:
        con.close()
    if args.html:
        from memdiag.analytics.report import explain_page

        target = Path(args.html)
        target.write_text(explain_page(ex, settings_of(args).duckdb_path), encoding="utf-8")
        if not args.json:
            err.print(f"wrote {target.resolve()}")
    if args.json:
        print_json(ex)
    else:
        print_explanation(ex)
    return 0


def _scope(ex: dict[str, Any]) -> str:
    parts = [f"session [bold]{escape(ex['session_id'])}[/bold]"]
    for key in ("agent_id", "org_id", "project_id"):
        if ex[key] is not None:
            parts.append(f"{key.removesuffix('_id')} {escape(ex[key])}")
    return " · ".join(parts)


def pipeline_line(ex: dict[str, Any]) -> str | None:
    """The agent's memory pipeline at the outcome, when it was down."""
    from memdiag.analytics.explain import pipeline_down

    down = pipeline_down(ex)
    if down is None:
        return None
    return f"[bold red]{down[0]}[/bold red]{escape(down[1])}"


def _at(seconds: float) -> str:
    return f"+{seconds:,.1f} s"


def print_explanation(ex: dict[str, Any]) -> None:
    from memdiag.analytics.explain import plural, search_summary, timeline, turn_summary

    out.print(_scope(ex))
    o = ex["outcome"]
    if o is None:
        out.print("[yellow]no outcome yet[/yellow]: the session is open, or its outcome is late")
    elif o["failed"]:
        out.print(
            f"[red bold]{escape(o['outcome'])}[/red bold] · "
            f"[bold]{escape(str(o['failure_category']))}[/bold] — {escape(o['rule'] or '')}"
        )
    else:
        out.print(f"[green bold]{escape(o['outcome'])}[/green bold]")
    line = pipeline_line(ex)
    if line:
        out.print(line)
    summary = [search_summary(ex), turn_summary(ex)]
    if o is not None and o["misleading_observation_ids"]:
        n = len(o["misleading_observation_ids"])
        summary.append(plural(n, "misleading memory", "misleading memories"))
    out.print(escape(" · ".join(summary)))
    if ex["never_searched"]:
        out.print(
            "[bold red]never searched[/bold red]: the agent did not ask its memory in this "
            "session" + (" (and the session failed)" if o is not None and o["failed"] else "")
        )
    table = Table(title="timeline (event time)", title_justify="left", show_edge=False)
    table.add_column("at", justify="right", no_wrap=True)
    table.add_column("event", no_wrap=True)
    table.add_column("what")
    for item in timeline(ex):
        if item["kind"] == "search":
            s = item["search"]
            what = escape(s["verdict"])
            if s["is_followup"]:
                what = f"[bold]{what}[/bold]"
            count = f"{s['result_count']} result{'s' if s['result_count'] != 1 else ''}"
            query = f" [dim]{escape(repr(s['query']))}[/dim]" if s["query"] is not None else ""
            table.add_row(
                _at(item["at"]), f"search {escape(s['event_id'])}", f"{count} · {what}{query}"
            )
        elif item["kind"] == "turn":
            t = item["turn"]
            table.add_row(
                _at(item["at"]),
                f"turn {escape(t['turn_id'])}",
                f"{len(t['memories'])} memories: {t['used']} used, {t['ignored']} ignored",
            )
            for m in t["memories"]:
                colour = "green" if m["signal"] == "used" else "red"
                table.add_row(
                    "",
                    f"  {escape(m['observation_id'])}",
                    f"[{colour}]{m['signal']}[/{colour}] {m['match_ratio']:.2f} "
                    f"({m['matched_count']} of {m['keyword_count']} keywords)" + _strength_step(m),
                )
        else:
            oc = item["outcome"]
            what = oc["outcome"] + (f" · {oc['failure_category']}" if oc["failed"] else "")
            table.add_row(_at(item["at"]), f"outcome {escape(oc['event_id'])}", escape(what))
    out.print(table)
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
        w = Table(
            title="weight step of each memory (misleading first)",
            title_justify="left",
            show_edge=False,
        )
        for col in ("memory", "misleading", "weight before", "after", "alpha", "now",
                    "strength now"):  # fmt: skip
            w.add_column(col, justify="left" if col in ("memory", "misleading") else "right")
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
                "—" if r["weight_now"] is None else f"{r['weight_now']:.3f}",
                "—" if r.get("strength_now") is None else f"{r['strength_now']:.3f}",
            )
        out.print(w)


def _strength_step(m: dict[str, Any]) -> str:
    """A verdict's strength step, when the owner's has reached DuckDB."""
    if m.get("strength") is None:
        return ""
    return f" [dim]strength {m['previous_strength']:.3f} → {m['strength']:.3f}[/dim]"
