"""Recall pipeline health end to end: ``memory`` events through the broker, the worker and
the sink into DuckDB, for several agents, under two arrival orders. Every value of the
tables and the ``pipeline_health`` and ``recall_by_query_source`` views is checked against
the independent reference (``tests.reference.pipeline_reference``), and the break, the
counter, the query-formulation gap (name and task probes) and the CLI on top."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from typing import Any

import pytest

from memdiag.contract import RECALL_PROBES, UNINDEXED_MEMORIES
from tests.compare import differences, from_duckdb, from_reference
from tests.integration.conftest import Pipeline
from tests.recall_scenario import paper_agents, probe
from tests.reference import pipeline_reference

pytestmark = pytest.mark.integration

PIPELINE_TABLES = ("memory_pipeline", "recall_probes", "pipeline_health", "recall_by_query_source",
                   "pipeline_break_spans", "recall_trend", "recall_by_day",
                   "recall_by_memory_count", "recall_change")  # fmt: skip


def expected(events: list[dict[str, Any]]) -> dict[str, Any]:
    snap = from_reference({**_empty_session_tables(), **pipeline_reference(events)})
    return {t: snap[t] for t in PIPELINE_TABLES}


def _empty_session_tables() -> dict[str, Any]:
    return {k: {} for k in ("searches", "retrieval_feedback", "session_diagnostics",
                            "observation_weight_history", "observation_weights",
                            "observation_strength", "observation_strength_history",
                            "graph_weights", "graph_weight_history")}  # fmt: skip


def got(p: Pipeline) -> dict[str, Any]:
    snap = from_duckdb(p.query)
    return {t: snap[t] for t in PIPELINE_TABLES}


def test_in_order_and_keyed(pipeline: Pipeline) -> None:
    events = sorted(paper_agents(), key=lambda e: e["ts"])
    bad = probe("c-bad", 3300, "c1", ["c1"], agent="clinical", source="title")  # neither one
    pipeline.start()
    pipeline.publish_events([*events, bad], keyed=True)
    pipeline.drain(timeout=120)
    assert differences(expected(events), got(pipeline)) == []
    [(reason, detail)] = pipeline.query("SELECT reason, detail FROM dead_letters")
    assert reason == "bad_value" and "query_source" in detail
    # the clinical agent's rules: all five found by their names, one by a presentation
    assert sorted(pipeline.query(
        "SELECT query_source, probed, hits, recall_rate FROM recall_by_query_source "
        "WHERE agent_id = 'clinical'")) == [("name", 5, 5, 1.0), ("task", 5, 1, 0.2)]  # fmt: skip
    assert pipeline.query(
        "SELECT semantic_recall_rate, probed, missed FROM pipeline_health WHERE agent_id = 'clinical'"
    ) == [(1.0, 5, 0)]  # its task probes' misses are not SRR's
    assert pipeline.query(
        "SELECT count(*) FROM recall_probes WHERE query_source = 'task' AND miss_reason IS NOT NULL"
    ) == [(0,)]
    health = {r[0]: r[1:] for r in pipeline.query(
        "SELECT agent_id, pipeline_coverage, semantic_recall_rate, broken FROM pipeline_health"
    )}  # fmt: skip
    # the paper's shapes, as computed by hand
    assert health["never"] == (0.0, None, True)
    assert health["stops"][0] == pytest.approx(5 / 11) and health["stops"][2] is True
    assert health["healthy"] == (pytest.approx(10 / 11), 1.0, False)
    assert health["repetitive"][1] == pytest.approx(0.3)
    breaks = pipeline.query(
        "SELECT agent_id, oldest_memory_id, recovered_at IS NULL FROM pipeline_breaks ORDER BY 1"
    )
    assert breaks == [("never", "n0", True), ("stops", "s5", True)]
    # the counter on the counter topic: every unindexed memory of the broken agents, once
    counted: dict[str, int] = {}
    probes: dict[tuple[str, str], int] = {}
    for _, rec in pipeline.consume(pipeline.settings.topics.counters):
        if rec.get("type") == "increment" and rec["name"] == UNINDEXED_MEMORIES:
            agent = rec["attributes"]["agent_id"]
            counted[agent] = counted.get(agent, 0) + rec["value"]
        elif rec.get("type") == "increment" and rec["name"] == RECALL_PROBES:
            key = (rec["attributes"]["agent_id"], rec["attributes"]["hit"])
            probes[key] = probes.get(key, 0) + rec["value"]
    assert counted == {"never": 10, "stops": 5}
    # every probe counts (contract section 9): the clinical agent's five name hits, and its
    # task probes: five misses, then c0's hit
    assert probes == {("healthy", "true"): 10, ("repetitive", "true"): 3,
                      ("repetitive", "false"): 7, ("clinical", "true"): 6,
                      ("clinical", "false"): 5}  # fmt: skip
    # the recall alert, per agent: only the repetitive agent's probes mostly miss
    alert = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "alert", "--rule", "recall_probe_miss > 0.5 for 1h",
         "--from-beginning", "--stop-after-idle", "3", "--json", "--quiet"],
        env={**pipeline.settings.as_env(), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert alert.returncode == 0, alert.stderr
    alerts = [json.loads(line) for line in alert.stdout.splitlines()]
    assert [(a["state"], a["group"]) for a in alerts] == [("firing", {"agent_id": "repetitive"})]
    assert alerts[0]["value"] == pytest.approx(0.7)
    # the command an analyst runs
    out = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "query", "pipeline-health", "--agent", "stops",
         "--json", "--db", pipeline.settings.duckdb_path],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (row,) = json.loads(out.stdout)
    assert (row["agent_id"], row["written"], row["indexed"], row["broken"]) == (
        "stops", 11, 5, True
    )  # fmt: skip
    assert (row["task_probed"], row["task_recall_rate"], row["query_formulation_gap"]) == (
        0, None, None)  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "query", "pipeline-health", "--agent", "clinical",
         "--json", "--db", pipeline.settings.duckdb_path],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    (row,) = json.loads(out.stdout)
    assert (row["semantic_recall_rate"], row["task_probed"], row["task_hits"]) == (1.0, 5, 1)
    assert row["task_recall_rate"] == 0.2 and row["query_formulation_gap"] == pytest.approx(0.8)
    trend = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "query", "recall-trend", "--by", "memory-count",
         "--agent", "repetitive", "--json", "--db", pipeline.settings.duckdb_path],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # its ten probes at ten memories (9-16), three hits; its one context at eleven
    assert [(r["memory_count_to"], r["probed"], r["hits"], r["ambient_contexts"])
            for r in json.loads(trend.stdout)] == [(16, 10, 3, 1)]  # fmt: skip
    trend = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "query", "recall-trend", "--by", "memory-count",
         "--agent", "clinical", "--json", "--db", pipeline.settings.duckdb_path],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # its five rules (5-8): all found by name, one by a task (c0's latest task probe)
    assert [(r["memory_count_to"], r["probed"], r["hits"], r["task_probed"], r["task_hits"])
            for r in json.loads(trend.stdout)] == [(8, 5, 5, 5, 1)]  # fmt: skip


def test_shuffled_unkeyed_and_batched(pipeline: Pipeline) -> None:
    """The same events in a random order, half unkeyed single events (re-routed to their
    agent's partition), half in batches keyed by something else, some redelivered: the same
    tables."""
    events = paper_agents()
    rnd = random.Random(7)
    shuffled = events[:]
    rnd.shuffle(shuffled)
    shuffled += rnd.sample(shuffled, 20)  # redeliveries
    half = len(shuffled) // 2
    pipeline.start()
    pipeline.publish_events(shuffled[:half], keyed=False)
    batches = [shuffled[i : i + 7] for i in range(half, len(shuffled), 7)]
    pipeline.publish(
        [(f"batch-{n}".encode(), b) for n, b in enumerate(batches)],
        topic=pipeline.settings.topics.memory,
    )
    pipeline.drain(timeout=120)
    assert differences(expected(events), got(pipeline)) == []
    assert pipeline.query("SELECT count(*) FROM dead_letters") == [(0,)]
