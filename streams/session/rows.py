"""The rows a session sends to the sink (``memdiag.diagnostics``, kind by kind): a search with
its followup verdict, an observation's verdict in a turn (or its retraction), and the
session diagnostic; and the counts of a verdict. Pure functions of the session's records and
verdicts."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from memdiag.contract import ACCEPTED, FEEDBACK, FEEDBACK_RETRACTED
from memdiag.contract.envelope import MINUTE_US, Output
from memdiag.schemas.models import format_ts
from memdiag.streams.rules.diagnosis import failure_category
from memdiag.streams.rules.followup import Verdict
from memdiag.streams.rules.turns import Judged
from memdiag.streams.session.records import OutcomeRec, SearchRec

Scope = tuple[str | None, str | None, str | None]  # agent_id, org_id, project_id


@lru_cache(maxsize=1024)
def _published_at(published_ms: int) -> str:
    """A message's events share their publish time: formatted once."""
    return format_ts(published_ms * 1000)


def search_row(
    session_id: str, rec: SearchRec, verdict: Verdict | None, scope: Scope, ts: str | None = None
) -> dict[str, Any]:
    """``ts``: the row's time as written (:func:`memdiag.schemas.models.written_ts`) where
    the caller has it; else it is formatted from the record's."""
    agent_id, org_id, project_id = scope
    ids = rec.result_ids
    if verdict is None:
        is_followup, prev_event_id, gap_seconds, disjoint_new_query = False, None, None, False
    else:
        is_followup, prev_event_id = verdict.is_followup, verdict.prev_event_id
        gap_us = verdict.gap_us
        gap_seconds = None if gap_us is None else gap_us / 1_000_000
        disjoint_new_query = verdict.disjoint_new_query
    evaluated = not isinstance(ids, int)
    row: dict[str, Any] = {
        "kind": "search",
        "event_id": rec.event_id,
        "session_id": session_id,
        "ts": format_ts(rec.ts) if ts is None else ts,
        "source": rec.source,
        "result_count": ids if isinstance(ids, int) else len(ids),
        "evaluated": evaluated,
        "is_followup": is_followup,
        "prev_event_id": prev_event_id,
        "gap_seconds": gap_seconds,
        "disjoint_new_query": disjoint_new_query,
        "agent_id": agent_id,
        "org_id": org_id,
        "project_id": project_id,
        "published_at": _published_at(rec.published_ms),
    }
    if rec.query is not None:
        row["query"] = rec.query
    return row


def feedback_row(
    session_id: str, turn_id: str, obs_id: str, judged: Judged, scope: Scope, fallback: Scope
) -> dict[str, Any]:
    """A verdict, with the response's scope (each field falling back to the injection's)."""
    fb = judged.feedback
    agent_id, org_id, project_id = (
        a if a is not None else b for a, b in zip(scope, fallback, strict=True)
    )
    return {
        "kind": "retrieval_feedback",
        "session_id": session_id,
        "turn_id": turn_id,
        "observation_id": obs_id,
        "signal": fb.signal,
        "match_ratio": fb.match_ratio,
        "keyword_count": fb.keyword_count,
        "matched_count": fb.matched_count,
        "ts": format_ts(judged.ts_us),
        "agent_id": agent_id,
        "org_id": org_id,
        "project_id": project_id,
        "similarity": fb.similarity,
        "detector": fb.detector,
    }


def retracted_row(session_id: str, turn_id: str, obs_id: str) -> dict[str, Any]:
    """An observation no longer in a turn (a late span moved it): the sink deletes its row."""
    return {
        "kind": "retrieval_feedback",
        "session_id": session_id,
        "turn_id": turn_id,
        "observation_id": obs_id,
        "retracted": True,
    }


def count_verdict(out: Output, before: Judged | None, now: Judged | None) -> None:
    """Count a verdict that replaces ``before`` (``None``: the first) with ``now`` (``None``:
    taken back). The counters only go up: a verdict taken back is counted in
    ``retrieval_feedback_retracted_total`` in the minute of event time it was counted in, so
    the two counters' difference, over any window, is the verdicts that stand. A verdict that
    keeps its signal and its minute counts nothing again."""
    if before is not None and now is not None:
        if before.feedback.signal == now.feedback.signal and (
            before.ts_us // MINUTE_US == now.ts_us // MINUTE_US
        ):
            return
    if before is not None:
        out.count(FEEDBACK_RETRACTED, at_us=before.ts_us, signal=before.feedback.signal)
    if now is not None:
        out.count(FEEDBACK, at_us=now.ts_us, signal=now.feedback.signal)


def category_of(rec: OutcomeRec) -> str:
    return failure_category(
        ((tool, success) for tool, _, success in rec.tool_calls),
        [message for message, _, _ in rec.errors],
        rec.files,
    )


def diagnostic_row(
    session_id: str,
    rec: OutcomeRec,
    scope: Scope,
    observations: list[str],
    entities: list[str],
    edges: list[tuple[str, str, str]],
    misleading: list[str],
    ignored: list[str],
    search_count: int,
    followup_count: int,
) -> dict[str, Any]:
    """The ``session_diagnostic`` of a closed session, with the fields of its last outcome:
    the full record for a failed one, a light one for an accepted one."""
    agent_id, org_id, project_id = scope
    failed = rec.outcome != ACCEPTED
    return {
        "kind": "session_diagnostic",
        "event_id": rec.event_id,
        "session_id": session_id,
        "outcome": rec.outcome,
        "failure_category": category_of(rec) if failed else None,
        "failure_context": rec.failure_context,
        "injected_observation_ids": observations,
        "injected_graph_entity_ids": entities,
        "injected_graph_edge_keys": [
            {"source_id": s, "target_id": t, "relationship": r} for s, t, r in edges
        ],
        "tool_call_summary": (
            [{"tool": tool, "file": file, "success": ok} for tool, file, ok in rec.tool_calls]
            if failed
            else None
        ),
        "files_modified": list(rec.files) if failed and rec.files is not None else None,
        "errors_encountered": (
            [{"message": m, "tool": tool, "recoverable": r} for m, tool, r in rec.errors]
            if failed
            else None
        ),
        "helpful_observation_ids": list(rec.helpful),
        "misleading_observation_ids": misleading if failed else [],
        "ignored_observation_ids": ignored,
        "search_count": search_count,
        "followup_count": followup_count,
        "ts": format_ts(rec.ts),
        "agent_id": agent_id,
        "org_id": org_id,
        "project_id": project_id,
    }
