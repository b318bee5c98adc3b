-- One row per (run, question, condition, repeat). A redelivery rewrites the same values; a
-- later judgement of the same answer (a re-judged run) replaces an earlier one.
INSERT INTO judgements (run_id, question_id, condition, repeat_index, judge_correct,
                        failure_mode, gold_evidence_ids, retrieved_context_ids, ts,
                        gold_retrieved, latency_ms, tokens, event_id, ingested_at,
                        input_tokens, output_tokens, score, duration_ms, run_group_id,
                        suite_id, suite_version, suite_checksum, fixture_checksum,
                        config_fingerprint, git_head, service_version)
SELECT run_id, question_id, condition, repeat_index, judge_correct, failure_mode,
       gold_evidence_ids, retrieved_context_ids, CAST(ts AS TIMESTAMPTZ), gold_retrieved,
       latency_ms, tokens, event_id, current_timestamp,
       input_tokens, output_tokens, score, duration_ms, run_group_id, suite_id,
       suite_version, suite_checksum, fixture_checksum, config_fingerprint, git_head,
       service_version
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
    event_id = EXCLUDED.event_id,
    input_tokens = EXCLUDED.input_tokens,
    output_tokens = EXCLUDED.output_tokens,
    score = EXCLUDED.score,
    duration_ms = EXCLUDED.duration_ms,
    run_group_id = EXCLUDED.run_group_id,
    suite_id = EXCLUDED.suite_id,
    suite_version = EXCLUDED.suite_version,
    suite_checksum = EXCLUDED.suite_checksum,
    fixture_checksum = EXCLUDED.fixture_checksum,
    config_fingerprint = EXCLUDED.config_fingerprint,
    git_head = EXCLUDED.git_head,
    service_version = EXCLUDED.service_version
WHERE EXCLUDED.ts >= judgements.ts;
