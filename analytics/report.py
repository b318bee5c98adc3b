"""``memdiag report html``: one self-contained page with the status figures as charts.

Charts are drawn with matplotlib and inlined as SVG, so the page needs no script, no
network and no other file: it can be mailed, attached to an incident or opened offline.
"""

from __future__ import annotations

import hashlib
import html
import io
from datetime import UTC, datetime
from typing import Any

import duckdb

from memdiag import __version__
from memdiag.analytics.db import DatabaseError
from memdiag.analytics.explain import (
    explain,
    pipeline_down,
    search_summary,
    timeline,
    turn_summary,
)
from memdiag.analytics.queries import (
    TREND_GRAINS,
    TREND_ORIGIN,
    pipeline_coverage_over_time,
    pipeline_health,
    recall_trend,
    rows,
)
from memdiag.analytics.status import (
    feedback_per_observation,
    followup_over_time,
    span_text,
    status,
)

USED, IGNORED = "#2a9d8f", "#e76f51"
READER, RETRIEVAL, CORRECT, OTHER = "#f4a261", "#e63946", "#2a9d8f", "#adb5bd"
BAR = "#457b9d"


_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d3557;
       max-width: 1100px; margin: 2em auto; padding: 0 1em; background: #fff; }
h1 { margin-bottom: 0.1em; } .meta { color: #6c757d; margin-top: 0; }
.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; }
.tile { border: 1px solid #dee2e6; border-radius: 8px; padding: 10px 14px; }
.tile .label { color: #6c757d; font-size: 12px; text-transform: uppercase;
               letter-spacing: .04em; }
.tile .value { font-size: 28px; font-weight: 600; }
.tile .sub { color: #6c757d; font-size: 12px; }
section { margin-top: 2em; } .chart svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; }
th, td { padding: 4px 12px; border-bottom: 1px solid #dee2e6; text-align: left; }
td.n { text-align: right; }
.note { color: #6c757d; font-size: 12px; max-width: 70ch; }
details { margin-top: 1em; border: 1px solid #dee2e6; border-radius: 8px; padding: 6px 14px; }
details summary { cursor: pointer; font-weight: 600; }
details:target { border-color: #457b9d; }
.used { color: #2a9d8f; } .ignored, .failed { color: #e63946; } .accepted { color: #2a9d8f; }
.sub-row td { border-bottom: none; padding-top: 0; padding-bottom: 0; color: #495057; }
.sub-row td:nth-child(2) { padding-left: 28px; }
.followup { font-weight: 600; }
.verdict { font-size: 16px; }
"""
FAILED_SESSIONS = 10  # the newest failed sessions the report lists and embeds
PIPELINE_AGENTS = 12  # agents drawn in the coverage chart (broken first: all in the table)
TREND_BUCKETS = 60  # most time buckets in the recall trend chart (it picks its grain by them)


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG sits inside HTML


def _figure(width: float = 6.4, height: float = 3.2, ncols: int = 1) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "svg.fonttype": "none",
            # labels are data (agent, memory and run ids): a `$` is a dollar, never mathtext
            "text.parse_math": False,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt.subplots(1, ncols, figsize=(width, height))


def chart_failures(categories: list[dict[str, Any]]) -> str:
    fig, ax = _figure()
    names = [c["failure_category"] for c in categories]
    values = [c["sessions"] for c in categories]
    bars = ax.barh(names[::-1], values[::-1], color=BAR)
    ax.bar_label(bars, padding=3)
    ax.set_xlabel("failed sessions")
    ax.set_title("Failed sessions by category", loc="left")
    return _svg(fig)


def chart_followups(points: list[dict[str, Any]]) -> str:
    fig, ax = _figure()
    if points:
        xs = [p["bucket"] for p in points]
        ax.plot(xs, [p["rate"] * 100 for p in points], color=BAR, marker="o", markersize=3)
        ax.fill_between(xs, [p["rate"] * 100 for p in points], alpha=0.15, color=BAR)
        fig.autofmt_xdate()
    ax.set_ylabel("followups, % of agent searches")
    ax.set_title("Followup rate over time (event time, UTC)", loc="left")
    return _svg(fig)


def chart_feedback(rows: list[dict[str, Any]]) -> str:
    fig, ax = _figure(6.4, max(2.4, 0.22 * len(rows) + 0.8))
    names = [r["observation_id"] for r in rows][::-1]
    used = [r["used"] for r in rows][::-1]
    ignored = [r["ignored"] for r in rows][::-1]
    ax.barh(names, used, color=USED, label="used")
    ax.barh(names, ignored, left=used, color=IGNORED, label="ignored")
    ax.set_xlabel("evaluated turns")
    ax.legend(loc="lower right", frameon=False)
    ax.set_title(f"Used / ignored, the {len(rows)} most injected memories", loc="left")
    return _svg(fig)


def chart_runs(runs: list[dict[str, Any]]) -> str:
    fig, ax = _figure(6.4, max(2.0, 0.5 * len(runs) + 1.0))
    names = [r["run_id"] for r in runs][::-1]
    correct = [round(r["accuracy"] * r["judgements"]) for r in runs][::-1]
    reader = [r["reader_failures"] for r in runs][::-1]
    retrieval = [r["retrieval_failures"] for r in runs][::-1]
    other = [r["unattributed"] for r in runs][::-1]
    left = [0] * len(runs)
    for values, colour, label in (
        (correct, CORRECT, "correct"),
        (reader, READER, "reader failure (evidence in context)"),
        (retrieval, RETRIEVAL, "retrieval failure"),
        (other, OTHER, "unattributed"),
    ):
        ax.barh(names, values, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("judgements")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    ax.set_title("Benchmark runs: reader vs retrieval failures", loc="left")
    return _svg(fig)


def chart_pipeline(points: list[dict[str, Any]], order: list[str]) -> str:
    """Pipeline coverage over time, one line per agent (of the memories written then), the
    agents in ``order`` (broken first), at most :data:`PIPELINE_AGENTS` of them."""
    fig, ax = _figure()
    agents: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        agents.setdefault(p["agent_id"], []).append(p)
    for agent, series in [(a, agents[a]) for a in order if a in agents][:PIPELINE_AGENTS]:
        xs = [p["bucket_start"] for p in series]
        ax.plot(xs, [p["pipeline_coverage"] * 100 for p in series], marker="o", markersize=3,
                label=agent)  # fmt: skip
    if agents:
        fig.autofmt_xdate()
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False)
    ax.set_ylim(-5, 105)
    ax.set_ylabel("indexed, % of memories written")
    ax.set_title("Pipeline coverage over time (by when written, UTC)", loc="left")
    return _svg(fig)


def trend_grain(first: datetime | None, last: datetime | None) -> str:
    """The report's time grain for the recall trends: the finest of hour, day and week that
    keeps them within :data:`TREND_BUCKETS` buckets."""
    if first is None or last is None:
        return "day"
    origin = TREND_ORIGIN.timestamp()
    for grain, size in TREND_GRAINS.items():
        buckets = (last.timestamp() - origin) // size - (first.timestamp() - origin) // size + 1
        if buckets <= TREND_BUCKETS:
            return grain
    return "week"


def chart_recall_trend(points: list[dict[str, Any]], order: list[str], x: str, title: str,
                       xlabel: str, date_format: str = "%Y-%m-%d") -> str:  # fmt: skip
    """SRR (left) and ATR (right) per agent against ``x`` (a time or the memory count), one
    line per agent, the agents in ``order``, at most :data:`PIPELINE_AGENTS` of them."""
    fig, (left, right) = _figure(width=8.4, height=3.0, ncols=2)
    agents: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        agents.setdefault(p["agent_id"], []).append(p)
    for agent, series in [(a, agents[a]) for a in order if a in agents][:PIPELINE_AGENTS]:
        for ax, key in ((left, "semantic_recall_rate"), (right, "ambient_trigger_rate")):
            known = [p for p in series if p[key] is not None]
            ax.plot([p[x] for p in known], [p[key] * 100 for p in known], marker="o",
                    markersize=3, label=agent)  # fmt: skip
    import matplotlib.dates as mdates

    ends = sorted({p[x] for p in points}) if x == "memory_count_to" else []
    for ax, name in ((left, "recall (SRR), %"), (right, "ambient (ATR), %")):
        ax.set_ylim(-5, 105)
        ax.set_ylabel(name)
        ax.set_xlabel(xlabel)
        if x == "memory_count_to":  # a power-of-two axis, labelled by the counts themselves
            ax.set_xscale("symlog", base=2, linthresh=1)
            ax.set_xticks(ends, [f"{e:,}" for e in ends])
            ax.minorticks_off()
            if ends:
                ax.set_xlim(ends[0] * 0.75 if ends[0] else -0.5, ends[-1] * 1.3)
        elif agents:
            starts = sorted({p[x] for p in points})  # ticks on the buckets, six at most
            ax.set_xticks(starts[:: -(-len(starts) // 6)])
            ax.xaxis.set_major_formatter(mdates.DateFormatter(date_format, tz=UTC))
    if x == "bucket_start" and agents:
        fig.autofmt_xdate()
    if agents:
        below = -0.5 if x == "bucket_start" else -0.25  # under the slanted dates
        left.legend(loc="upper center", bbox_to_anchor=(1.1, below), ncol=4, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=10)
    return _svg(fig)


def _recall_trends(con: duckdb.DuckDBPyConnection, order: list[str]) -> str:
    """SRR and ATR over time and against the memory count (``query recall-trend``)."""
    try:
        span = rows(con, "recall_span")[0]
    except DatabaseError:  # a file from before the trends
        return "<p>Start <code>memdiag sink</code> on this file once to see the recall trends.</p>"
    if span["first"] is None:
        return "<p>No recall probes or ambient contexts: no trends.</p>"
    grain = trend_grain(span["first"], span["last"])
    over_time = chart_recall_trend(
        recall_trend(con, grain), order, "bucket_start",
        f"Recall by {grain}: does it fall over time?", f"{grain} starting (UTC)",
        "%m-%d %H:%M" if grain == "hour" else "%Y-%m-%d",
    )  # fmt: skip
    by_count = chart_recall_trend(
        recall_trend(con, "memory-count"), order, "memory_count_to",
        "Recall by memory count: does it fall as memory grows?",
        "memories written by then (up to)",
    )  # fmt: skip
    return (
        "<h3>Recall trends</h3>"
        f"<div class=chart>{over_time}</div><div class=chart>{by_count}</div>"
        f"<p class=note>SRR of each memory's latest probe in the {grain} (or at that memory "
        "count); ATR the mean over the ambient contexts there of the share of the agent's "
        "memories written by then that the context names: it falls as memory grows unless "
        "the context grows too. Aliasing (look-alike names piling up) makes SRR fall with the "
        "memory count; a sudden fall in time is a change in the pipeline "
        "(<code>memdiag status</code> flags it; <code>memdiag query recall-trend</code>).</p>"
    )


def _pipeline_section(con: duckdb.DuckDBPyConnection, p: dict[str, Any] | None) -> str:
    if p is None:
        return (
            "<p>This file predates pipeline health: start <code>memdiag sink</code> on it once.</p>"
        )
    if not p["agents"]:
        return "<p>No memory events (<code>memdiag.memory</code>).</p>"
    agents = pipeline_health(con)
    for a in agents:
        a["state"] = "BROKEN" if a["broken"] else "ok"
        for key in ("pipeline_coverage", "semantic_recall_rate", "ambient_trigger_rate",
                    "aliasing_rate", "unreachable_share"):  # fmt: skip
            a[key] = "n/a" if a[key] is None else f"{a[key]:.0%}"
        a["misses"] = (
            f"{a['not_indexed_misses']} / {a['below_threshold_misses']} / "
            f"{a['aliased_misses']} / {a['outranked_misses']}"
            if a["missed"]
            else "none"
        )
        a["unreachable"] = f"{a['unreachable']} ({a['unreachable_share']})"
    table = _table(
        agents,
        [
            ("agent_id", "agent"),
            ("state", "pipeline"),
            ("written", "written"),
            ("indexed", "indexed"),
            ("unindexed", "unindexed"),
            ("pipeline_coverage", "coverage (PC)"),
            ("semantic_recall_rate", "recall (SRR)"),
            ("probed", "probed"),
            ("misses", "misses: not indexed / below threshold / aliased / outranked"),
            ("aliasing_rate", "aliasing"),
            ("ambient_trigger_rate", "ambient (ATR)"),
            ("unreachable", "unreachable"),
            ("broken_since", "broken since"),
        ],
    )
    order = [a["agent_id"] for a in agents]
    chart = chart_pipeline(pipeline_coverage_over_time(con), order)
    fell = p.get("recall_fell") or {"agents": [], "stopped_probing": []}
    first = [a["agent_id"] for a in fell["agents"] + fell["stopped_probing"]]
    order = first + [a for a in order if a not in first]  # the trends draw these first
    return (f"{table}{_recall_fell(p)}<div class=chart>{chart}</div>{_recall_trends(con, order)}"
            f"{_breaks_table(con)}")  # fmt: skip


def _recall_fell(p: dict[str, Any]) -> str:
    """The agents whose recall fell from their previous window, or whose probes stopped, as
    ``status`` says."""
    f = p.get("recall_fell")
    if not f or not (f["agents"] or f["stopped_probing"]):
        return ""
    window = span_text(f["window_seconds"])

    def when(a: dict[str, Any]) -> str:
        return a["window_end"].astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")

    items = "".join(
        f"<li><b>{html.escape(a['agent_id'])}</b>: {a['previous_semantic_recall_rate']:.1%} "
        f"({a['previous_probed']} probed) → {a['semantic_recall_rate']:.1%} "
        f"({a['probed']} probed), as of {when(a)}</li>"
        for a in f["agents"]
    ) + "".join(
        f"<li><b>{html.escape(a['agent_id'])}</b>: probes stopped ({a['previous_probed']} "
        f"probed the {window} before, none since), as of {when(a)}</li>"
        for a in f["stopped_probing"]
    )
    return (f"<p class=failed>Recall fell (by more than {f['drop_points']:g} points and "
            f"{f['min_z']:g} standard errors), or its probes stopped: the last {window} against "
            f"the {window} before.</p><ul>{items}</ul>")  # fmt: skip


def _breaks_table(con: duckdb.DuckDBPyConnection) -> str:
    """Sessions during pipeline breaks against sessions while healthy (``memdiag breaks``)."""
    from memdiag.analytics.breaks import break_impact, difference_text, side_text

    r = break_impact(con)
    if not r["placed"]:
        return (
            "<p class=note>No session can be placed against its agent's pipeline: sessions "
            "need an agent_id whose agent sends memory events.</p>"
        )

    def fmt(name: str, x: dict[str, Any]) -> dict[str, Any]:
        diff = difference_text(x) + (" (too few)" if x["too_few"] else "")
        return {"agent": name, "during": side_text(x["broken"]),
                "healthy": side_text(x["healthy"]), "difference": diff}  # fmt: skip

    table = _table(
        [fmt("all agents", r["overall"])] + [fmt(a["agent_id"], a) for a in r["agents"]],
        [("agent", "agent"), ("during", "failed during breaks"),
         ("healthy", "failed while healthy"), ("difference", "difference, points [95% CI]")],
    )  # fmt: skip
    apart = r["apart"]
    return (
        "<h3>Sessions during pipeline breaks</h3>"
        f"{table}<p class=note>{r['placed']} of {r['sessions']} sessions placed by their "
        f"agent and outcome time against the spans their agent's pipeline was down "
        f"({apart['no_agent_id']} name no agent and {apart['no_memory_events']} are of agents "
        "without memory events: counted apart). Bootstrap interval, each side resampled apart; "
        f"too few: under {r['min_sessions']} sessions on a side. Correlation, not cause "
        "(<code>memdiag breaks</code>).</p>"
    )


def _table(
    rows: list[dict[str, Any]], columns: list[tuple[str, str]], link: str | None = None
) -> str:
    """An HTML table; the ``link`` column's values are session ids, linked to their
    explanation on the same page."""
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in columns)
    body = "".join(
        "<tr>" + "".join(_td(r.get(key), key == link) for key, _ in columns) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(v: Any, linked: bool = False) -> str:
    text = html.escape(_fmt(v))
    if linked and v is not None:
        text = f'<a href="#{anchor(str(v))}">{text}</a>'
    numeric = isinstance(v, int | float) and not isinstance(v, bool)
    return f'<td class="n">{text}</td>' if numeric else f"<td>{text}</td>"


def _graph_misleading(graph: list[dict[str, Any]]) -> str:
    """The knowledge graph's misleading entities and edges, under the memories'."""
    if not graph:
        return ""
    table = _table(
        graph,
        [
            ("kind", "graph"),
            ("id", "entity, or edge source|target|relationship"),
            ("failed_sessions", "failed sessions"),
            ("weight", "weight now"),
        ],  # fmt: skip
    )
    return (
        "<h3>Knowledge graph</h3>" + table + "<p class=note>Entities and edges injected in 3 or "
        "more failed sessions and no accepted one; their weights go to the memory system on "
        "<code>memdiag.graph_weights</code> (<code>memdiag query misleading --graph</code>).</p>"
    )


def anchor(session_id: str) -> str:
    """A fragment id for a session: any session id, safe in a URL and an attribute."""
    return "session-" + hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).hexdigest()


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def render(con: duckdb.DuckDBPyConnection, db_path: str) -> str:
    st = status(con, top=10, runs=10)
    fu, fb = st["followup"], st["feedback"]
    judged = fb["used"] + fb["ignored"]
    sessions = st["sessions"]
    total = sum(sessions.values())
    newest = st["freshness"]["newest_event"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    tiles = [
        ("followup rate", pct(fu["rate"]), f"of {fu['agent_searches']:,} agent searches"),
        ("memories used", pct(fb["used_share"]), f"of {judged:,} judged injections"),
        (
            "sessions failed",
            pct((total - sessions.get("accepted", 0)) / total if total else None),
            f"of {total:,} sessions",
        ),
        (
            "misleading memories",
            f"{st['misleading']['count']:,}",
            "≥ 3 failed sessions, none accepted",
        ),
        (
            "dead letters",
            f"{sum(d['dead_letters'] for d in st['dead_letters']):,}",
            ", ".join(f"{d['reason']} {d['dead_letters']}" for d in st["dead_letters"]) or "none",
        ),
    ]
    tile_html = "".join(
        f'<div class="tile"><div class="label">{html.escape(a)}</div>'
        f'<div class="value">{html.escape(b)}</div><div class="sub">{html.escape(c)}</div></div>'
        for a, b, c in tiles
    )
    failed = rows(con, "latest_failed_sessions", limit=FAILED_SESSIONS)
    # Embed the latest failed sessions, and the latest failed session of each misleading
    # memory shown, so every link of the page lands on this page.
    embedded = [r["session_id"] for r in failed]
    for m in st["misleading"]["top"]:
        latest = rows(con, "latest_session_of_observation", observation_id=m["observation_id"])
        m["session_id"] = latest[0]["session_id"] if latest else None
        if m["session_id"] is not None and m["session_id"] not in embedded:
            embedded.append(m["session_id"])
    sections = [
        ("Failed sessions", chart_failures(st["failure_categories"]), ""),
        (
            "Followups",
            chart_followups(followup_over_time(con)),
            f"<p class=note>{html.escape(fu['caveat'])}.</p>",
        ),
        (
            "Used and ignored memories",
            chart_feedback(feedback_per_observation(con)),
            f"<p class=note>{html.escape(fb['caveat'])}.</p>",
        ),
        (
            "Misleading memories",
            _table(
                st["misleading"]["top"],
                [
                    ("observation_id", "observation"),
                    ("fail_count", "failed sessions"),
                    ("success_count", "accepted sessions"),
                    ("weight", "weight now"),
                    ("session_id", "latest failed session"),
                ],
                link="session_id",
            )
            if st["misleading"]["top"]
            else "<p>None: no memory is in 3 or more failed sessions and no accepted one.</p>",
            _graph_misleading(st["misleading"]["graph"]),
        ),
        (
            "Dead weight: memories never used",
            _table(
                st["unused_memories"]["top"],
                [
                    ("observation_id", "observation"),
                    ("judged_turns", "judged turns"),
                    ("sessions", "sessions"),
                    ("strength", "strength"),
                    ("weight", "weight"),
                    ("last_injected_at", "last judged"),
                ],
            )
            if st["unused_memories"]["top"]
            else f"<p>None: every memory judged in {st['unused_memories']['min_injections']} "
            "or more turns was used in at least one.</p>",
            f"<p class=note>Judged in {st['unused_memories']['min_injections']} or more turns "
            "and used in none: candidates to prune or demote (<code>memdiag query "
            "unused-memories</code>). Strength is the EMA of the verdicts; "
            f"{html.escape(fb['caveat'])}.</p>",
        ),
        (
            "Recall pipeline: written, indexed, recalled",
            _pipeline_section(con, st["pipeline"]),
            "<p class=note>Coverage (PC): indexed over written memories. Recall (SRR): probed "
            "memories their own probe found in its top k above its threshold. Ambient (ATR): "
            "written memories in the latest ambient context. Broken: a memory missed its index "
            "deadline and nothing was indexed since it was written; an agent that never reports "
            "indexing shows as broken. PC misses an indexer that acknowledges but stores "
            "garbage: SRR catches it. Misses are each probed memory's latest probe by why it "
            "missed: not indexed by then, below the score threshold, aliased (a memory with the "
            "same name key, e.g. another day's daily note, came back instead: fix the names or "
            "rank by date, not the indexer), outranked by anything else. Aliasing is of the "
            "probed memories. Unreachable: past the index deadline and not in the latest ambient "
            "context, so no path brings them back.</p>",
        ),
        (
            "Benchmark runs",
            chart_runs(st["runs"]) if st["runs"] else "<p>No benchmark judgements.</p>",
            "<p class=note>A reader failure had all its gold evidence in the context and was "
            "still wrong: improve the reader. A retrieval failure never got the evidence.</p>",
        ),
    ]
    body = "".join(
        f'<section><h2>{html.escape(t)}</h2><div class="chart">{c}</div>{n}</section>'
        for t, c, n in sections
    )
    body += _failed_sessions(failed)
    body += "".join(
        f'<details id="{anchor(sid)}"><summary>{html.escape(sid)}</summary>'
        f"{explain_fragment(explain(con, sid))}</details>"
        for sid in embedded
    )
    fresh = newest.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if newest else "no events"
    meta = f"{html.escape(db_path)} · newest event {fresh}"
    return page("memdiag report", meta, f'<div class="tiles">{tile_html}</div>{body}')


def page(title: str, meta: str, body: str) -> str:
    """A self-contained page in the report's style (``meta`` and ``body`` are HTML)."""
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="meta">{meta} · generated {generated} · memdiag {__version__}</p>
{body}
</body></html>
"""


def _failed_sessions(failed: list[dict[str, Any]]) -> str:
    if not failed:
        return "<section><h2>Latest failed sessions</h2><p>No failed session.</p></section>"
    table = _table(
        failed,
        [
            ("session_id", "session"),
            ("agent_id", "agent"),
            ("outcome", "outcome"),
            ("failure_category", "category"),
            ("search_count", "agent searches"),
            ("followup_count", "followups"),
            ("ignored", "ignored memories"),
            ("misleading", "misleading memories"),
            ("ts", "outcome at (UTC)"),
        ],
        link="session_id",
    )
    return (
        f"<section><h2>Latest failed sessions</h2>{table}<p class=note>Each session links to "
        "its explanation below (also <code>memdiag explain SESSION_ID</code>).</p></section>"
    )


def explain_fragment(ex: dict[str, Any]) -> str:
    """One session's explanation as HTML (in the report, and on its own page)."""
    e = html.escape
    o = ex["outcome"]
    scope = " · ".join(
        f"{k.removesuffix('_id')} {e(ex[k])}"
        for k in ("agent_id", "org_id", "project_id")
        if ex[k] is not None
    )
    if o is None:
        verdict = "no outcome yet: the session is open, or its outcome is late"
    elif o["failed"]:
        category = e(o["failure_category"] or "unknown")
        verdict = (
            f'<span class="failed">{e(o["outcome"])}</span> · <b>{category}</b>'
            f" — {e(o['rule'] or '')}"
        )
    else:
        verdict = f'<span class="accepted">{e(o["outcome"])}</span>'
    parts = [
        f"<p class=verdict>{verdict}</p>",
        f"<p class=meta>{scope}</p>",
        f"<p>{e(search_summary(ex))} · {e(turn_summary(ex))}</p>",
    ]
    if ex["never_searched"]:
        parts.append(
            '<p class="failed"><b>Never searched</b>: the agent did not ask its memory in this '
            "session.</p>"
        )
    down = pipeline_down(ex)
    if down is not None:
        parts.append(f'<p class="failed"><b>{e(down[0])}</b>{e(down[1])}</p>')
    trs = []
    for item in timeline(ex):
        at = f'<td class="n">+{item["at"]:,.1f} s</td>'
        if item["kind"] == "search":
            s = item["search"]
            query = f" <code>{e(repr(s['query']))}</code>" if s["query"] is not None else ""
            cls = ' class="followup"' if s["is_followup"] else ""
            trs.append(
                f"<tr>{at}<td>search {e(s['event_id'])}</td><td{cls}>{s['result_count']} "
                f"results · {e(s['verdict'])}{query}</td></tr>"
            )
        elif item["kind"] == "turn":
            t = item["turn"]
            trs.append(
                f"<tr>{at}<td>turn {e(t['turn_id'])}</td><td>{len(t['memories'])} memories: "
                f"{t['used']} used, {t['ignored']} ignored</td></tr>"
            )
            trs.extend(
                f'<tr class="sub-row"><td></td><td>{e(m["observation_id"])}</td>'
                f'<td><span class="{m["signal"]}">{m["signal"]}</span> '
                f"{m['match_ratio']:.2f} ({m['matched_count']} of {m['keyword_count']} "
                "keywords)</td></tr>"
                for m in t["memories"]
            )
        else:
            oc = item["outcome"]
            cat = f" · {e(oc['failure_category'] or 'unknown')}" if oc["failed"] else ""
            trs.append(
                f"<tr>{at}<td>outcome {e(oc['event_id'])}</td><td>{e(oc['outcome'])}{cat}</td></tr>"
            )
    parts.append(
        "<table><thead><tr><th>at</th><th>event</th><th>what</th></tr></thead>"
        f"<tbody>{''.join(trs)}</tbody></table>"
    )
    if ex["unjudged_memories"]:
        parts.append(
            "<p>Injected but never judged (their turn had no response): "
            + ", ".join(e(x) for x in ex["unjudged_memories"])
            + "</p>"
        )
    if o is not None and o["ignored_observation_ids"]:
        parts.append(
            "<p>Ignored in every evaluated turn: "
            + ", ".join(e(x) for x in o["ignored_observation_ids"])
            + "</p>"
        )
    if o is not None and o["failed"]:
        calls = "; ".join(
            e(c["tool"] + (f" {c['file']}" if c["file"] else ""))
            + (" ok" if c["success"] else ' <span class="failed">failed</span>')
            for c in o["tool_calls"] or []
        )
        if calls:
            parts.append(f"<p>Tool calls: {calls}</p>")
        errors = "".join(
            f"<li>{e(str(x['tool']))}: {e(str(x['message']))}</li>" for x in o["errors"] or []
        )
        if errors:
            parts.append(f"<p>Errors:</p><ul>{errors}</ul>")
    if ex["weights"]:
        wrows = "".join(
            f"<tr><td>{e(w['observation_id'])}</td>"
            f"<td>{'<b class=failed>yes</b>' if w['misleading'] else 'no'}"
            f"{' (no longer)' if w['misleading'] and w['misleading_now'] is False else ''}</td>"
            f'<td class="n">{w["previous_weight"]:.3f}</td>'
            f'<td class="n">{w["new_weight"]:.3f}</td>'
            f'<td class="n">{w["alpha"]:g}{" (doubled)" if w["aggressive"] else ""}</td>'
            f'<td class="n">{_fmt(w["weight_now"])}</td>'
            "</tr>"
            for w in ex["weights"]
        )
        parts.append(
            "<p>The weight step of each memory (misleading first):</p><table><thead><tr>"
            "<th>memory</th><th>misleading</th><th>before</th><th>after</th><th>alpha</th>"
            f"<th>now</th></tr></thead><tbody>{wrows}</tbody></table>"
        )
    return "".join(parts)


def explain_page(ex: dict[str, Any], db_path: str) -> str:
    """``memdiag explain SESSION_ID --html FILE``: one session, a page on its own."""
    return page(f"memdiag explain {ex['session_id']}", html.escape(db_path), explain_fragment(ex))
