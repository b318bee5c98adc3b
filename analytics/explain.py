"""``memdiag explain SESSION_ID``: one session's story, read from DuckDB alone.

The searches with their followup verdicts (and why), the evaluated turns with every injected
memory used or ignored, the outcome with its failure category and the rule that fired, the
weight step the session gave each memory (the misleading ones first), and "never searched"
when the agent did not ask its memory. No state in the worker: everything here is what the
sink wrote, so it explains the rows an analyst sees.

:func:`explain` returns plain data (the ``--json`` output); :func:`timeline` merges it into
one list in event time, which the terminal and the HTML page both render.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import duckdb

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.lookup import NotFound, lookup
from memdiag.analytics.queries import rows
from memdiag.contract import FAILED_OUTCOMES, TRUNCATED
from memdiag.contract.categories import classify
from memdiag.contract.words import SEMANTIC, is_used


class UnknownSession(NotFound):
    """No row of that session in DuckDB: the message names sessions that are."""


def seconds(value: float) -> str:
    """A gap in seconds, to the microsecond, without trailing zeros: ``25.355``, ``3``."""
    return f"{value:.6f}".rstrip("0").rstrip(".")


def search_verdict(s: dict[str, Any], earlier_judged: bool = False) -> str:
    """Why a search is, or is not, a followup, from its stored columns. ``earlier_judged``:
    an evaluated search of the session comes before it in event time."""
    if s["source"] != "agent":
        return "viewer search: not judged"
    if not s["evaluated"]:
        return "no results: a retrieval failure, not judged"
    prev, gap = s["prev_event_id"], s["gap_seconds"]
    if prev is None:
        if earlier_judged:
            return (
                "no predecessor remembered (the one before is past the retention): not a followup"
            )
        return "the session's first search: never a followup"
    after = f"{prev}, {seconds(gap)} s later"
    if s["is_followup"]:
        return f"followup of {after}: a new query, no result in common"
    if s["disjoint_new_query"] is None:  # a row from before memdiag stored the column
        return f"not a followup of {after}"
    if s["disjoint_new_query"]:
        return f"not a followup of {after}: past the followup window"
    return f"not a followup of {after}: the same query again, or a result in common"


def verdict_rule(v: dict[str, Any]) -> str:
    """Which rule made a stored used/ignored verdict, from its columns: ``keyword`` (the
    keyword rule said used; or, under the keyword detector, ignored), ``similarity`` (used
    although the keyword rule said ignored: the similarity reached the threshold) or
    ``neither`` (ignored under the semantic detector: both rules said ignored). The keyword
    rule is recomputed from the stored counts (contract section 3), so no threshold is
    needed to tell."""
    if v["signal"] == "used":
        return "keyword" if is_used(v["matched_count"], v["keyword_count"]) else "similarity"
    return "neither" if v.get("detector") == SEMANTIC else "keyword"


#: How :func:`verdict_text` names each rule.
RULE_WORDS = {
    "keyword": "by the keyword rule",
    "similarity": "by the similarity",
    "neither": "by neither rule",
}


def verdict_text(v: dict[str, Any]) -> str:
    """A verdict's evidence, plain text: ``0.18 (2 of 11 keywords matched)``, and under the
    semantic detector ``· similarity 0.42 · by the similarity`` after it."""
    text = f"{v['match_ratio']:.2f} ({v['matched_count']} of {v['keyword_count']} keywords matched)"
    if v.get("detector") != SEMANTIC:
        return text
    sim = "none" if v.get("similarity") is None else f"{v['similarity']:.3f}"
    rule = v.get("rule") or verdict_rule(v)
    return f"{text} · similarity {sim} · {RULE_WORDS[rule]}"


def explain(con: duckdb.DuckDBPyConnection, session_id: str) -> dict[str, Any]:
    """Everything DuckDB knows of one session; :class:`UnknownSession` if nothing."""
    searches = rows(con, "explain_searches", session_id=session_id)
    feedback = rows(con, "explain_feedback", session_id=session_id)
    found = rows(con, "explain_session", session_id=session_id)
    diag = found[0] if found else None
    dead = rows(con, "explain_dead_letters", session_id=session_id)
    if not (searches or feedback or diag):
        # ids that contain the one asked for (a typo, a prefix), else the newest failed ones
        suggestions = rows(con, "explain_suggest", session_id=session_id, limit=5)
        _, known, _ = lookup(con, "session", session_id)
        hint = ", ".join(f"{r['session_id']} ({r['outcome']})" for r in suggestions)
        of = f"{len(suggestions)} of {known:,}" if known > len(suggestions) else f"all {known:,}"
        refused = ""
        if dead:  # every event it sent was refused: that is its story
            refused = (
                f"; {plural(dead[0]['in_all'], 'dead letter')} name it "
                f"({', '.join(sorted({d['reason'] for d in dead}))}): see `memdiag query "
                "dead-letters`"
            )
        raise UnknownSession(
            f"no such session {session_id!r} in this DuckDB file"
            + refused
            + (f"; try ({of} sessions): {hint}" if hint else "; it has no session outcomes"),
            kind="session",
            id=session_id,
            closest=[r["session_id"] for r in suggestions],
            known=known,
        )
    judged_before = False
    for s in searches:
        s["verdict"] = search_verdict(s, judged_before)
        judged_before = judged_before or bool(s["evaluated"])
    turns: OrderedDict[str, dict[str, Any]] = OrderedDict()  # in event time (the SQL's order)
    for f in feedback:
        turn = turns.setdefault(f["turn_id"], {"turn_id": f["turn_id"], "ts": f["ts"]})
        turn.setdefault("memories", []).append(
            {
                k: f[k]
                for k in (
                    "observation_id",
                    "signal",
                    "match_ratio",
                    "matched_count",
                    "keyword_count",
                    "similarity",
                    "detector",
                    "previous_strength",
                    "strength",
                )
            }
            | {"rule": verdict_rule(f)}
        )
        turn["ts"] = max(turn["ts"], f["ts"])
    for turn in turns.values():
        turn["used"] = sum(m["signal"] == "used" for m in turn["memories"])
        turn["ignored"] = len(turn["memories"]) - turn["used"]
    agent = [s for s in searches if s["source"] == "agent"]
    scope = diag or (searches[0] if searches else feedback[0])
    result: dict[str, Any] = {
        "session_id": session_id,
        "agent_id": scope["agent_id"],
        "org_id": scope["org_id"],
        "project_id": scope["project_id"],
        "searches": searches,
        "search_summary": {
            "agent": len(agent),
            "followups": sum(bool(s["is_followup"]) for s in agent),
            "viewer": len(searches) - len(agent),
            "empty": sum(s["result_count"] == 0 for s in agent),
        },
        "never_searched": not agent,
        "turns": list(turns.values()),
        "outcome": None,
        "pipeline": None,
        "weights": [],
        # its inputs memdiag could not take (the newest 20; ``in_all`` on each: how many)
        "dead_letters": dead,
    }
    judged = {m["observation_id"] for t in turns.values() for m in t["memories"]}
    if diag is None:
        result["unjudged_memories"] = []
        return result
    result["unjudged_memories"] = [o for o in diag["injected_observation_ids"] if o not in judged]
    outcome = {
        k: diag[k]
        for k in (
            "outcome",
            "failure_category",
            "ts",
            "event_id",
            "search_count",
            "followup_count",
            "failure_context",
            "files_modified",
            "helpful_observation_ids",
            "ignored_observation_ids",
            "misleading_observation_ids",
            "injected_observation_ids",
            "injected_graph_entity_ids",
            "injected_graph_edge_keys",
        )
    }
    outcome["tool_calls"] = diag["tool_call_summary"]
    outcome["errors"] = diag["errors_encountered"]
    outcome["failed"] = diag["outcome"] in FAILED_OUTCOMES
    outcome["rule"] = None
    if outcome["failed"]:
        fired = classify(
            [(c["tool"], bool(c["success"])) for c in diag["tool_call_summary"] or ()],
            [e["message"] for e in diag["errors_encountered"] or () if e["message"] is not None],
            diag["files_modified"],
        )
        # The rule as memdiag applies it now; a file written under other rules may differ.
        outcome["rule"] = fired.reason
        trimmed = _trimmed(diag["failure_context"])
        cut = set(trimmed.get("fields") or ()) if trimmed else set()
        if fired.category != diag["failure_category"] and cut & CLASSIFIED_FROM:
            # the worker classified the whole outcome; the row keeps only part of its lists
            fields = ", ".join(sorted(cut & CLASSIFIED_FROM))
            outcome["rule"] = (
                f"stored as {diag['failure_category']}, by the rules on the whole outcome; "
                f"the row was trimmed to fit one Kafka message ({fields}), and its part "
                f"gives {fired.category}: {fired.reason}"
            )
        elif fired.category != diag["failure_category"]:
            outcome["rule"] = (
                f"stored as {diag['failure_category']}; today's rules give {fired.category}: "
                f"{fired.reason}"
            )
    result["outcome"] = outcome
    result["pipeline"] = _pipeline_at_outcome(con, session_id)
    result["weights"] = rows(con, "explain_weights", session_id=session_id)
    misleading = set(diag["misleading_observation_ids"])
    for w in result["weights"]:
        w["misleading"] = w["observation_id"] in misleading
    return result


def _pipeline_at_outcome(con: duckdb.DuckDBPyConnection, session_id: str) -> dict[str, Any] | None:
    """The agent's memory pipeline at the outcome's time (``session_pipeline``): broken,
    healthy, no_agent_id or no_memory_events; None for a file that predates the view."""
    try:
        found = rows(con, "explain_session_pipeline", session_id=session_id)
    except DatabaseError:
        return None
    return found[0] if found else None


def pipeline_down(ex: dict[str, Any]) -> tuple[str, str] | None:
    """When the session ended while its agent's memory pipeline was down: the words to
    stress and the rest, plain text (the terminal and the HTML mark them up); else None."""
    p = ex.get("pipeline")
    if p is None or p["pipeline_state"] != "broken":
        return None
    since = p["break_since"].astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    until = (
        "still down"
        if p["break_until"] is None
        else "until " + p["break_until"].astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    )
    return "memory pipeline down", (
        f" at the outcome: nothing indexed since {since} UTC ({until}; first missed memory "
        f"{p['break_first_memory_id']}): memories written meanwhile could not be found "
        "(`memdiag breaks` compares)"
    )


def plural(n: int, singular: str, plural: str | None = None) -> str:
    return f"{n:,} {singular if n == 1 else (plural or singular + 's')}"


def search_summary(ex: dict[str, Any]) -> str:
    """``3 agent searches, 2 followups, 1 empty, 1 viewer``."""
    ss = ex["search_summary"]
    return (
        f"{plural(ss['agent'], 'agent search', 'agent searches')}, "
        f"{plural(ss['followups'], 'followup')}"
        + (f", {ss['empty']} empty" if ss["empty"] else "")
        + (f", {ss['viewer']} viewer" if ss["viewer"] else "")
    )


def turn_summary(ex: dict[str, Any]) -> str:
    """``3 evaluated turns: 3 of 10 verdicts 'used' (7 distinct memories)``."""
    turns = ex["turns"]
    judged = sum(len(t["memories"]) for t in turns)
    used = sum(t["used"] for t in turns)
    distinct = len({m["observation_id"] for t in turns for m in t["memories"]})
    return (
        f"{plural(len(turns), 'evaluated turn')}: {used} of {plural(judged, 'verdict')} "
        f"'used' ({plural(distinct, 'distinct memory', 'distinct memories')})"
    )


def timeline(ex: dict[str, Any]) -> list[dict[str, Any]]:
    """The session's searches, turns and outcome as one list in event time, each with the
    seconds since the session's first event (``at``)."""
    items: list[tuple[datetime, int, dict[str, Any]]] = []
    for i, s in enumerate(ex["searches"]):
        items.append((s["ts"], i, {"kind": "search", "ts": s["ts"], "search": s}))
    for i, t in enumerate(ex["turns"]):
        items.append((t["ts"], 10_000_000 + i, {"kind": "turn", "ts": t["ts"], "turn": t}))
    if ex["outcome"] is not None:
        o = ex["outcome"]
        items.append((o["ts"], 20_000_000, {"kind": "outcome", "ts": o["ts"], "outcome": o}))
    items.sort(key=lambda x: (x[0], x[1]))
    start = items[0][0] if items else None
    for ts, _, item in items:
        item["at"] = (ts - start).total_seconds() if start is not None else 0.0
    return [item for _, _, item in items]


#: what the failure category is classified from: a row trimmed in one of these is read in part
CLASSIFIED_FROM = frozenset({"tool_call_summary", "errors_encountered", "files_modified"})


def _trimmed(context: Any) -> dict[str, Any] | None:
    """What the worker trimmed of a row too large for one Kafka message (its note in
    ``failure_context``, which DuckDB holds as JSON text); None for a whole row."""
    if isinstance(context, str) and TRUNCATED in context:
        try:
            context = json.loads(context)
        except ValueError:
            return None
    note = context.get(TRUNCATED) if isinstance(context, dict) else None
    return note if isinstance(note, dict) else None
