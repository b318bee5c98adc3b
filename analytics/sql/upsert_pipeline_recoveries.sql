-- A pipeline_recovered: closes the episode that began at `since`.
INSERT INTO pipeline_breaks (agent_id, since, recovered_at)
SELECT agent_id, CAST(since AS TIMESTAMPTZ), CAST(ts AS TIMESTAMPTZ)
FROM batch
ON CONFLICT (agent_id, since) DO UPDATE SET
    recovered_at = EXCLUDED.recovered_at;
