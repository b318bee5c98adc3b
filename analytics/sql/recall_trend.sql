-- memdiag query recall-trend (and the report's chart): SRR and ATR per agent and time bucket
-- of $bucket_seconds (the recall_trend macro), oldest first; the task probes' recall beside.
SELECT agent_id, bucket_start, written, probed, hits, semantic_recall_rate, ambient_contexts,
       ambient_trigger_rate, task_probed, task_hits, task_recall_rate
FROM recall_trend(bucket_seconds := $bucket_seconds)
WHERE $agent_id IS NULL OR agent_id = $agent_id
ORDER BY agent_id, bucket_start;
