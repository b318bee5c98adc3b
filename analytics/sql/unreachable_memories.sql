-- One agent's unreachable memories (as pipeline_health counts them: past the index deadline
-- unindexed and not in the latest ambient context), the oldest write first; `total` in all.
SELECT m.memory_id, m.name, m.written_at, m.store, count(*) OVER () AS total
FROM memory_pipeline m
LEFT JOIN pipeline_agents a USING (agent_id)
WHERE m.agent_id = $agent_id AND m.status = 'unindexed'
  AND NOT list_contains(coalesce(a.ambient_memory_ids, []::VARCHAR[]), m.memory_id)
ORDER BY m.written_at NULLS LAST, m.memory_id
LIMIT $limit;
