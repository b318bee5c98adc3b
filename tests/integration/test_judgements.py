"""Benchmark judgements through the real broker: attribution, redelivery, bad input."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration


def judgement(run: str, q: str, correct: bool, gold: list[str], retrieved: list[str], **kw) -> dict:
    return {
        "kind": "judgement",
        "event_id": f"{run}-{q}-{kw.get('repeat_index', 0)}-{kw.get('condition', '')}",
        "ts": "2026-11-21T10:00:00.000Z",
        "run_id": run,
        "question_id": q,
        "judge_correct": correct,
        "gold_evidence_ids": gold,
        "retrieved_context_ids": retrieved,
        **kw,
    }


def test_judgements_are_attributed_and_counted_once(pipeline: Pipeline) -> None:
    pipeline.start()
    run = "run-a"
    batch = [
        judgement(run, "q-correct", True, ["g"], []),
        judgement(run, "q-no-gold", False, [], ["x"]),
        judgement(run, "q-reader", False, ["g1", "g2"], ["g2", "g1", "x"]),
        judgement(run, "q-retrieval", False, ["g1", "g2"], ["g1"], repeat_index=1),
        judgement(
            run, "q-reader", True, ["g"], ["g"], condition="other", latency_ms=12.5, tokens=7
        ),
    ]
    topic = pipeline.settings.topics.judgements
    pipeline.publish(
        [(run.encode(), batch), (run.encode(), batch[2])], topic=topic
    )  # q-reader twice
    pipeline.publish([(b"run-b", b'{"kind": "judgement", "event_id": "bad"}')], topic=topic)
    pipeline.drain()
    rows = pipeline.query(
        "SELECT question_id, condition, repeat_index, failure_mode, gold_retrieved "
        "FROM judgements ORDER BY ALL"
    )
    assert rows == [
        ("q-correct", "", 0, None, 0),
        ("q-no-gold", "", 0, "unattributed", 0),
        ("q-reader", "", 0, "reader_failure", 2),
        ("q-reader", "other", 0, None, 1),
        ("q-retrieval", "", 1, "retrieval_failure", 1),
    ]
    assert pipeline.query("SELECT reason FROM dead_letters") == [("missing_field",)]
    before = pipeline.snapshot()
    pipeline.publish([(run.encode(), batch)], topic=topic)  # a replay
    pipeline.drain()
    assert pipeline.snapshot() == before
