"""OpenTelemetry spans end to end: the bytes the Collector's Kafka exporter writes (the OTLP
exporter's own encoder), through the broker, the worker and the sink into DuckDB, give the
rows that the equivalent hand-written section-2 events give through ``memdiag run``: for
conversations split across records and traces, as otlp_proto and otlp_json, keyed by trace
or not, in shuffled orders, part of them late. And broken records become dead letters."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from memdiag.contract import UNJUDGED_TURNS
from tests.compare import differences, from_duckdb
from tests.integration.conftest import Pipeline
from tests.otel_scenario import conversations, records
from tests.unit.test_otlp import Agent

pytestmark = pytest.mark.integration

#: three copies of one kind of traffic, each arriving its own way
VARIANTS = (
    # (sessions, encoding, keyed by trace id, spans a record at most)
    ("a", "otlp_proto", False, 3),
    ("b", "otlp_proto", True, 20),
    ("c", "otlp_json", False, 1),
)


def memdiag_run(events: list[dict[str, Any]], workdir: Path) -> Path:
    """The hand-written events through ``memdiag run`` (its own embedded broker)."""
    path = workdir / "events.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    db = workdir / "by-events.duckdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    done = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "run", "--input", str(path), "--db", str(db)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return db


def test_spans_give_the_rows_of_the_equivalent_events(pipeline: Pipeline, tmp_path: Path) -> None:
    rng = random.Random(14)
    events: list[dict[str, Any]] = []
    messages: list[tuple[str | None, bytes]] = []
    for prefix, encoding, by_trace, most in VARIANTS:
        # every outcome knows its files: a published outcome must have files_modified
        spans, evs = conversations(8, seed=14, prefix=f"conv-{prefix}", files_known=True)
        events += evs
        messages += records(spans, rng, encoding, by_trace=by_trace, max_spans=most)
    rng.shuffle(messages)
    late = messages[: len(messages) // 5]  # a catch-up: these come after the rest is done
    pipeline.start()
    pipeline.publish([(k.encode() if k else None, raw) for k, raw in messages[len(late) :]],
                     topic=pipeline.settings.topics.otlp_spans)  # fmt: skip
    pipeline.drain(timeout=180)
    pipeline.publish([(k.encode() if k else None, raw) for k, raw in late],
                     topic=pipeline.settings.topics.otlp_spans)  # fmt: skip
    pipeline.drain(timeout=180)

    by_events = memdiag_run(events, tmp_path)
    con = duckdb.connect(str(by_events), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM dead_letters").fetchall() == [(0,)]
        expected = from_duckdb(lambda q: con.execute(q).fetchall())
        tool_summaries = con.execute(
            "SELECT session_id, tool_call_summary, files_modified, errors_encountered "
            "FROM session_diagnostics ORDER BY ALL"
        ).fetchall()
    finally:
        con.close()
    got = from_duckdb(pipeline.query)
    assert differences(expected, got) == []
    assert (
        pipeline.query(
            "SELECT session_id, tool_call_summary, files_modified, errors_encountered "
            "FROM session_diagnostics ORDER BY ALL"
        )
        == tool_summaries
    )
    assert pipeline.query("SELECT count(*) FROM dead_letters") == [(0,)]
    outcomes = [e for e in events if e["kind"] == "session_outcome"]
    assert outcomes and all("files_modified" in e for e in outcomes)

    # and what that covers, seen in the rows themselves
    searches = pipeline.query("SELECT count(*), count(*) FILTER (WHERE is_followup) FROM searches")
    assert searches[0][0] == sum(e["kind"] == "search" for e in events) and searches[0][1] > 0
    signals = dict(pipeline.query("SELECT signal, count(*) FROM retrieval_feedback GROUP BY 1"))
    assert signals.get("used", 0) > 0 and signals.get("ignored", 0) > 0
    categories = {r[0] for r in pipeline.query("SELECT failure_category FROM session_diagnostics")}
    assert "test_failure" in categories
    prefixes = {r[0][:6] for r in pipeline.query("SELECT session_id FROM session_diagnostics")}
    assert prefixes == {"conv-a", "conv-b", "conv-c"}
    # turns without captured output: counted, not guessed
    counters = [v for k, v in pipeline.consume(pipeline.settings.topics.counters)
                if k == UNJUDGED_TURNS.encode() and v["type"] == "increment"]  # fmt: skip
    assert sum(c["value"] for c in counters) > 0


def test_broken_records_and_spans_are_dead_letters(pipeline: Pipeline) -> None:
    a = Agent()
    root = a.span("handler", 0, None)  # no conversation anywhere above the search
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory"})
    a.span("chat", 3, 4, root, **{"gen_ai.operation.name": "chat",
                                  "gen_ai.conversation.id": "c1",
                                  "gen_ai.output.messages": "{broken json"})  # fmt: skip
    root.end(end_time=a_ns(5))
    topic = pipeline.settings.topics.otlp_spans
    pipeline.start()
    pipeline.publish([(None, b"\x00\x01 not otlp"), (None, b'{"resourceSpans": "nope"}'),
                      (None, encode_spans(a.spans).SerializeToString())], topic=topic)  # fmt: skip
    pipeline.drain(timeout=120)
    rows = pipeline.query(
        'SELECT topic, reason, detail, partition, "offset", batch_index FROM dead_letters '
        "ORDER BY reason"
    )
    assert [(r[0], r[1]) for r in rows] == [
        (topic, "bad_value"), (topic, "missing_field"), (topic, "not_otlp"), (topic, "not_otlp")
    ]  # fmt: skip
    by = {r[1]: r for r in rows}
    # the two spans of one record: where it was, and each span's index in it
    assert by["bad_value"][3:5] == by["missing_field"][3:5]
    assert by["bad_value"][5] != by["missing_field"][5]
    assert "gen_ai.output.messages is not valid JSON" in by["bad_value"][2]
    assert "gen_ai.conversation.id" in by["missing_field"][2]
    assert any("otlp_json" in r[2] for r in rows if r[1] == "not_otlp")


def a_ns(seconds: float) -> int:
    from tests.unit.test_otlp import ns

    return ns(seconds)
