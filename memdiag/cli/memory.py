"""``memdiag explain-memory ID --agent A``: one memory's recall story on one screen."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from rich.markup import escape
from rich.table import Table

from memdiag.cli.common import err, open_db, out, print_json


def cmd_explain_memory(args: argparse.Namespace) -> int:
    from memdiag.analytics.memory import UnknownMemory, explain_memory

    con = open_db(args)
    try:
        ex = explain_memory(con, args.agent, args.memory_id, limit=args.limit)
    except UnknownMemory as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return 1
    finally:
        con.close()
    if args.json:
        print_json(ex)
    else:
        print_memory(ex)
    return 0


def _t(v: datetime | None) -> str:
    return "—" if v is None else v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def print_memory(ex: dict[str, Any]) -> None:
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
        line += f" · written {_t(m['written_at'])} · indexed {_t(m['indexed_at'])}"
        if m["index_delay_seconds"] is not None:
            line += f" ({m['index_delay_seconds']:,.1f} s later)"
        out.print(line)
        paths = []
        if m["indexed_at"] is not None:
            paths.append("search (indexed)")
        if m["in_ambient"]:
            paths.append(f"the latest ambient context ({_t(m['ambient_at'])})")
        if ex["unreachable"]:
            out.print(
                "[bold red]unreachable[/bold red]: past the index deadline unindexed and not in "
                "the latest ambient context; no path brings it back"
            )
        elif paths:
            out.print("reached by: " + escape(", ".join(paths)))
        else:
            out.print("[yellow]not reachable yet[/yellow]: pending its index, within the deadline")
        if m["look_alikes"]:
            out.print(
                f"{m['look_alikes']} other memor{'ies' if m['look_alikes'] != 1 else 'y'} of the "
                f"agent share its name key: they can alias it"
            )
        if m["broken_since"] is not None:
            out.print(f"[red]the agent's pipeline is broken since {_t(m['broken_since'])}[/red]")
    latest = ex["latest"]
    if latest is None:
        out.print("[dim]never probed: publish recall_probe events to see whether it is found[/dim]")
        return
    if latest["hit"]:
        out.print("latest probe: [green]hit[/green]")
    else:
        out.print(
            f"latest probe: [red]missed[/red], [bold]{latest['miss_reason']}[/bold]: look at "
            + escape(latest["look_at"] or "")
        )
    table = Table(title="probes (latest first)", title_justify="left", show_edge=False)
    for header, justify in (("at", "left"), ("verdict", "left"), ("rank", "right"),
                            ("score", "right"), ("first k results", "left")):  # fmt: skip
        table.add_column(header, justify=justify, no_wrap=header != "first k results")  # type: ignore[arg-type]
    for p in ex["probes"]:
        verdict = "[green]hit[/green]" if p["hit"] else f"[red]{p['miss_reason']}[/red]"
        tops = []
        for t in p["top"]:
            label = escape(t["memory_id"])
            if t["name"]:
                label += f" [dim]{escape(t['name'])}[/dim]"
            if t["is_target"]:
                label = f"[bold]{label}[/bold]"
            elif t["look_alike"]:
                label = f"[yellow]{label} (look-alike)[/yellow]"
            tops.append(label)
        table.add_row(
            _t(p["ts"]),
            verdict,
            "—" if p["rank"] is None else str(p["rank"]),
            "—" if p["score"] is None else f"{p['score']:.2f}",
            ", ".join(tops) or "[dim]none kept[/dim]",
        )
    out.print(table)
    out.print(
        f"[dim]{ex['probe_summary']['shown']} probe(s) shown (--limit); hit: in the first k "
        "results at or above the threshold. Reasons: not_indexed, below_threshold, aliased "
        "(a look-alike by name key came back), outranked. Times UTC; --json for all.[/dim]"
    )


def cmd_breaks(args: argparse.Namespace) -> int:
    from memdiag.analytics.breaks import break_impact

    con = open_db(args)
    try:
        r = break_impact(con, resamples=args.resamples, seed=args.seed)
    finally:
        con.close()
    if args.json:
        print_json(r)
    else:
        print_breaks(r)
    return 0


def print_breaks(r: dict[str, Any]) -> None:
    from memdiag.analytics.breaks import difference_text, side_text

    apart = r["apart"]
    head = (
        f"{r['placed']:,} of {r['sessions']:,} sessions placed against their agent's memory "
        "pipeline"
    )
    if apart["no_agent_id"] or apart["no_memory_events"]:
        head += (
            f" ({apart['no_agent_id']:,} name no agent, {apart['no_memory_events']:,} are of "
            "agents without memory events: counted apart)"
        )
    out.print(head)
    if not r["placed"]:
        err.print(
            "no session can be placed: sessions need an agent_id, and their agent memory "
            "events on memdiag.memory"
        )
        return
    o = r["overall"]
    table = Table(title="failed sessions: during pipeline breaks vs while healthy",
                  title_justify="left", box=None)  # fmt: skip
    table.add_column("agent", overflow="fold", min_width=10)
    for header in ("breaks", "during breaks", "while healthy", "Δ points [95% CI]"):
        table.add_column(header, justify="right", no_wrap=True)

    def row(name: str, x: dict[str, Any], breaks: str) -> None:
        diff = difference_text(x)
        if x["too_few"]:
            diff = f"[dim]{diff} *[/dim]"
        elif x["difference_ci"] and (x["difference_ci"]["low"] or 0) > 0:
            diff = f"[bold red]{diff}[/bold red]"
        table.add_row(name, breaks, side_text(x["broken"]), side_text(x["healthy"]), diff)

    row("[bold]all agents[/bold]", o, "")
    for a in r["agents"]:
        row(escape(a["agent_id"]), a, str(len(a["breaks"])) if a["breaks"] else "—")
    out.print(table)
    out.print(
        f"[dim]During a break: the outcome fell in a span in which the agent's pipeline was "
        f"down (pipeline_break_spans). Intervals: {r['resamples']:,} bootstrap resamples of "
        f"each side apart, seed {r['seed']}. *: too few, under {r['min_sessions']} sessions on "
        "a side. Bold red: the interval is above 0.[/dim]"
    )
    out.print("[dim]caveats: " + "; ".join(escape(c) for c in r["caveats"]) + "[/dim]")
