-- A pipeline_break: its episode's row, all but recovered_at, which only the recovery sets.
-- So a break and its recovery come out the same in one flush or two, in either order.
INSERT INTO pipeline_breaks (agent_id, episode, since, broken_at, oldest_memory_id, unindexed)
SELECT agent_id, episode, CAST(since AS TIMESTAMPTZ), CAST(broken_at AS TIMESTAMPTZ),
       oldest_memory_id, unindexed
FROM batch
ON CONFLICT (agent_id, episode) DO UPDATE SET
    since = EXCLUDED.since,
    broken_at = EXCLUDED.broken_at,
    oldest_memory_id = EXCLUDED.oldest_memory_id,
    unindexed = EXCLUDED.unindexed;
