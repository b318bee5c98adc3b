"""An independent, in-order reference of what memdiag computes (docs/rules.md).

A plain loop over each session's events sorted by ``ts``, then ``event_id`` (byte order: the
contract's tie-break, never the arrival order): no state store, no partitions, no
corrections. It shares no code with ``streams`` beyond the text rule's definition, written
out again here. Tests compare every way of feeding the worker against it; without it, every
mode could be wrong in the same way.

Choices the contract leaves open are the product's, documented in docs/rules.md: a turn's
response is its first in event time and every injection of the turn is judged against it;
an observation keeps the content of its first injection; a feedback row's ``ts`` is the later
of the two halves; sessions with equal outcome ``ts`` are ordered by ``session_id``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

MEMORY_KINDS = ("memory_written", "memory_indexed", "recall_probe", "ambient_context")
WINDOW_S = 30.0
RETENTION_S = 24 * 3600.0
ALPHA_SUCCESS, ALPHA_FAILURE = 0.1, 0.2
ALPHA_USED, ALPHA_IGNORED = 0.2, 0.05
RUNNERS = set(
    "jest vitest pytest go_test mocha jasmine karma ava cargo_test rspec minitest phpunit "
    "junit unittest nose2 playwright_test cypress".split()
)
LINTERS = set(
    "eslint prettier biome stylelint ruff flake8 pylint black isort autopep8 yapf rubocop "
    "golangci_lint gofmt rustfmt clippy ktlint swiftlint shellcheck hadolint markdownlint".split()
)


def parse(ts: str) -> int:
    """Microseconds since the epoch, exactly."""
    d = datetime.fromisoformat(ts.replace("Z", "+00:00")) - datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def words(text: str) -> list[str]:
    out = []
    for w in text.lower().split():
        w = "".join(c for c in w if c.isalnum())
        if w:
            out.append(w)
    return out


def category(outcome: dict[str, Any]) -> str:
    failed = [
        call["tool"].lower().replace("-", "_").replace(" ", "_")
        for call in outcome["tool_calls"]
        if not call["success"]
    ]
    if any(name in RUNNERS for name in failed):
        return "test_failure"
    messages = [e["message"] for e in outcome["errors"]]
    if any(re.search("lint|format|prettier|eslint", m, re.I) for m in messages):
        return "style"
    if any(name in LINTERS for name in failed):
        return "style"
    if any(re.search("regression|broke|previously", m, re.I) for m in messages):
        return "regression"
    if "files_modified" in outcome and not outcome["files_modified"]:
        return "incomplete"
    return "wrong_approach" if messages else "other"


def reference(
    events: list[dict[str, Any]],
    window_s: float = WINDOW_S,
    retention_s: float = RETENTION_S,
    similar: Callable[[str, str], float] | None = None,
    threshold: float = 1.0,
) -> dict[str, Any]:
    """The tables, as ``{table: {key: row}}``, for valid session events (any order).
    ``similar(memory, response)``: MEMDIAG_DETECTOR=semantic's similarity of two texts
    (the model is the oracle here; the join and the rule are this module's own)."""
    unique: dict[str, tuple[int, dict[str, Any]]] = {}
    for i, e in enumerate(events):
        if e["kind"] in MEMORY_KINDS:
            continue  # the recall pipeline's: pipeline_reference
        unique.setdefault(e["event_id"], (i, e))  # the first copy of an event id counts
    window, retention = round(window_s * 1e6), round(retention_s * 1e6)
    by_session: dict[str, list[tuple[int, bytes, dict[str, Any]]]] = {}
    for _, e in unique.values():
        by_session.setdefault(e["session_id"], []).append(
            (parse(e["ts"]), e["event_id"].encode(), e)
        )

    searches: dict[str, dict[str, Any]] = {}
    feedback: dict[tuple[str, str, str], dict[str, Any]] = {}
    sessions: dict[str, dict[str, Any]] = {}
    for sid, evs in by_session.items():
        evs.sort(key=lambda t: (t[0], t[1]))
        prev = None
        agent_searches = followups = 0
        turns: dict[str, dict[str, Any]] = {}
        first_seen: dict[str, None] = {}
        entities: dict[str, None] = {}
        edges: dict[str, None] = {}
        outcome = None
        for ts, eid, e in evs:
            kind = e["kind"]
            if kind == "search":
                source = e.get("source", "agent")
                row = {
                    "is_followup": False,
                    "prev_event_id": None,
                    "gap_seconds": None,
                    "disjoint_new_query": False,
                }
                if source == "agent":
                    agent_searches += 1
                if source == "agent" and e["result_ids"]:
                    if prev is not None and ts - prev[0] <= retention:
                        gap = ts - prev[0]
                        disjoint_new = (
                            e["query"].strip().lower() != prev[1]
                            and not set(e["result_ids"]) & prev[2]
                        )
                        follow = disjoint_new and gap <= window
                        row = {
                            "is_followup": follow,
                            "prev_event_id": prev[3],
                            "gap_seconds": gap / 1_000_000,
                            "disjoint_new_query": disjoint_new,
                        }
                        followups += follow
                    prev = (ts, e["query"].strip().lower(), set(e["result_ids"]), e["event_id"])
                searches[e["event_id"]] = {
                    "session_id": sid,
                    "source": source,
                    "result_count": len(e["result_ids"]),
                    **row,
                }
            elif kind == "injection":
                turn = turns.setdefault(e["turn_id"], {"response": None, "obs": {}})
                for o in e["observations"]:
                    turn["obs"].setdefault(o["id"], (ts, eid, o["content"]))
                    first_seen.setdefault(o["id"])
                for x in e.get("graph_entity_ids") or []:
                    entities.setdefault(x)
                for g in e.get("graph_edge_keys") or []:
                    source = g.get("source_id", g.get("sourceId"))
                    target = g.get("target_id", g.get("targetId"))
                    rel = g.get(
                        "relationship", g.get("relationshipName", g.get("relationship_name"))
                    )
                    edges.setdefault(f"{source}|{target}|{rel}")
            elif kind == "response":
                turn = turns.setdefault(e["turn_id"], {"response": None, "obs": {}})
                if turn["response"] is None:
                    turn["response"] = (ts, eid, e["text"])
            else:
                outcome = e  # the last in event time stands
        used_in: dict[str, list[bool]] = {}
        for turn_id, turn in turns.items():
            if turn["response"] is None:
                continue
            r_ts, r_eid, text = turn["response"]
            r_words = set(words(text))
            for obs_id, (i_ts, i_eid, content) in turn["obs"].items():
                kws = {w for w in words(content) if len(w) > 4}
                matched = len(kws & r_words)
                ratio = matched / len(kws) if kws else 0.0
                used = bool(kws) and ratio > 0.30
                sim = None if similar is None else similar(content, text)
                used = used or (sim is not None and sim >= threshold)
                feedback[(sid, turn_id, obs_id)] = {
                    "signal": "used" if used else "ignored",
                    "match_ratio": ratio,
                    "keyword_count": len(kws),
                    "matched_count": matched,
                    "similarity": sim,
                    "detector": "keyword" if sim is None else "semantic",
                    "ts": max(r_ts, i_ts),
                    # the turn's place among the observation's verdicts: the later half
                    "tie": max((r_ts, r_eid), (i_ts, i_eid))[1].decode(),
                }
                used_in.setdefault(obs_id, []).append(used)
        if outcome is None:
            continue
        failed = outcome["outcome"] != "accepted"
        sessions[sid] = {
            "outcome": outcome["outcome"],
            "event_id": outcome["event_id"],
            "ts": parse(outcome["ts"]),
            "failure_category": category(outcome) if failed else None,
            "injected_observation_ids": list(first_seen),
            "injected_graph_entity_ids": list(entities),
            "injected_graph_edge_keys": list(edges),
            "ignored_observation_ids": [
                o for o in first_seen if o in used_in and not any(used_in[o])
            ],
            "search_count": agent_searches,
            "followup_count": followups,
            "misleading_observation_ids": [],
        }

    # observations (and graph entities and edges): sessions in outcome order, one step each
    per_obs: dict[str, list[tuple[int, str]]] = {}
    per_graph: dict[str, list[tuple[int, str]]] = {}
    for sid, s in sessions.items():
        for obs_id in s["injected_observation_ids"]:
            per_obs.setdefault(obs_id, []).append((s["ts"], sid))
        for entity in s["injected_graph_entity_ids"]:
            per_graph.setdefault(f"entity:{entity}", []).append((s["ts"], sid))
        for edge in s["injected_graph_edge_keys"]:
            per_graph.setdefault(f"edge:{edge}", []).append((s["ts"], sid))
    history, weights, misleading_after = _ledgers(per_obs, sessions)
    graph_history, graph_weights, _ = _ledgers(per_graph, sessions)
    for sid, s in sessions.items():
        if s["outcome"] != "accepted":
            s["misleading_observation_ids"] = [
                o for o in s["injected_observation_ids"] if misleading_after[(o, sid)]
            ]
    # strength: every standing verdict of an observation, in turn order, one step each
    verdicts: dict[str, list[tuple[int, str, str, str, bool]]] = {}
    for (sid, turn_id, obs_id), row in feedback.items():
        verdicts.setdefault(obs_id, []).append(
            (row["ts"], row["tie"], sid, turn_id, row["signal"] == "used")
        )
    strength_history: dict[tuple[str, str, str], dict[str, Any]] = {}
    strengths: dict[str, float] = {}
    for obs_id, order in verdicts.items():
        order.sort(key=lambda v: (v[0], v[1].encode(), v[2].encode(), v[3].encode()))
        st = 1.0
        for _, _, sid, turn_id, used in order:
            alpha = ALPHA_USED if used else ALPHA_IGNORED
            new = st + alpha * ((1.0 if used else 0.0) - st)
            strength_history[(obs_id, sid, turn_id)] = {
                "signal": "used" if used else "ignored",
                "alpha": alpha,
                "previous_strength": st,
                "strength": new,
            }
            st = new
        strengths[obs_id] = st
    tables = {
        "searches": searches,
        "retrieval_feedback": feedback,
        "session_diagnostics": sessions,
        "observation_weights": weights,
        "observation_weight_history": history,
        "observation_strength": strengths,
        "graph_weights": graph_weights,
        "graph_weight_history": graph_history,
        "observation_strength_history": strength_history,
    }
    if any(e["kind"] in MEMORY_KINDS for e in events):
        tables.update(pipeline_reference(events))
    return tables


MISS_REASONS = ("not_indexed", "below_threshold", "aliased", "outranked")


def _name_key(name: str | None) -> str:
    """Lowercased, letters only (contract section 9); the final sigma as sigma."""
    return "".join(c for c in (name or "").lower() if c.isalpha()).replace("ς", "σ")


def _name_tokens(name: str | None) -> set[str]:
    """The lowercased maximal runs of letters or of decimal digits (contract section 9), one
    character at a time by ``str.isalpha`` / ``str.isdecimal``. Lowercased as the key is:
    what lowercasing adds that is neither (the dot of ``İ``) dropped, the final sigma as sigma."""
    runs: list[str] = []
    kind = None
    for c in name or "":
        k = "letter" if c.isalpha() else "digit" if c.isdecimal() else None
        if k is not None and k == kind:
            runs[-1] += c
        elif k is not None:
            runs.append(c)
        kind = k
    return {
        "".join(c for c in run.lower() if c.isalpha() or c.isdecimal()).replace("ς", "σ")
        for run in runs
    }


def _look_alike(a: str | None, b: str | None) -> bool:
    """Same non-empty name key, or token sets overlapping by half or more (as fractions)."""
    key = _name_key(a)
    if key and key == _name_key(b):
        return True
    ta, tb = _name_tokens(a), _name_tokens(b)
    return bool(ta) and Fraction(len(ta & tb), len(ta | tb)) >= Fraction(1, 2)


def _miss_reason(
    probe: dict[str, Any],
    written: dict[str, tuple[int, str | None]],
    indexed: dict[str, int],
) -> str | None:
    """The first that holds: not_indexed, below_threshold, aliased, outranked; None: a hit,
    or a task probe (the reasons are the name probes')."""
    if probe["hit"] or probe.get("query_source", "name") != "name":
        return None
    mid = probe["memory_id"]
    if mid not in indexed or indexed[mid] > probe["ts"]:
        return "not_indexed"
    if probe["in_top"]:
        return "below_threshold"
    name = written.get(mid, (0, None))[1]
    if any(
        other != mid and other in written and _look_alike(name, written[other][1])
        for other in probe["top"]
    ):
        return "aliased"
    return "outranked"


def pipeline_reference(events: list[dict[str, Any]], deadline_s: float = 600.0) -> dict[str, Any]:
    """The recall pipeline's tables and view (docs/rules.md, "Recall pipeline health"), as
    ``{table: {key: row}}``, from the valid memory events among ``events`` (any order): a
    loop over each agent's events sorted by (ts, event_id), written from the rules alone.
    Times are µs since the epoch; rates are floats or None."""
    deadline_ms = round(deadline_s * 1000)
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("kind") in MEMORY_KINDS:
            by_agent.setdefault(e["agent_id"], []).append(e)
    memories: dict[tuple[str, str], dict[str, Any]] = {}
    probes: dict[str, dict[str, Any]] = {}
    health: dict[str, dict[str, Any]] = {}
    by_source: dict[tuple[str, str], dict[str, Any]] = {}  # recall_by_query_source
    spans: dict[tuple[str, int], dict[str, Any]] = {}
    points: list[dict[str, Any]] = []  # every probe and ambient context, for the trends
    clocks: dict[str, int] = {}
    for agent, evs in by_agent.items():
        evs = sorted(evs, key=lambda e: (parse(e["ts"]), e["event_id"]))
        clock = parse(evs[-1]["ts"])
        written: dict[str, tuple[int, str | None]] = {}
        indexed: dict[str, int] = {}
        index_times: list[int] = []
        latest_probe: dict[str, bool] = {}  # of the name probes: SRR's
        latest_probe_id: dict[str, str] = {}
        latest_of: dict[str, dict[str, bool]] = {}  # source -> memory -> its latest's hit
        ambient: list[str] | None = None
        clocks[agent] = clock
        for e in evs:
            t, mid = parse(e["ts"]), e.get("memory_id")
            if e["kind"] == "memory_written" and mid not in written:
                written[mid] = (t, e.get("name"))
            elif e["kind"] == "memory_indexed":
                indexed.setdefault(mid, t)
                index_times.append(t)
            elif e["kind"] == "recall_probe":
                ids, scores = e["result_ids"], e.get("scores")
                k, threshold = e.get("k", 3), e.get("threshold", 0.35)
                rank = ids.index(mid) + 1 if mid in ids else None
                hit = (
                    rank is not None
                    and rank <= k
                    and (scores is None or scores[rank - 1] >= threshold)
                )
                source = e.get("query_source", "name")
                probes[e["event_id"]] = {"agent_id": agent, "memory_id": mid, "hit": hit,
                                         "rank": rank, "ts": t, "top": ids[:k],
                                         "in_top": rank is not None and rank <= k,
                                         "query_source": source}  # fmt: skip
                latest_of.setdefault(source, {})[mid] = hit  # sorted: the last is the latest
                if source == "name":  # SRR and the miss reasons: name probes only
                    latest_probe[mid] = hit
                    latest_probe_id[mid] = e["event_id"]
            elif e["kind"] == "ambient_context":
                ambient = e["memory_ids"]
        for e in evs:  # the trends' points: each against every write of the agent by its ts
            t = parse(e["ts"])
            by_then = {mid for mid, (w, _) in written.items() if w <= t}
            if e["kind"] == "recall_probe":
                points.append({"kind": "probe", "agent_id": agent, "ts": t,
                               "event_id": e["event_id"], "memory_id": e["memory_id"],
                               "hit": probes[e["event_id"]]["hit"], "memory_count": len(by_then),
                               "query_source": e.get("query_source", "name")})  # fmt: skip
            elif e["kind"] == "ambient_context":
                named = len(set(e["memory_ids"]) & by_then)
                points.append({"kind": "ambient", "agent_id": agent, "ts": t,
                               "event_id": e["event_id"], "memory_ids": e["memory_ids"],
                               "memory_count": len(by_then),
                               "atr": named / len(by_then) if by_then else None})  # fmt: skip
        unindexed_since: list[int] = []
        for mid in written.keys() | indexed.keys():
            w = written.get(mid, (None, None))[0]
            i = indexed.get(mid)
            if w is None:
                status = "not_written"
            elif i is not None:
                status = "indexed"
            elif clock // 1000 - w // 1000 > deadline_ms:
                status = "unindexed"
                unindexed_since.append(w)
            else:
                status = "pending"
            memories[(agent, mid)] = {"name": written.get(mid, (None, None))[1],
                                      "written_at": w, "indexed_at": i, "status": status}  # fmt: skip
        for probe in probes.values():  # why each probe missed, from every event of the agent
            if probe["agent_id"] == agent:
                probe["miss_reason"] = _miss_reason(probe, written, indexed)
        for source, latest in latest_of.items():  # each memory once per source, by its latest
            hits = sum(latest.values())
            by_source[(agent, source)] = {"probed": len(latest), "hits": hits,
                                          "recall_rate": hits / len(latest)}  # fmt: skip
        # when the pipeline was down, in hindsight: from a write that no (first) index of any
        # memory followed within the deadline, to the next one; spans sharing it are one
        firsts = sorted(indexed.values())
        down: dict[int | None, list[tuple[int, str]]] = {}
        for mid, (w, _) in written.items():
            until = next((t for t in firsts if t >= w), None)
            own = indexed.get(mid)  # its own index, stamped before its write: ends it there
            if own is not None and own < w:
                until = w
            if (clock if until is None else until) // 1000 - w // 1000 > deadline_ms:
                down.setdefault(until, []).append((w, mid))
        for until, ms_ in down.items():
            w0, first = min(ms_)
            spans[(agent, w0)] = {"until": until, "first_memory_id": first, "memories": len(ms_)}
        n_written = len(written)
        n_indexed = sum(1 for mid in written if mid in indexed)
        oldest = min(unindexed_since, default=None)
        broken = oldest is not None and not any(t >= oldest for t in index_times)
        in_ambient = len(set(ambient or ()) & written.keys())
        reasons = [probes[eid]["miss_reason"] for eid in latest_probe_id.values()]
        split = {r: reasons.count(r) for r in MISS_REASONS}
        unreachable = [
            mid for mid in written
            if memories[(agent, mid)]["status"] == "unindexed" and mid not in (ambient or ())
        ]  # fmt: skip
        health[agent] = {
            "written": n_written,
            "indexed": n_indexed,
            "pending": sum(
                1 for (a, _), r in memories.items() if a == agent and r["status"] == "pending"
            ),
            "unindexed": len(unindexed_since),
            "pipeline_coverage": n_indexed / n_written if n_written else None,
            "semantic_recall_rate": (
                sum(latest_probe.values()) / len(latest_probe) if latest_probe else None
            ),
            "ambient_trigger_rate": (
                in_ambient / n_written if n_written and ambient is not None else None
            ),
            "last_written_at": max((w for w, _ in written.values()), default=None),
            "last_indexed_at": max(index_times, default=None),
            "broken": broken,
            "broken_since": oldest if broken else None,
            "probed": len(latest_probe),
            "missed": len(latest_probe) - sum(latest_probe.values()),
            **{f"{r}_misses": n for r, n in split.items()},
            "aliasing_rate": split["aliased"] / len(latest_probe) if latest_probe else None,
            "unreachable": len(unreachable),
            "unreachable_share": len(unreachable) / n_written if n_written else None,
        }
    return {"memory_pipeline": memories, "recall_probes": probes, "pipeline_health": health,
            "recall_by_query_source": by_source,
            "pipeline_break_spans": spans, "trend_points": points, "clocks": clocks,
            "writes": {k: r["written_at"] for k, r in memories.items()
                       if r["written_at"] is not None}}  # fmt: skip


def memory_count_bucket(n: int) -> tuple[int, int]:
    """(from, to) of the power-of-two bucket of a memory count: 0, 1, 2, 3-4, 5-8, ..."""
    if n <= 1:
        return n, n
    to = 1
    while to < n:
        to *= 2
    return to // 2 + 1, to


def _latest_hits(points: list[dict[str, Any]], source: str) -> tuple[int, int]:
    """(probed, hits) of each memory's latest probe (ts, then event_id) of ``source``."""
    latest: dict[str, tuple[int, str, bool]] = {}
    for p in points:
        if p["kind"] == "probe" and p["query_source"] == source:
            key = (p["ts"], p["event_id"], p["hit"])
            if p["memory_id"] not in latest or key > latest[p["memory_id"]]:
                latest[p["memory_id"]] = key
    return len(latest), sum(1 for _, _, hit in latest.values() if hit)


def _aggregate(points: list[dict[str, Any]]) -> dict[str, Any]:
    """SRR of each memory's latest name probe among ``points``, the task recall of its latest
    task probe; ATR the mean of their ambient contexts' (those with a rate)."""
    probed, hits = _latest_hits(points, "name")
    task_probed, task_hits = _latest_hits(points, "task")
    rates = [p["atr"] for p in points if p["kind"] == "ambient" and p["atr"] is not None]
    return {
        "probed": probed,
        "hits": hits,
        "semantic_recall_rate": hits / probed if probed else None,
        "ambient_contexts": sum(1 for p in points if p["kind"] == "ambient"),
        "ambient_trigger_rate": sum(rates) / len(rates) if rates else None,
        "task_probed": task_probed,
        "task_hits": task_hits,
        "task_recall_rate": task_hits / task_probed if task_probed else None,
    }


def recall_trend_reference(ref: dict[str, Any], bucket_us: int) -> dict[tuple[str, int], Any]:
    """``recall_trend(bucket_seconds)``: (agent, bucket start µs) -> the bucket's figures and
    the agent's memory count at its end."""
    origin = 4 * 86_400_000_000  # Monday 1970-01-05, µs: weeks start on Monday
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for p in ref["trend_points"]:
        start = origin + (p["ts"] - origin) // bucket_us * bucket_us
        groups.setdefault((p["agent_id"], start), []).append(p)
    out = {}
    for (agent, start), pts in groups.items():
        written = sum(1 for (a, _), w in ref["writes"].items()
                      if a == agent and w < start + bucket_us)  # fmt: skip
        out[(agent, start)] = {"written": written, **_aggregate(pts)}
    return out


def recall_by_memory_count_reference(ref: dict[str, Any]) -> dict[tuple[str, int], Any]:
    """``recall_by_memory_count``: (agent, bucket's lower end) -> its upper end and figures."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for p in ref["trend_points"]:
        groups.setdefault((p["agent_id"], *memory_count_bucket(p["memory_count"])), []).append(p)
    return {(a, lo): {"memory_count_to": hi, **_aggregate(pts)}
            for (a, lo, hi), pts in groups.items()}  # fmt: skip


def recall_change_reference(ref: dict[str, Any], window_us: int) -> dict[str, Any]:
    """``recall_change(window_seconds)``: per agent with name probes, SRR in the window up to
    its clock and in the window before it."""
    out = {}
    named = [p for p in ref["trend_points"] if p["kind"] == "probe" and p["query_source"] == "name"]
    for agent in {p["agent_id"] for p in named}:
        end = ref["clocks"][agent]
        probes = [p for p in named if p["agent_id"] == agent]
        now = _aggregate([p for p in probes if end - window_us < p["ts"] <= end])
        before = _aggregate([p for p in probes if end - 2 * window_us < p["ts"] <= end - window_us])
        out[agent] = {"window_end": end, "probed": now["probed"], "hits": now["hits"],
                      "previous_probed": before["probed"], "previous_hits": before["hits"]}  # fmt: skip
    return out


def session_pipeline_reference(
    sessions: list[dict[str, Any]], spans: dict[tuple[str, int], dict[str, Any]],
    agents: set[str],
) -> dict[str, tuple[str, int | None]]:  # fmt: skip
    """Each session's pipeline_state and the since of the span it fell in, from
    ``sessions`` (``session_id``, ``agent_id``, ``ts`` in µs) and the spans above; ``agents``
    are those with memory events."""
    out: dict[str, tuple[str, int | None]] = {}
    for s in sessions:
        agent, t = s.get("agent_id"), s["ts"]
        if agent is None:
            out[s["session_id"]] = ("no_agent_id", None)
        elif agent not in agents:
            out[s["session_id"]] = ("no_memory_events", None)
        else:
            hit = [since for (a, since), sp in spans.items() if a == agent and since <= t
                   and (sp["until"] is None or t < sp["until"])]  # fmt: skip
            out[s["session_id"]] = ("broken", hit[0]) if hit else ("healthy", None)
    return out


def _ledgers(
    per_key: dict[str, list[tuple[int, str]]], sessions: dict[str, dict[str, Any]]
) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, float], dict[tuple[str, str], bool]]:
    """Each key's steps: its sessions in outcome order (ties by session id), the weight EMA
    doubled once misleading (>= 3 failed, none accepted)."""
    history: dict[tuple[str, str], dict[str, Any]] = {}
    weights: dict[str, float] = {}
    misleading_after: dict[tuple[str, str], bool] = {}
    for obs_id, order in per_key.items():
        order.sort()
        failed_n = accepted_n = 0
        w = 1.0
        for _, sid in order:
            accepted = sessions[sid]["outcome"] == "accepted"
            if accepted:
                accepted_n += 1
            else:
                failed_n += 1
            misleading = failed_n >= 3 and accepted_n == 0
            if accepted:
                alpha, target = ALPHA_SUCCESS, 1.0
            else:
                alpha, target = (min(1.0, 2 * ALPHA_FAILURE) if misleading else ALPHA_FAILURE), 0.0
            new = w + alpha * (target - w)
            history[(obs_id, sid)] = {
                "outcome": sessions[sid]["outcome"],
                "alpha": alpha,
                "previous_weight": w,
                "new_weight": new,
                "aggressive": (not accepted) and misleading,
            }
            misleading_after[(obs_id, sid)] = misleading
            w = new
        weights[obs_id] = w
    return history, weights, misleading_after
