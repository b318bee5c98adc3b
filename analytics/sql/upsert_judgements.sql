-- One row per (run, question, condition, repeat). A redelivery rewrites the same values; a
-- later judgement of the same answer (a re-judged run) replaces an earlier one.
INSERT INTO judgements (run_id, question_id, condition, repeat_index, judge_correct,
                        failure_mode, gold_evidence_ids, retrieved_context_ids, ts,
                        gold_retrieved, latency_ms, tokens, event_id, ingested_at)
SELECT run_id, question_id, condition, repeat_index, judge_correct, failure_mode,
       gold_evidence_ids, retrieved_context_ids, CAST(ts AS TIMESTAMPTZ), gold_retrieved,
       latency_ms, tokens, event_id, current_timestamp
FROM batch
ON CONFLICT (run_id, question_id, condition, repeat_index) DO UPDATE SET
    judge_correct = EXCLUDED.judge_correct,
    failure_mode = EXCLUDED.failure_mode,
    gold_evidence_ids = EXCLUDED.gold_evidence_ids,
    retrieved_context_ids = EXCLUDED.retrieved_context_ids,
    ts = EXCLUDED.ts,
    gold_retrieved = EXCLUDED.gold_retrieved,
    latency_ms = EXCLUDED.latency_ms,
    tokens = EXCLUDED.tokens,
    event_id = EXCLUDED.event_id
WHERE EXCLUDED.ts >= judgements.ts;
