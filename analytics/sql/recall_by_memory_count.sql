-- memdiag query recall-trend --by memory-count (and the report's chart): SRR and ATR per agent
-- and memory-count bucket, the smallest count first; the task probes' recall beside.
SELECT agent_id, memory_count_from, memory_count_to, probed, hits, semantic_recall_rate,
       ambient_contexts, ambient_trigger_rate, task_probed, task_hits, task_recall_rate
FROM recall_by_memory_count
WHERE $agent_id IS NULL OR agent_id = $agent_id
ORDER BY agent_id, memory_count_to;
