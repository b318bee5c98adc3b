"""``memdiag explain-memory ID --agent A``: one memory of one agent, read from DuckDB alone.

What the recall pipeline knows of it (written, indexed, its status and name key), whether any
path reaches it (indexed, or in the agent's latest ambient context), its probes with where
each one's query came from (its name or a task) and why each name probe missed, and, for
each, what came back in its place: the memories ranked in the first ``k``, their names, and
which are look-alikes of its name (same name key, or half their tokens shared:
``look_alike`` in schema.sql), the ones that alias it. Memory ids are an agent's own, so the
agent is part of the question.

Its verdict is its latest name probe (the one SRR counts; contract section 9); its latest
task probe is told apart: a task probe that misses what the name finds is the recall paper's
query-formulation failure, not the pipeline's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import duckdb

from memdiag.analytics.lookup import NotFound, ensure_known
from memdiag.analytics.queries import counted, rows


class UnknownMemory(NotFound):
    """No row of that memory for that agent: the message names memories that are."""


#: what a miss's reason tells an on-call engineer to look at
ADVICE = {
    "not_indexed": "the indexer: the memory was not indexed when the probe ran",
    "below_threshold": "the embedding or the threshold: found in the first k, scored below it",
    "aliased": "the names: a look-alike (same name key or half its tokens) came back instead; "
    "rank by recency or make names distinct",
    "outranked": "the ranking: other memories scored higher",
}
#: what a task probe's miss tells, when the memory's name probe finds it
TASK_ADVICE = (
    "the query: made from a task, it does not reach the memory its name finds (the "
    "query-formulation gap); write the memory in the words its tasks use, or probe with them"
)


def explain_memory(
    con: duckdb.DuckDBPyConnection, agent_id: str, memory_id: str, limit: int = 20
) -> dict[str, Any]:
    """Everything DuckDB knows of one memory; :class:`UnknownMemory` if nothing."""
    ensure_known(con, "memory_agent", agent_id)
    found = rows(con, "explain_memory", agent_id=agent_id, memory_id=memory_id)
    probes = counted(con, "explain_memory_probes", agent_id=agent_id, memory_id=memory_id,
                     limit=limit)  # fmt: skip
    if not found and not probes:
        suggestions = rows(con, "explain_memory_suggest", agent_id=agent_id, limit=5)
        known = rows(con, "agent_memory_count", agent_id=agent_id)[0]["memories"]
        missed = rows(con, "agent_missed_count", agent_id=agent_id)[0]["missed"]
        hint = ", ".join(
            f"{r['memory_id']}" + (" (latest probe missed)" if r["hit"] is False else "")
            for r in suggestions
        )
        of = (f"{len(suggestions)} of its {known:,}; {missed:,} missed their latest probe"
              if known > len(suggestions) else f"all {known:,}")  # fmt: skip
        raise UnknownMemory(
            f"no such memory {memory_id!r} of agent {agent_id!r} in this DuckDB file"
            + (
                f"; its memories include ({of}): {hint}"
                if hint
                else "; the agent has no memories here"
            ),
            kind="memory",
            id=memory_id,
            closest=[r["memory_id"] for r in suggestions],
            known=known,
            agent=agent_id,
        )
    memory = found[0] if found else None
    ids = sorted({r for p in probes for r in p["top_ids"] or ()})
    target_name = memory["name"] if memory else None
    found_names = rows(con, "explain_memory_names", agent_id=agent_id, memory_ids=ids,
                       target_name=target_name)  # fmt: skip
    names = {r["memory_id"]: r for r in found_names}
    unknown: dict[str, Any] = {"name": None, "status": None, "name_key": None, "look_alike": False}
    for p in probes:
        top = [(r, names.get(r, unknown)) for r in p.pop("top_ids") or ()]
        p["top"] = [
            {
                "memory_id": r,
                "name": n["name"],
                "status": n["status"],
                "is_target": r == memory_id,
                "look_alike": r != memory_id and bool(n["look_alike"]),
            }
            for r, n in top
        ]
        p["instead"] = [t["memory_id"] for t in p["top"] if not t["is_target"]]
    latest_of = {p["query_source"]: p for p in probes if p.pop("latest_of_source")}
    # the miss reasons are the name probes' (a task probe has none)
    reasons = Counter(p["miss_reason"] for p in probes if not p["hit"] and p["miss_reason"])
    latest = latest_of.get("name")
    task = latest_of.get("task")
    # as pipeline_health counts it: past the deadline unindexed, not in the ambient context
    unreachable = None
    if memory is not None:
        unreachable = memory["status"] == "unindexed" and not memory["in_ambient"]
    return {
        "agent_id": agent_id,
        "memory_id": memory_id,
        "memory": memory,
        "unreachable": unreachable,
        "probes": probes,
        "probe_summary": {
            "shown": len(probes),
            "total": probes.total,
            "hits": sum(bool(p["hit"]) for p in probes),
            "misses": dict(sorted(reasons.items())),
            "task_probes": sum(p["query_source"] == "task" for p in probes),
        },
        "latest": None
        if latest is None
        else {
            "hit": latest["hit"],
            "miss_reason": latest["miss_reason"],
            "look_at": ADVICE.get(latest["miss_reason"]) if not latest["hit"] else None,
            "look_alikes_above": [t["memory_id"] for t in latest["top"] if t["look_alike"]],
        },
        "latest_task": None
        if task is None
        else {
            "hit": task["hit"],
            "look_at": TASK_ADVICE if not task["hit"] and latest and latest["hit"] else None,
        },
    }
