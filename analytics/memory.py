"""``memdiag explain-memory ID --agent A``: one memory of one agent, read from DuckDB alone.

What the recall pipeline knows of it (written, indexed, its status and name key), whether any
path reaches it (indexed, or in the agent's latest ambient context), its probes with why each
missed, and, for each, what came back in its place: the memories ranked in the first ``k``,
their names, and which are look-alikes of its name (same name key, or half their tokens
shared: ``look_alike`` in schema.sql), the ones that alias it. Memory ids are an
agent's own, so the agent is part of the question.
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
    reasons = Counter(p["miss_reason"] for p in probes if not p["hit"])
    latest = probes[0] if probes else None
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
        },
        "latest": None
        if latest is None
        else {
            "hit": latest["hit"],
            "miss_reason": latest["miss_reason"],
            "look_at": ADVICE.get(latest["miss_reason"]) if not latest["hit"] else None,
            "look_alikes_above": [t["memory_id"] for t in latest["top"] if t["look_alike"]],
        },
    }
