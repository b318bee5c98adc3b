-- One row per search event; a redelivery carries the same verdict and overwrites nothing new.
-- published_at and ingested_at keep their first values: a replay leaves the row as it was.
-- Keyed by session and id: two sessions' searches under one id (a producer that numbers
-- each session's events) are two rows.
INSERT INTO searches (event_id, session_id, ts, source, result_count, evaluated, is_followup,
                      prev_event_id, gap_seconds, disjoint_new_query, agent_id, org_id,
                      project_id, query, published_at, ingested_at)
SELECT event_id, session_id, CAST(ts AS TIMESTAMPTZ), source, result_count, evaluated,
       is_followup, prev_event_id, gap_seconds, disjoint_new_query, agent_id, org_id, project_id, query,
       CAST(published_at AS TIMESTAMPTZ), current_timestamp
FROM batch
ON CONFLICT (session_id, event_id) DO UPDATE SET
    ts = EXCLUDED.ts,
    source = EXCLUDED.source,
    result_count = EXCLUDED.result_count,
    evaluated = EXCLUDED.evaluated,
    is_followup = EXCLUDED.is_followup,
    prev_event_id = EXCLUDED.prev_event_id,
    gap_seconds = EXCLUDED.gap_seconds,
    disjoint_new_query = EXCLUDED.disjoint_new_query,
    agent_id = EXCLUDED.agent_id,
    org_id = EXCLUDED.org_id,
    project_id = EXCLUDED.project_id,
    query = EXCLUDED.query;
