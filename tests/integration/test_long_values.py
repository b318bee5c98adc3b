"""A session whose state outgrows a changelog record, through the real broker and Faust's
recovery (#38): responses full of distinct words (logs, code, ids) make a sealed chunk of
its log longer than 512 KB. The worker sends it in pieces; a fresh machine (the state
folder deleted) rebuilds it from the changelog, and the session's late events are joined
with what it rebuilt: DuckDB holds the reference's rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from memdiag.publish import publish_file
from memdiag.streams.app import STATE_TABLE
from memdiag.streams.checkpoint import RECORD_LIMIT
from memdiag.streams.fit import TRUNCATED
from memdiag.streams.store import PART_HEADER
from tests.compare import differences, from_duckdb, from_reference
from tests.integration.conftest import Pipeline
from tests.reference import reference

pytestmark = pytest.mark.integration

SESSION = "ses_long"
TURNS = 8
#: distinct words a response holds: ~150 KB of text, four in a log chunk of eight records
WORDS = 15_000


def ts(second: int) -> str:
    return f"2026-11-24T09:{second // 60:02d}:{second % 60:02d}Z"


def turn(t: int) -> list[dict[str, Any]]:
    words = " ".join(f"trace{t}x{i:05d}" for i in range(WORDS))
    return [
        {"kind": "injection", "event_id": f"inj-{t}", "ts": ts(4 * t), "session_id": SESSION,
         "turn_id": f"turn-{t}", "observations": [
             {"id": f"obs-{t}", "content": f"deploy service trace{t}x00042 with canary"}]},
        {"kind": "response", "event_id": f"res-{t}", "ts": ts(4 * t + 1), "session_id": SESSION,
         "turn_id": f"turn-{t}", "text": f"{words} then deploy"},
    ]  # fmt: skip


def changelog_parts(p: Pipeline) -> int:
    """How many part records the worker's state changelog holds."""
    topic = f"{p.settings.app_id}-{STATE_TABLE}-changelog"

    async def go() -> int:
        c = AIOKafkaConsumer(topic, bootstrap_servers=p.settings.bootstrap_servers,
                             auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
        await c.start()
        try:
            parts = 0
            while batches := await c.getmany(timeout_ms=2000):
                for records in batches.values():
                    parts += sum(any(h == PART_HEADER for h, _ in r.headers) for r in records)
            return parts
        finally:
            await c.stop()

    return asyncio.run(go())


def test_a_state_value_longer_than_a_record_is_rebuilt_on_a_fresh_machine(
    pipeline: Pipeline,
) -> None:
    first = [e for t in range(TURNS) for e in turn(t)]
    assert sum(len(e.get("text", "")) for e in first[:8]) > RECORD_LIMIT  # a chunk's worth
    late = [
        *turn(TURNS),
        {"kind": "session_outcome", "event_id": "out-1", "ts": ts(4 * TURNS + 3),
         "session_id": SESSION, "outcome": "rejected", "tool_calls": [], "files_modified": [],
         "errors": []},
    ]  # fmt: skip
    pipeline.start("worker", "sink")
    pipeline.publish_events(first)
    pipeline.drain(timeout=120)
    pipeline.terminate("worker")
    assert changelog_parts(pipeline) > 0  # the chunk went in pieces
    shutil.rmtree(Path(pipeline.settings.state_dir))  # a fresh machine: rebuilt from the changelog
    pipeline.start("worker")
    pipeline.publish_events(late)
    pipeline.drain(timeout=120)
    log = (pipeline.workdir / "worker.log").read_text()
    assert "log chunk" not in log and "lack some of their part records" not in log, log[-3000:]
    expected = from_reference(reference(first + late))
    assert differences(expected, from_duckdb(pipeline.query)) == []
    (row,) = pipeline.query("SELECT outcome FROM session_diagnostics WHERE session_id = 'ses_long'")
    assert row == ("rejected",)


def test_a_diagnostic_over_the_output_limit_lands_trimmed(pipeline: Pipeline) -> None:
    """A failed session that injected thousands of memories and carries a big
    ``failure_context``: its diagnostic is over MEMDIAG_MAX_OUTPUT_BYTES (here 32 KiB, so the
    embedded broker, which takes larger records, shows it as Apache Kafka with its 1 MiB
    default would). It lands trimmed, says so, and the worker goes on with the next session."""
    limit = 32 * 1024
    pipeline.settings = dataclasses.replace(pipeline.settings, max_output_bytes=limit)
    observations = [{"id": f"obs_big_{i:05d}", "content": "c"} for i in range(4_000)]
    context = {"trace": [f"frame {i}: deploy.py line {i}" for i in range(3_000)]}

    def session(sid: str, obs: list[dict[str, str]], failure: Any) -> list[dict[str, Any]]:
        return [
            {"kind": "injection", "event_id": f"{sid}-inj", "ts": ts(1), "session_id": sid,
             "turn_id": "t1", "observations": obs},
            {"kind": "response", "event_id": f"{sid}-res", "ts": ts(2), "session_id": sid,
             "turn_id": "t1", "text": "done"},
            {"kind": "session_outcome", "event_id": f"{sid}-out", "ts": ts(3),
             "session_id": sid, "outcome": "rejected", "tool_calls": [], "files_modified": [],
             "errors": [], "failure_context": failure},
        ]  # fmt: skip

    big = session("ses_big", observations, context)
    small = session("ses_small", observations[:2], {"why": "tests failed"})
    pipeline.start("worker", "sink")
    pipeline.publish_events(big + small)
    pipeline.drain(timeout=120)
    rows = dict(pipeline.query(
        "SELECT session_id, failure_context FROM session_diagnostics"))  # fmt: skip
    assert json.loads(rows["ses_small"]) == {"why": "tests failed"}
    note = json.loads(rows["ses_big"])[TRUNCATED]
    assert note["limit"] == limit and note["bytes"] > limit
    assert set(note["fields"]) == {"failure_context", "injected_observation_ids",
                                   "ignored_observation_ids"}  # fmt: skip
    (kept,) = pipeline.query(
        "SELECT injected_observation_ids FROM session_diagnostics WHERE session_id = 'ses_big'"
    )[0]
    assert 0 < len(kept) < 4_000 and kept == [o["id"] for o in observations[: len(kept)]]
    log = (pipeline.workdir / "worker.log").read_text()
    assert "session_diagnostic 'ses_big'" in log and "was trimmed" in log
    # nothing was refused for it: no dead letter, both sessions' diagnostics are there
    assert pipeline.query("SELECT count(*) FROM dead_letters") == [(0,)]
    assert len(rows) == 2


def test_publish_dead_letters_a_line_no_message_can_carry(pipeline: Pipeline) -> None:
    """``memdiag publish`` of a file with one 9 MiB line among ordinary ones, through the real
    producer (its max_request_size is 8 MiB): the line is dead-lettered in its place, and
    every other event lands as usual."""
    events = [
        {"kind": "search", "event_id": f"q{i}", "ts": ts(i), "session_id": "ses_pub",
         "query": "deploy", "result_ids": ["obs_1"]}
        for i in range(4)
    ]  # fmt: skip
    huge = {"kind": "response", "event_id": "huge", "ts": ts(9), "session_id": "ses_pub",
            "turn_id": "t1", "text": "y" * (9 * 1024 * 1024)}  # fmt: skip
    path = pipeline.workdir / "events.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in [*events[:2], huge, *events[2:]]) + b"\n")
    pipeline.start("worker", "sink")
    stats = asyncio.run(publish_file(path, pipeline.settings))
    assert stats.too_large == 1 and stats.acknowledged == 5
    pipeline.drain(timeout=120)
    assert pipeline.query("SELECT count(*) FROM searches") == [(4,)]
    ((reason, key, size, detail),) = pipeline.query(
        "SELECT reason, key, payload_bytes, detail FROM dead_letters"
    )
    assert (reason, key, size) == ("too_large", "ses_pub", len(orjson.dumps(huge)))
    assert "line 3 of the published file" in detail
