-- One agent's unindexed memories (past the index deadline, never indexed), the oldest write
-- first, each marked unreachable when it is not in the latest ambient context either (no
-- path brings it back, as pipeline_health counts it); `total` in all.
SELECT m.memory_id, m.name, m.written_at, m.store,
       NOT list_contains(coalesce(a.ambient_memory_ids, []::VARCHAR[]), m.memory_id)
           AS unreachable,
       count(*) OVER () AS total
FROM memory_pipeline m
LEFT JOIN pipeline_agents a USING (agent_id)
WHERE m.agent_id = $agent_id AND m.status = 'unindexed'
ORDER BY m.written_at NULLS LAST, m.memory_id
LIMIT $limit;
