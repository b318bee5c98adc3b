-- One row per (session, turn, observation); a redelivery carries the same verdict.
INSERT INTO retrieval_feedback (session_id, turn_id, observation_id, signal, match_ratio,
                                keyword_count, matched_count, ts, agent_id, org_id,
                                project_id, ingested_at)
SELECT session_id, turn_id, observation_id, signal, match_ratio, keyword_count, matched_count,
       CAST(ts AS TIMESTAMPTZ), agent_id, org_id, project_id, current_timestamp
FROM batch
ON CONFLICT (session_id, turn_id, observation_id) DO UPDATE SET
    signal = EXCLUDED.signal,
    match_ratio = EXCLUDED.match_ratio,
    keyword_count = EXCLUDED.keyword_count,
    matched_count = EXCLUDED.matched_count,
    ts = EXCLUDED.ts;
