-- A pipeline_break: the episode's row, keyed by the agent and the break's since. It never
-- touches recovered_at, so a break and its recovery in one flush come out the same in
-- either order.
INSERT INTO pipeline_breaks (agent_id, since, broken_at, oldest_memory_id, unindexed)
SELECT agent_id, CAST(since AS TIMESTAMPTZ), CAST(ts AS TIMESTAMPTZ), oldest_memory_id, unindexed
FROM batch
ON CONFLICT (agent_id, since) DO UPDATE SET
    broken_at = EXCLUDED.broken_at,
    oldest_memory_id = EXCLUDED.oldest_memory_id,
    unindexed = EXCLUDED.unindexed;
