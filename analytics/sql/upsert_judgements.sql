-- Every judgement is an artifact, never overwritten: `judgement_artifacts` keeps each event
-- once per run (a redelivery adds nothing; ids are the run's own). `judgements` holds, per
-- (run, question, condition, repeat), the one that counts: the latest `ts`, ties by `event_id` (contract section 10),
-- whatever order they arrive in.
INSERT INTO judgement_artifacts (run_id, question_id, condition, repeat_index, judge_correct,
                                 failure_mode, gold_evidence_ids, retrieved_context_ids, ts,
                                 gold_retrieved, latency_ms, tokens, event_id, ingested_at,
                                 input_tokens, output_tokens, score, duration_ms,
                                 run_group_id, suite_id, suite_version, suite_checksum,
                                 fixture_checksum, config_fingerprint, git_head,
                                 service_version, label_status, split)
SELECT run_id, question_id, condition, repeat_index, judge_correct, failure_mode,
       gold_evidence_ids, retrieved_context_ids, CAST(ts AS TIMESTAMPTZ), gold_retrieved,
       latency_ms, tokens, event_id, current_timestamp,
       input_tokens, output_tokens, score, duration_ms, run_group_id, suite_id,
       suite_version, suite_checksum, fixture_checksum, config_fingerprint, git_head,
       service_version, label_status, split
FROM batch
ON CONFLICT (run_id, event_id) DO NOTHING;

INSERT INTO judgements (run_id, question_id, condition, repeat_index, judge_correct,
                        failure_mode, gold_evidence_ids, retrieved_context_ids, ts,
                        gold_retrieved, latency_ms, tokens, event_id, ingested_at,
                        input_tokens, output_tokens, score, duration_ms, run_group_id,
                        suite_id, suite_version, suite_checksum, fixture_checksum,
                        config_fingerprint, git_head, service_version, label_status, split)
SELECT run_id, question_id, condition, repeat_index, judge_correct, failure_mode,
       gold_evidence_ids, retrieved_context_ids, CAST(ts AS TIMESTAMPTZ), gold_retrieved,
       latency_ms, tokens, event_id, current_timestamp,
       input_tokens, output_tokens, score, duration_ms, run_group_id, suite_id,
       suite_version, suite_checksum, fixture_checksum, config_fingerprint, git_head,
       service_version, label_status, split
FROM batch
QUALIFY row_number() OVER (PARTITION BY run_id, question_id, condition, repeat_index
                          ORDER BY CAST(ts AS TIMESTAMPTZ) DESC, event_id DESC) = 1
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
    service_version = EXCLUDED.service_version,
    label_status = EXCLUDED.label_status,
    split = EXCLUDED.split
WHERE EXCLUDED.ts > judgements.ts
   OR (EXCLUDED.ts = judgements.ts AND EXCLUDED.event_id >= judgements.event_id);
