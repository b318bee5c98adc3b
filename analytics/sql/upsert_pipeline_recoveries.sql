-- A pipeline_recovered closes its episode. It carries the break it ends, so it makes the
-- whole row when the pipeline_break record itself was lost.
INSERT INTO pipeline_breaks (agent_id, episode, since, broken_at, recovered_at,
                             oldest_memory_id, unindexed)
SELECT agent_id, episode, CAST(since AS TIMESTAMPTZ), CAST(broken_at AS TIMESTAMPTZ),
       CAST(recovered_at AS TIMESTAMPTZ), oldest_memory_id, unindexed
FROM batch
ON CONFLICT (agent_id, episode) DO UPDATE SET
    since = EXCLUDED.since,
    broken_at = EXCLUDED.broken_at,
    recovered_at = EXCLUDED.recovered_at,
    oldest_memory_id = EXCLUDED.oldest_memory_id,
    unindexed = EXCLUDED.unindexed;
