"""How memory is doing, at a glance: the figures of ``memdiag status`` and of the HTML
report, read from DuckDB in one place."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

import duckdb

from memdiag.analytics import queries
from memdiag.analytics.db import DatabaseError
from memdiag.analytics.queries import pipeline_health, rows
from memdiag.contract import FOLLOWUP_CAVEAT, MISLEADING_CAVEAT, USED_CAVEAT

_FRESHNESS = """
SELECT max(ts) AS newest_event, max(ingested_at) AS last_written FROM (
    SELECT ts, ingested_at FROM searches
    UNION ALL SELECT ts, ingested_at FROM retrieval_feedback
    UNION ALL SELECT ts, ingested_at FROM session_diagnostics
    UNION ALL SELECT ts, ingested_at FROM judgements
    {memory}
)
"""
#: the recall pipeline's tables, in files that have them
_FRESHNESS_MEMORY = """
    UNION ALL SELECT clock, updated_at FROM pipeline_agents
"""


@dataclass(frozen=True)
class RecallWatch:
    """When ``status`` says an agent's recall fell (docs/rules.md, "Recall trends"): its SRR
    in the last ``window_seconds`` up to its clock is more than ``drop_points`` (absolute
    percentage points) below its SRR in the window before, each of at least ``min_probed``
    probed memories, and the fall is at least :data:`RECALL_FALL_Z` standard errors."""

    window_seconds: float = 86_400.0
    drop_points: float = 20.0
    min_probed: int = 10


#: a fall must also be this many standard errors (pooled two-proportion z): one-sided, about
#: 2% false alarms per agent and check when nothing changed, however small the windows
RECALL_FALL_Z = 2.0


def span_text(seconds: float) -> str:
    """A window as a person writes it: 90s, 30m, 24h, 7d."""
    for unit, size in (("w", 604_800), ("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:g}s"


def fall_z(hits: int, probed: int, previous_hits: int, previous_probed: int) -> float:
    """The pooled two-proportion z of a fall (positive: SRR fell); 0 without variance."""
    pooled = (hits + previous_hits) / (probed + previous_probed)
    var = pooled * (1 - pooled) * (1 / probed + 1 / previous_probed)
    return 0.0 if var <= 0 else (previous_hits / previous_probed - hits / probed) / math.sqrt(var)


def recall_judgement(con: duckdb.DuckDBPyConnection, watch: RecallWatch) -> dict[str, Any]:
    """Each probing agent's SRR in its last window against the window before:
    ``fell`` (more than ``watch.drop_points`` lower, and :data:`RECALL_FALL_Z` standard errors;
    decided on the counts as exact fractions, so an agent on the edge does not flip with float
    rounding), the largest fall first; ``stopped`` (probed enough before, none now: the prober
    itself may be down); ``checked``, the agents with enough probed memories on both sides;
    ``agents``, those with probes in either window."""
    fell, stopped, checked, agents = [], [], 0, 0
    need = max(watch.min_probed, 1)
    for r in rows(con, "recall_change", window_seconds=watch.window_seconds):
        if r["probed"] == 0 and r["previous_probed"] == 0:
            continue
        agents += 1
        if r["probed"] == 0 and r["previous_probed"] >= need:
            stopped.append(r)
            continue
        if min(r["probed"], r["previous_probed"]) < need:
            continue
        checked += 1
        change = (Fraction(r["hits"], r["probed"])
                  - Fraction(r["previous_hits"], r["previous_probed"])) * 100  # fmt: skip
        z = fall_z(r["hits"], r["probed"], r["previous_hits"], r["previous_probed"])
        if -change > Fraction(str(watch.drop_points)) and z >= RECALL_FALL_Z:
            fell.append({**r, "change_points": float(change), "z": z})
    return {
        "fell": sorted(fell, key=lambda r: (r["change_points"], r["agent_id"])),
        "stopped": stopped,
        "checked": checked,
        "agents": agents,
    }


def recall_falls(con: duckdb.DuckDBPyConnection, watch: RecallWatch) -> list[dict[str, Any]]:
    """The agents whose SRR fell (:func:`recall_judgement`), the largest fall first."""
    return list(recall_judgement(con, watch)["fell"])


#: the judged turns a memory needs before it counts as dead weight (as ``query
#: unused-memories`` by default)
UNUSED_MIN_INJECTIONS = 5


def status(
    con: duckdb.DuckDBPyConnection,
    top: int = 5,
    runs: int = 5,
    recall: RecallWatch | None = None,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
    stream_window: float = 30.0,
    with_proxies: bool = True,
    light_pipeline: bool = False,
) -> dict[str, Any]:
    """The figures of ``memdiag status`` (and the overview page, and the report's cards).
    ``org``, ``project`` and ``since`` select the sessions, searches and verdicts; misleading
    memories take the org and the time (they are counted per org and day), dead weight the
    time; the recall pipeline, benchmark runs and dead letters are of the whole file.
    ``light_pipeline``: the pipeline without its worst coverage and recall (see
    :func:`pipeline_summary`). ``with_proxies``: also what calibrate says of the two proxies
    here (:func:`proxy_strength`; the live view asks it apart, at most once a minute)."""
    where = {"org_id": org, "project_id": project, "since": since}
    followup = rows(con, "status_followup", **where)[0]
    feedback = rows(con, "status_feedback", **where)[0]
    judged = feedback["used"] + feedback["ignored"]
    outcomes = {r["outcome"]: r["sessions"] for r in rows(con, "status_outcomes", **where)}
    distribution = rows(con, "failure_distribution", **where)
    misleading = queries.misleading(con, org, since, top)
    recent_runs = rows(con, "status_runs", limit=runs)
    dead = rows(con, "status_dead_letters")
    unused = queries.unused_memories(con, UNUSED_MIN_INJECTIONS, since, top)
    pipeline = pipeline_summary(con, recall or RecallWatch(), light=light_pipeline)
    memory = _FRESHNESS_MEMORY if pipeline is not None else ""
    fresh = con.execute(_FRESHNESS.format(memory=memory)).fetchone() or (None, None)
    graph = queries.misleading_graph(con, org, since, top)
    strength = proxy_strength(con, stream_window, org, project, since) if with_proxies else None
    return {
        "filters": {"org": org, "project": project, "since": since},
        "followup": {**followup, "caveat": FOLLOWUP_CAVEAT},
        "feedback": {
            **feedback,
            "used_share": feedback["used"] / judged if judged else None,
            "caveat": USED_CAVEAT,
        },
        "sessions": outcomes,
        "failure_categories": distribution,
        "misleading": {
            "count": misleading.total,
            "top": misleading,
            # the knowledge graph's: entities and edges (contract section 10)
            "graph": graph,
            "graph_count": graph.total,
            "caveat": MISLEADING_CAVEAT,
        },
        # dead weight: judged in UNUSED_MIN_INJECTIONS+ turns, used in none (query
        # unused-memories); the most judged first
        "unused_memories": {
            "min_injections": UNUSED_MIN_INJECTIONS,
            "count": unused.total,
            "top": unused,
        },
        "runs": recent_runs,
        "pipeline": pipeline,
        "dead_letters": dead,
        "freshness": {"newest_event": fresh[0], "last_written": fresh[1]},
        # each live proxy's point estimate here, and whether it is near chance (calibrate)
        "proxies": strength,
    }


def proxy_strength(
    con: duckdb.DuckDBPyConnection,
    stream_window: float = 30.0,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
) -> dict[str, Any] | None:
    """What calibrate says of the two live proxies on this file (None without the report
    extra's numpy, which it needs)."""
    try:
        from memdiag.analytics.calibrate import proxies
    except ModuleNotFoundError:
        return None
    return proxies(con, stream_window, org, project, since)


def newest_event(con: duckdb.DuckDBPyConnection) -> datetime | None:
    """The newest event time in the file (``/healthz``, the freshness line)."""
    found = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'pipeline_agents' "
        "AND database_name = current_database()"
    ).fetchone()
    memory = _FRESHNESS_MEMORY if found and found[0] else ""
    row = con.execute(_FRESHNESS.format(memory=memory)).fetchone()
    return None if row is None else row[0]


def followup_over_time(con: duckdb.DuckDBPyConnection, buckets: int = 48) -> list[dict[str, Any]]:
    """The followup rate per time bucket (event time), for the report's chart."""
    return rows(con, "followup_over_time", buckets=buckets)


def feedback_per_observation(
    con: duckdb.DuckDBPyConnection, limit: int = 20
) -> list[dict[str, Any]]:
    """Used and ignored counts of the most judged observations."""
    return rows(con, "feedback_per_observation", limit=limit)


def pipeline_summary(
    con: duckdb.DuckDBPyConnection, recall: RecallWatch | None = None, light: bool = False
) -> dict[str, Any] | None:
    """The status line of the recall pipeline: the agents broken, then the worst coverage and
    recall, and the agents whose recall fell (``recall``). None for a file written before
    memdiag had it (its sink upgrades it). ``light``: without the worst coverage and recall
    (None), which take the whole ``pipeline_health`` view (the status cards do not show
    them)."""
    watch = recall or RecallWatch()
    if light:
        try:
            found = rows(con, "pipeline_broken")[0]
        except DatabaseError:
            return None
        agents: list[dict[str, Any]] = []
        broken = [dict(b) for b in found["broken"]]
    else:
        try:
            agents = pipeline_health(con)
        except DatabaseError:
            return None
        broken = [
            {"agent_id": a["agent_id"], "since": a["broken_since"], "unindexed": a["unindexed"]}
            for a in agents
            if a["broken"]
        ]
    try:
        judged: dict[str, Any] | None = recall_judgement(con, watch)
    except DatabaseError:  # a file from before the trends: the sink upgrades it
        judged = None

    def worst(column: str) -> dict[str, Any] | None:
        known = [a for a in agents if a[column] is not None]
        if not known:
            return None
        a = min(known, key=lambda a: (a[column], a["agent_id"]))
        return {"agent_id": a["agent_id"], "value": a[column]}

    return {
        "agents": found["agents"] if light else len(agents),
        "broken": broken,
        "worst_coverage": worst("pipeline_coverage"),
        "worst_recall": worst("semantic_recall_rate"),
        "recall_fell": None
        if judged is None
        else {
            "window_seconds": watch.window_seconds,
            "drop_points": watch.drop_points,
            "min_probed": watch.min_probed,
            "min_z": RECALL_FALL_Z,
            "agents": judged["fell"],
            "stopped_probing": judged["stopped"],
            "checked": judged["checked"],
            "probing_agents": judged["agents"],
        },
    }
