"""The tables in one comparable shape, from the reference, the in-memory world or DuckDB.

Only the contract's columns (and the ones a rule defines, like a feedback row's ``ts``):
wall-clock columns and dead letters are left out, as the event-time suite compares them
apart.
"""

from __future__ import annotations

from typing import Any

from memdiag.contract import FEEDBACK, FEEDBACK_RETRACTED
from memdiag.contract.envelope import MINUTE_US
from memdiag.schemas.decode import parse_ts
from tests.reference import (
    recall_by_memory_count_reference,
    recall_change_reference,
    recall_trend_reference,
)

Snapshot = dict[str, dict[Any, tuple[Any, ...]]]


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 9)


def from_reference(ref: dict[str, Any]) -> Snapshot:
    return {
        "searches": {
            eid: (
                r["session_id"],
                r["source"],
                r["result_count"],
                r["is_followup"],
                r["prev_event_id"],
                _r(r["gap_seconds"]),
                r["disjoint_new_query"],
            )
            for eid, r in ref["searches"].items()
        },
        "retrieval_feedback": {
            k: (
                r["signal"],
                _r(r["match_ratio"]),
                r["keyword_count"],
                r["matched_count"],
                r["ts"],
                r["similarity"],
                r["detector"],
            )  # fmt: skip
            for k, r in ref["retrieval_feedback"].items()
        },
        "session_diagnostics": {
            sid: (
                r["outcome"],
                r["event_id"],
                r["ts"],
                r["failure_category"],
                tuple(r["injected_observation_ids"]),
                tuple(r["injected_graph_entity_ids"]),
                tuple(r["injected_graph_edge_keys"]),
                tuple(r["ignored_observation_ids"]),
                r["search_count"],
                r["followup_count"],
                tuple(r["misleading_observation_ids"]),
            )
            for sid, r in ref["session_diagnostics"].items()
        },
        "observation_weight_history": {
            k: (
                r["outcome"],
                _r(r["alpha"]),
                _r(r["previous_weight"]),
                _r(r["new_weight"]),
                r["aggressive"],
            )
            for k, r in ref["observation_weight_history"].items()
        },
        "observation_weights": {k: (_r(w),) for k, w in ref["observation_weights"].items()},
        "observation_strength": {k: (_r(v),) for k, v in ref["observation_strength"].items()},
        "graph_weights": {k: (_r(w),) for k, w in ref["graph_weights"].items()},
        "graph_weight_history": {
            k: (
                r["outcome"],
                _r(r["alpha"]),
                _r(r["previous_weight"]),
                _r(r["new_weight"]),
                r["aggressive"],
            )  # fmt: skip
            for k, r in ref["graph_weight_history"].items()
        },
        "observation_strength_history": {
            k: (r["signal"], _r(r["alpha"]), _r(r["previous_strength"]), _r(r["strength"]))
            for k, r in ref["observation_strength_history"].items()
        },
        **(_pipeline_from_reference(ref) if "memory_pipeline" in ref else {}),
    }


def _pipeline_from_reference(ref: dict[str, Any]) -> Snapshot:
    return {
        "memory_pipeline": {
            k: (r["name"], r["written_at"], r["indexed_at"], r["status"])
            for k, r in ref["memory_pipeline"].items()
        },
        "recall_probes": {
            eid: (
                r["agent_id"],
                r["memory_id"],
                r["hit"],
                r["rank"],
                r["ts"],
                r["miss_reason"],
                r["query_source"],
            )
            for eid, r in ref["recall_probes"].items()
        },
        "recall_by_query_source": {
            k: (r["probed"], r["hits"], _r(r["recall_rate"]))
            for k, r in ref["recall_by_query_source"].items()
        },
        "pipeline_health": {
            agent: (
                h["written"],
                h["indexed"],
                h["pending"],
                h["unindexed"],
                _r(h["pipeline_coverage"]),
                _r(h["semantic_recall_rate"]),
                _r(h["ambient_trigger_rate"]),
                h["last_written_at"],
                h["last_indexed_at"],
                h["broken"],
                h["broken_since"],
                h["probed"],
                h["missed"],
                h["not_indexed_misses"],
                h["below_threshold_misses"],
                h["aliased_misses"],
                h["outranked_misses"],
                _r(h["aliasing_rate"]),
                h["unreachable"],
                _r(h["unreachable_share"]),
            )
            for agent, h in ref["pipeline_health"].items()
        },  # fmt: skip
        "pipeline_break_spans": {
            k: (r["until"], r["first_memory_id"], r["memories"])
            for k, r in ref["pipeline_break_spans"].items()
        },
        "recall_trend": {
            k: (r["written"], *_trend(r))
            for k, r in recall_trend_reference(ref, TREND_BUCKET_S * 1_000_000).items()
        },
        "recall_by_day": {
            k: (r["written"], *_trend(r))
            for k, r in recall_trend_reference(ref, 86_400_000_000).items()
        },
        "recall_by_memory_count": {
            k: (r["memory_count_to"], *_trend(r))
            for k, r in recall_by_memory_count_reference(ref).items()
        },
        "recall_change": {
            a: (r["window_end"], r["probed"], r["hits"], r["previous_probed"], r["previous_hits"])
            for a, r in recall_change_reference(ref, CHANGE_WINDOW_S * 1_000_000).items()
        },
    }


#: the bucket and window the snapshot reads recall_trend and recall_change with (seconds)
TREND_BUCKET_S = 300
CHANGE_WINDOW_S = 600


def _trend(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["probed"], r["hits"], _r(r["semantic_recall_rate"]), r["ambient_contexts"],
            _r(r["ambient_trigger_rate"]), r["task_probed"], r["task_hits"],
            _r(r["task_recall_rate"]))  # fmt: skip


def _edge(e: dict[str, str]) -> str:
    return f"{e['source_id']}|{e['target_id']}|{e['relationship']}"


def from_records(tables: Any) -> Snapshot:
    """From :class:`tests.inmemory.Tables` (the records as the worker sent them)."""
    return {
        "searches": {
            eid: (
                r["session_id"],
                r["source"],
                r["result_count"],
                r["is_followup"],
                r["prev_event_id"],
                _r(r["gap_seconds"]),
                r["disjoint_new_query"],
            )
            for eid, r in tables.searches.items()
        },
        "retrieval_feedback": {
            k: (
                r["signal"],
                _r(r["match_ratio"]),
                r["keyword_count"],
                r["matched_count"],
                parse_ts(r["ts"]),
                r["similarity"],
                r["detector"],
            )
            for k, r in tables.feedback.items()
        },
        "session_diagnostics": {
            sid: (
                r["outcome"],
                r["event_id"],
                parse_ts(r["ts"]),
                r["failure_category"],
                tuple(r["injected_observation_ids"]),
                tuple(r["injected_graph_entity_ids"]),
                tuple(_edge(e) for e in r["injected_graph_edge_keys"]),
                tuple(r["ignored_observation_ids"]),
                r["search_count"],
                r["followup_count"],
                tuple(r["misleading_observation_ids"]),
            )
            for sid, r in tables.sessions.items()
        },
        "observation_weight_history": {
            k: (
                r["outcome"],
                _r(r["alpha"]),
                _r(r["previous_weight"]),
                _r(r["weight"]),
                r["aggressive"],
            )
            for k, r in tables.history.items()
        },
        "observation_weights": {k: (_r(r["current_weight"]),) for k, r in tables.weights.items()},
        "observation_strength": {
            k: (_r(r["current_strength"]),) for k, r in tables.strengths.items()
        },
        "graph_weights": {k: (_r(r["current_weight"]),) for k, r in tables.graph.items()},
        "graph_weight_history": {
            k: (
                r["outcome"],
                _r(r["alpha"]),
                _r(r["previous_weight"]),
                _r(r["weight"]),
                r["aggressive"],
            )  # fmt: skip
            for k, r in tables.graph_history.items()
        },
        "observation_strength_history": {
            k: (r["signal"], _r(r["alpha"]), _r(r["previous_strength"]), _r(r["strength"]))
            for k, r in tables.strength_history.items()
        },
    }


def from_duckdb(query: Any) -> Snapshot:
    """From a memdiag DuckDB file; ``query(sql)`` returns rows."""

    def us(ts: Any) -> int:
        return int(ts.timestamp() * 1_000_000) if ts is not None else None  # type: ignore[return-value]

    return {
        "searches": {
            r[0]: (r[1], r[2], r[3], r[4], r[5], _r(r[6]), r[7])
            for r in query(
                "SELECT event_id, session_id, source, result_count, is_followup, prev_event_id, "
                "gap_seconds, disjoint_new_query FROM searches"
            )
        },
        "retrieval_feedback": {
            (r[0], r[1], r[2]): (r[3], _r(r[4]), r[5], r[6], r[7], r[8], r[9])
            for r in query(
                "SELECT session_id, turn_id, observation_id, signal, match_ratio, keyword_count, "
                "matched_count, epoch_us(ts), similarity, detector FROM retrieval_feedback"
            )
        },
        "session_diagnostics": {
            r[0]: (
                r[1],
                r[2],
                r[3],
                r[4],
                tuple(r[5]),
                tuple(r[6]),
                tuple(r[7]),
                tuple(r[8]),
                r[9],
                r[10],
                tuple(r[11]),
            )
            for r in query(
                "SELECT session_id, outcome, event_id, epoch_us(ts), failure_category, "
                "injected_observation_ids, injected_graph_entity_ids, injected_graph_edge_keys, "
                "ignored_observation_ids, search_count, followup_count, "
                "misleading_observation_ids FROM session_diagnostics"
            )
        },
        "observation_weight_history": {
            (r[0], r[1]): (r[2], _r(r[3]), _r(r[4]), _r(r[5]), r[6])
            for r in query(
                "SELECT observation_id, session_id, outcome, alpha, previous_weight, new_weight, "
                "aggressive FROM observation_weight_history"
            )
        },
        "observation_weights": {
            r[0]: (_r(r[1]),)
            for r in query("SELECT observation_id, weight FROM observation_weights")
        },
        "observation_strength": {
            r[0]: (_r(r[1]),)
            for r in query("SELECT observation_id, strength FROM observation_strength")
        },
        "graph_weights": {r[0]: (_r(r[1]),) for r in query("SELECT id, weight FROM graph_weights")},
        "graph_weight_history": {
            (r[0], r[1]): (r[2], _r(r[3]), _r(r[4]), _r(r[5]), r[6])
            for r in query(
                "SELECT id, session_id, outcome, alpha, previous_weight, new_weight, aggressive "
                "FROM graph_weight_history"
            )
        },
        "observation_strength_history": {
            (r[0], r[1], r[2]): (r[3], _r(r[4]), _r(r[5]), _r(r[6]))
            for r in query(
                "SELECT observation_id, session_id, turn_id, signal, alpha, previous_strength, "
                "strength FROM observation_strength_history"
            )
        },
        "memory_pipeline": {
            (r[0], r[1]): (r[2], r[3], r[4], r[5])
            for r in query(
                "SELECT agent_id, memory_id, name, epoch_us(written_at), epoch_us(indexed_at), "
                "status FROM memory_pipeline"
            )
        },
        "recall_probes": {
            r[0]: tuple(r[1:])
            for r in query(
                "SELECT event_id, agent_id, memory_id, hit, rank, epoch_us(ts), miss_reason, "
                "query_source FROM recall_probes"
            )
        },
        "recall_by_query_source": {
            (r[0], r[1]): (r[2], r[3], _r(r[4]))
            for r in query(
                "SELECT agent_id, query_source, probed, hits, recall_rate "
                "FROM recall_by_query_source"
            )
        },
        "pipeline_health": {
            r[0]: (*r[1:5], _r(r[5]), _r(r[6]), _r(r[7]), *r[8:18], _r(r[18]), r[19], _r(r[20]))
            for r in query(
                "SELECT agent_id, written, indexed, pending, unindexed, pipeline_coverage, "
                "semantic_recall_rate, ambient_trigger_rate, epoch_us(last_written_at), "
                "epoch_us(last_indexed_at), broken, epoch_us(broken_since), probed, missed, "
                "not_indexed_misses, below_threshold_misses, aliased_misses, outranked_misses, "
                "aliasing_rate, unreachable, unreachable_share FROM pipeline_health"
            )
        },
        "pipeline_break_spans": {
            (r[0], r[1]): tuple(r[2:])
            for r in query(
                "SELECT agent_id, epoch_us(since), epoch_us(until), first_memory_id, memories "
                "FROM pipeline_break_spans"
            )
        },
        "recall_trend": _trend_rows(
            query,
            "epoch_us(bucket_start), written",
            f"recall_trend(bucket_seconds := {TREND_BUCKET_S})",
        ),
        "recall_by_day": _trend_rows(
            query, "epoch_us(CAST(day AS TIMESTAMP)), written", "recall_by_day"
        ),
        "recall_by_memory_count": _trend_rows(
            query, "memory_count_from, memory_count_to", "recall_by_memory_count"
        ),
        "recall_change": {
            r[0]: tuple(r[1:])
            for r in query(
                "SELECT agent_id, epoch_us(window_end), probed, hits, previous_probed, "
                f"previous_hits FROM recall_change(window_seconds := {CHANGE_WINDOW_S})"
            )
        },
    }


def _trend_rows(query: Any, key_and_first: str, source: str) -> dict[Any, tuple[Any, ...]]:
    """A trend view's rows: (agent, its bucket key) -> its first column and the figures."""
    return {
        (r[0], r[1]): (r[2], r[3], r[4], _r(r[5]), r[6], _r(r[7]), r[8], r[9], _r(r[10]))
        for r in query(
            f"SELECT agent_id, {key_and_first}, probed, hits, semantic_recall_rate, "
            f"ambient_contexts, ambient_trigger_rate, task_probed, task_hits, task_recall_rate "
            f"FROM {source}"
        )
    }


def differences(a: Snapshot, b: Snapshot, limit: int = 5) -> list[str]:
    """Human-readable differences, a few per table (empty when equal)."""
    out: list[str] = []
    for table in a:
        left, right = a[table], b.get(table, {})
        diff = [k for k in left.keys() | right.keys() if left.get(k) != right.get(k)]
        if diff:
            out.append(f"{table}: {len(diff)} rows differ")
            for k in sorted(diff, key=repr)[:limit]:
                out.append(f"  {k!r}: {left.get(k)!r} != {right.get(k)!r}")
    return out


def net_feedback(by_minute: Any) -> dict[tuple[str, int], int]:
    """The verdicts that stand by (signal, minute of event time), from the counters:
    ``retrieval_feedback_total`` less ``retrieval_feedback_retracted_total``. ``by_minute``
    maps ((counter, attributes), minute in µs) to its increments."""
    net: dict[tuple[str, int], int] = {}
    for ((name, attrs), minute), n in by_minute.items():
        sign = {FEEDBACK: 1, FEEDBACK_RETRACTED: -1}.get(name)
        if sign is None:
            continue
        key = (dict(attrs)["signal"], minute)
        net[key] = net.get(key, 0) + sign * n
    return {k: v for k, v in net.items() if v}


def feedback_by_minute(snapshot: Snapshot) -> dict[tuple[str, int], int]:
    """The ``retrieval_feedback`` rows of a snapshot by (signal, minute of their ``ts``)."""
    out: dict[tuple[str, int], int] = {}
    for signal, _, _, _, ts_us, *_ in snapshot["retrieval_feedback"].values():
        key = (signal, ts_us - ts_us % MINUTE_US)
        out[key] = out.get(key, 0) + 1
    return out
