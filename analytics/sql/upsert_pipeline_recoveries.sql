-- A pipeline_recovered closes the episode that began at `since`. It carries the break it
-- ends, so it rebuilds the whole row when the pipeline_break record itself was lost.
INSERT INTO pipeline_breaks (agent_id, since, broken_at, recovered_at, oldest_memory_id,
                             unindexed)
SELECT agent_id, CAST(since AS TIMESTAMPTZ), CAST(broken_at AS TIMESTAMPTZ),
       CAST(ts AS TIMESTAMPTZ), oldest_memory_id, unindexed
FROM batch
ON CONFLICT (agent_id, since) DO UPDATE SET
    recovered_at = EXCLUDED.recovered_at,
    broken_at = coalesce(pipeline_breaks.broken_at, EXCLUDED.broken_at),
    oldest_memory_id = coalesce(pipeline_breaks.oldest_memory_id, EXCLUDED.oldest_memory_id),
    unindexed = coalesce(pipeline_breaks.unindexed, EXCLUDED.unindexed);
