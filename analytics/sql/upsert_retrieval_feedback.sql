-- One row per (session, turn, observation); a redelivery carries the same verdict. A record
-- from a worker older than the detector column is a keyword verdict.
INSERT INTO retrieval_feedback (session_id, turn_id, observation_id, signal, match_ratio,
                                keyword_count, matched_count, ts, agent_id, org_id,
                                project_id, ingested_at, similarity, detector)
SELECT session_id, turn_id, observation_id, signal, match_ratio, keyword_count, matched_count,
       CAST(ts AS TIMESTAMPTZ), agent_id, org_id, project_id, current_timestamp, similarity,
       coalesce(detector, 'keyword')
FROM batch
ON CONFLICT (session_id, turn_id, observation_id) DO UPDATE SET
    signal = EXCLUDED.signal,
    match_ratio = EXCLUDED.match_ratio,
    keyword_count = EXCLUDED.keyword_count,
    matched_count = EXCLUDED.matched_count,
    ts = EXCLUDED.ts,
    similarity = EXCLUDED.similarity,
    detector = EXCLUDED.detector;
