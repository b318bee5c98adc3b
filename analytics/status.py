"""How memory is doing, at a glance: the figures of ``memdiag status`` and of the HTML
report, read from DuckDB in one place."""

from __future__ import annotations

from typing import Any

import duckdb

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.queries import pipeline_health, rows
from memdiag.contract import FOLLOWUP_CAVEAT, USED_CAVEAT

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


#: the judged turns a memory needs before it counts as dead weight (as ``query
#: unused-memories`` by default)
UNUSED_MIN_INJECTIONS = 5


def status(con: duckdb.DuckDBPyConnection, top: int = 5, runs: int = 5) -> dict[str, Any]:
    followup = rows(con, "status_followup")[0]
    feedback = rows(con, "status_feedback")[0]
    judged = feedback["used"] + feedback["ignored"]
    outcomes = {r["outcome"]: r["sessions"] for r in rows(con, "status_outcomes")}
    distribution = rows(con, "failure_distribution", org_id=None, project_id=None, since=None)
    misleading = rows(con, "misleading", org_id=None, since=None, limit=top)
    recent_runs = rows(con, "status_runs", limit=runs)
    dead = rows(con, "status_dead_letters")
    unused = rows(con, "unused_memories", min_injections=UNUSED_MIN_INJECTIONS, since=None,
                  limit=top)  # fmt: skip
    pipeline = pipeline_summary(con)
    memory = _FRESHNESS_MEMORY if pipeline is not None else ""
    fresh = con.execute(_FRESHNESS.format(memory=memory)).fetchone() or (None, None)
    return {
        "followup": {**followup, "caveat": FOLLOWUP_CAVEAT},
        "feedback": {
            **feedback,
            "used_share": feedback["used"] / judged if judged else None,
            "caveat": USED_CAVEAT,
        },
        "sessions": outcomes,
        "failure_categories": distribution,
        "misleading": {
            "count": rows(con, "status_misleading_count")[0]["observations"],
            "top": misleading,
            # the knowledge graph's: entities and edges (contract section 10)
            "graph": rows(con, "misleading_graph", org_id=None, since=None, limit=top),
        },
        # dead weight: judged in UNUSED_MIN_INJECTIONS+ turns, used in none (query
        # unused-memories); the most judged first
        "unused_memories": {"min_injections": UNUSED_MIN_INJECTIONS, "top": unused},
        "runs": recent_runs,
        "pipeline": pipeline,
        "dead_letters": dead,
        "freshness": {"newest_event": fresh[0], "last_written": fresh[1]},
    }


def followup_over_time(con: duckdb.DuckDBPyConnection, buckets: int = 48) -> list[dict[str, Any]]:
    """The followup rate per time bucket (event time), for the report's chart."""
    return rows(con, "followup_over_time", buckets=buckets)


def feedback_per_observation(
    con: duckdb.DuckDBPyConnection, limit: int = 20
) -> list[dict[str, Any]]:
    """Used and ignored counts of the most judged observations."""
    return rows(con, "feedback_per_observation", limit=limit)


def pipeline_summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    """The status line of the recall pipeline: the agents broken, then the worst coverage and
    recall. None for a file written before memdiag had it (its sink upgrades it)."""
    try:
        agents = pipeline_health(con)
    except DatabaseError:
        return None

    def worst(column: str) -> dict[str, Any] | None:
        known = [a for a in agents if a[column] is not None]
        if not known:
            return None
        a = min(known, key=lambda a: (a[column], a["agent_id"]))
        return {"agent_id": a["agent_id"], "value": a[column]}

    return {
        "agents": len(agents),
        "broken": [
            {"agent_id": a["agent_id"], "since": a["broken_since"], "unindexed": a["unindexed"]}
            for a in agents
            if a["broken"]
        ],
        "worst_coverage": worst("pipeline_coverage"),
        "worst_recall": worst("semantic_recall_rate"),
    }
