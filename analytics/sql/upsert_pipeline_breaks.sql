-- A pipeline_break: the episode's row, keyed by the agent and the break's since. A break
-- raised again with the same since after its recovery opens the row again; the same break
-- sent again (a redelivery) leaves its recovery alone.
INSERT INTO pipeline_breaks (agent_id, since, broken_at, oldest_memory_id, unindexed)
SELECT agent_id, CAST(since AS TIMESTAMPTZ), CAST(broken_at AS TIMESTAMPTZ), oldest_memory_id,
       unindexed
FROM batch
ON CONFLICT (agent_id, since) DO UPDATE SET
    recovered_at = CASE WHEN pipeline_breaks.recovered_at IS NOT NULL
                             AND EXCLUDED.broken_at > pipeline_breaks.recovered_at
                        THEN NULL ELSE pipeline_breaks.recovered_at END,
    broken_at = EXCLUDED.broken_at,
    oldest_memory_id = EXCLUDED.oldest_memory_id,
    unindexed = EXCLUDED.unindexed;
