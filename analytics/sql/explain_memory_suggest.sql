-- memdiag explain-memory, an unknown id: the agent's memories whose latest name probe missed
-- first (what one would look up), then the latest written.
WITH latest AS (
    SELECT memory_id, hit
    FROM recall_probe_events
    WHERE agent_id = $agent_id AND query_source = 'name'
    QUALIFY row_number() OVER (PARTITION BY memory_id ORDER BY ts DESC, event_id DESC) = 1
)
SELECT m.memory_id, m.name, m.status, l.hit
FROM memory_pipeline m
LEFT JOIN latest l USING (memory_id)
WHERE m.agent_id = $agent_id
ORDER BY (l.hit IS NOT NULL AND NOT l.hit) DESC, m.written_at DESC NULLS LAST, m.memory_id
LIMIT $limit;
