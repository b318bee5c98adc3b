-- memdiag query pipeline-health [--agent A]: broken agents first, then the worst coverage.
SELECT agent_id, written, indexed, pending, unindexed, pipeline_coverage,
       semantic_recall_rate, ambient_trigger_rate, last_written_at, last_indexed_at,
       broken, broken_since, probed, missed, not_indexed_misses, below_threshold_misses,
       aliased_misses, outranked_misses, aliasing_rate, unreachable, unreachable_share
FROM pipeline_health
WHERE $agent_id IS NULL OR agent_id = $agent_id
ORDER BY broken DESC, pipeline_coverage ASC NULLS LAST, agent_id;
