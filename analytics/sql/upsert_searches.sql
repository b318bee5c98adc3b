-- One row per search event; a redelivery carries the same verdict and overwrites nothing new.
-- published_at and ingested_at keep their first values: a replay leaves the row as it was.
-- A row of another session under a taken event_id (the producer reused the id) is not
-- written: the count of rows written says so, and the sink dead-letters it.
INSERT INTO searches (event_id, session_id, ts, source, result_count, evaluated, is_followup,
                      prev_event_id, gap_seconds, disjoint_new_query, agent_id, org_id,
                      project_id, query, published_at, ingested_at)
SELECT event_id, session_id, CAST(ts AS TIMESTAMPTZ), source, result_count, evaluated,
       is_followup, prev_event_id, gap_seconds, disjoint_new_query, agent_id, org_id, project_id, query,
       CAST(published_at AS TIMESTAMPTZ), current_timestamp
FROM batch
ON CONFLICT (event_id) DO UPDATE SET
    session_id = EXCLUDED.session_id,
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
    query = EXCLUDED.query
WHERE searches.session_id = EXCLUDED.session_id;
