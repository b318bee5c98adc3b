"""``memdiag report html``: one self-contained page, and ``explain --html``: one session.

Both are made of the fragments the live view shows (:mod:`memdiag.views.html`), with their
stylesheet inlined and no script, so a page can be mailed, attached to an incident or opened
offline. In the report, the latest failed sessions (and the latest failed session of each
misleading memory shown) are embedded below, and every link to a session lands on the page.
"""

from __future__ import annotations

from typing import Any

import duckdb

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.explain import explain
from memdiag.analytics.positional import by_run as positional_by_run
from memdiag.analytics.queries import (
    TREND_GRAINS,
    TREND_ORIGIN,
    failed_sessions,
    pipeline_coverage_over_time,
    pipeline_health,
    recall_trend,
    rows,
)
from memdiag.analytics.status import feedback_per_observation, followup_over_time, status
from memdiag.views import html as h
from memdiag.views.charts import BAR, CORRECT, IGNORED, READER, RETRIEVAL, USED

__all__ = ["BAR", "CORRECT", "IGNORED", "READER", "RETRIEVAL", "USED", "explain_page", "render"]

FAILED_SESSIONS = 10  # the newest failed sessions the report lists and embeds
TREND_BUCKETS = 60  # most time buckets in the recall trend chart (it picks its grain by them)


def trend_grain(first: Any, last: Any) -> str:
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


def recall_trends(
    con: duckdb.DuckDBPyConnection, order: list[str], agent: str | None = None
) -> str:
    """SRR and ATR over time and over the memory count, per agent (``query recall-trend``);
    and the task probes' recall over time beside SRR, for the agents that have them."""
    try:
        span = rows(con, "recall_span")[0]
        if span["first"] is None:
            return "<p>No recall probes or ambient contexts: no trends.</p>"
        grain = trend_grain(span["first"], span["last"])
        over_time = recall_trend(con, grain, agent)
        by_count = recall_trend(con, "memory-count", agent)
    except DatabaseError:  # a file from before the trends (or their task recall)
        return "<p>Start <code>memdiag sink</code> on this file once to see the recall trends.</p>"
    tasked = {r["agent_id"] for r in over_time if r["task_probed"]}
    task = ""
    if tasked:
        task = f"<h3>Recall by a task's words (task probes) by {grain}</h3>" + h.recall_trend_chart(
            [r for r in over_time if r["agent_id"] in tasked],
            "task_recall_rate",
            f"task recall by {grain}",
            False,
            order,
        )
    return (
        f"<h3>Recall (SRR) by {grain}: does it fall over time?</h3>"
        + h.recall_trend_chart(over_time, "semantic_recall_rate", f"SRR by {grain}", False, order)
        + "<h3>Recall (SRR) by memory count: does it fall as memory grows?</h3>"
        + h.recall_trend_chart(by_count, "semantic_recall_rate", "SRR by memory count", True, order)
        + task
        + f"<h3>Ambient (ATR) by {grain}</h3>"
        + h.recall_trend_chart(over_time, "ambient_trigger_rate", f"ATR by {grain}", False, order)
        + h.note(
            f"SRR of each memory's latest name probe in the {grain} (or at that memory count); "
            "task recall the same of the probes made from a task's words (below SRR: the "
            "query-formulation gap); ATR the "
            "mean over the ambient contexts there of the share of the agent's memories written "
            "by then that the context names: it falls as memory grows unless the context grows "
            "too. Hollow points rest on fewer than 3 probes (contexts). Aliasing (look-alike "
            "names piling up) makes SRR fall with the memory count; a sudden fall in time is a "
            "change in the pipeline (<code>memdiag status</code> flags it; <code>memdiag query "
            "recall-trend</code>)."
        )
    )


def pipeline_section(
    con: duckdb.DuckDBPyConnection, p: dict[str, Any] | None, links: h.Links
) -> str:
    from memdiag.analytics.breaks import break_impact

    if p is None:
        return (
            "<p>This file predates pipeline health: start <code>memdiag sink</code> on it once.</p>"
        )
    if not p["agents"]:
        return "<p>No memory events (<code>memdiag.memory</code>).</p>"
    agents = pipeline_health(con)
    order = [a["agent_id"] for a in agents]
    fell = p.get("recall_fell") or {"agents": [], "stopped_probing": []}
    first = [a["agent_id"] for a in fell["agents"] + fell["stopped_probing"]]
    order = first + [a for a in order if a not in first]  # the trends draw these first
    return (
        h.pipeline_table(agents, links)
        + h.query_sources(agents, links)
        + h.recall_fell(p, links)
        + "<h3>Coverage (PC) over time</h3>"
        + h.coverage_chart(pipeline_coverage_over_time(con), order)
        + recall_trends(con, order)
        + "<h3>Sessions during pipeline breaks</h3>"
        + h.breaks_table(break_impact(con), links)
    )


def render(con: duckdb.DuckDBPyConnection, db_path: str) -> str:
    """The report: the overview's figures, the charts, the pipeline, the benchmark runs, and
    the latest failed sessions told in full."""
    st = status(con, top=10, runs=10)
    failed = failed_sessions(con, limit=FAILED_SESSIONS)
    # Embed the latest failed sessions, and the latest failed session of each misleading
    # memory shown, so every link of the page lands on this page.
    embedded = [r["session_id"] for r in failed]
    for m in st["misleading"]["top"]:
        sid = m.get("latest_failed_session_id")
        if sid is not None and sid not in embedded:
            embedded.append(sid)
    inside = set(embedded)
    links = h.Links(session=lambda sid: f"#{h.anchor(sid)}" if sid in inside else None)
    body = h.cards(st, links) + "".join(
        h.section(title, body, id=sid)
        for sid, title, body in (
            ("failures", "Failed sessions", h.failure_distribution(st["failure_categories"])),
            ("followups", "Followups", h.followup_chart(followup_over_time(con))),
            (
                "feedback",
                "Used and ignored memories",
                h.feedback_chart(feedback_per_observation(con)),
            ),
            ("misleading", "Misleading memories", h.misleading(st["misleading"], links)),
            (
                "dead-weight",
                "Dead weight: memories never used",
                h.dead_weight(st["unused_memories"], links),
            ),
            (
                "pipeline",
                "Recall pipeline: written, indexed, recalled",
                pipeline_section(con, st["pipeline"], links),
            ),
            (
                "runs",
                "Benchmark runs",
                (
                    h.runs_chart(st["runs"])
                    + h.note(
                        "A reader failure had all its gold evidence in the context and was still "
                        "wrong: improve the reader. A retrieval failure never got the evidence."
                    )
                    + h.positional_runs(positional_by_run(con, [r["run_id"] for r in st["runs"]]))
                    if st["runs"]
                    else "<p>No benchmark judgements.</p>"
                ),
            ),
            ("dead-letters", "Dead letters", h.dead_letter_counts(st["dead_letters"], h.PLAIN)),
            (
                "failed-sessions",
                "Latest failed sessions",
                h.failed_sessions(
                    failed,
                    links,
                    "<code>memdiag query failed-sessions --limit N</code> lists more;"
                    " each one here links to its story below",
                ),
            ),
        )
    )
    body += "".join(
        f'<details id="{h.anchor(sid)}"><summary>{h.e(sid)}</summary>'
        f"{h.explain(explain(con, sid), links)}</details>"
        for sid in embedded
    )
    newest = st["freshness"]["newest_event"]
    fresh = h.fmt(newest) + " UTC" if newest else "no events"
    return h.page("memdiag report", body, f"{h.e(db_path)} · newest event {h.e(fresh)}")


def explain_page(ex: dict[str, Any], db_path: str) -> str:
    """``memdiag explain SESSION_ID --html FILE``: one session, a page on its own."""
    return h.page(f"memdiag explain {ex['session_id']}", h.explain(ex, h.PLAIN), h.e(db_path))
