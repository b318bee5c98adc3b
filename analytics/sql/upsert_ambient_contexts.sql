-- One row per ambient_context event: a function of the event alone, so a redelivery or a
-- replay writes the same values. ingested_at keeps its first value.
INSERT INTO ambient_contexts (event_id, agent_id, session_id, memory_ids, ts, ingested_at)
SELECT event_id, agent_id, session_id, memory_ids, CAST(ts AS TIMESTAMPTZ), current_timestamp
FROM batch
ON CONFLICT (agent_id, event_id) DO UPDATE SET
    session_id = EXCLUDED.session_id,
    memory_ids = EXCLUDED.memory_ids,
    ts = EXCLUDED.ts;
