-- One row per agent, the last summary the worker sent (after every batch that touched it).
INSERT INTO pipeline_agents (agent_id, clock, last_indexed_at, ambient_at, ambient_session_id,
                             ambient_memory_ids, broken_since, deadline_seconds, updated_at)
SELECT agent_id, CAST(clock AS TIMESTAMPTZ), CAST(last_indexed_at AS TIMESTAMPTZ),
       CAST(ambient_at AS TIMESTAMPTZ), ambient_session_id, ambient_memory_ids,
       CAST(broken_since AS TIMESTAMPTZ), deadline_seconds, current_timestamp
FROM batch
ON CONFLICT (agent_id) DO UPDATE SET
    clock = EXCLUDED.clock,
    last_indexed_at = EXCLUDED.last_indexed_at,
    ambient_at = EXCLUDED.ambient_at,
    ambient_session_id = EXCLUDED.ambient_session_id,
    ambient_memory_ids = EXCLUDED.ambient_memory_ids,
    broken_since = EXCLUDED.broken_since,
    deadline_seconds = EXCLUDED.deadline_seconds,
    updated_at = EXCLUDED.updated_at;
