"""A session whose state outgrows a changelog record, through the real broker and Faust's
recovery (#38): responses full of distinct words (logs, code, ids) make a sealed chunk of
its log longer than 512 KB. The worker sends it in pieces; a fresh machine (the state
folder deleted) rebuilds it from the changelog, and the session's late events are joined
with what it rebuilt: DuckDB holds the reference's rows.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from memdiag.streams.app import STATE_TABLE
from memdiag.streams.checkpoint import RECORD_LIMIT
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
