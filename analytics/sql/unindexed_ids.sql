-- Each agent's unindexed memories (past the index deadline, never indexed), the oldest
-- write first, at most $limit of them: what pipeline health names.
SELECT agent_id, list(memory_id ORDER BY written_at, memory_id)[1:$limit] AS memory_ids
FROM memory_pipeline
WHERE status = 'unindexed' AND ($agent_id IS NULL OR agent_id = $agent_id)
GROUP BY agent_id;
