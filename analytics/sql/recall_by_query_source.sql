-- memdiag query pipeline-health (its task columns), the agent page and the report: recall per
-- agent and query source (the recall_by_query_source view).
SELECT agent_id, query_source, probed, hits, recall_rate
FROM recall_by_query_source
WHERE $agent_id IS NULL OR agent_id = $agent_id
ORDER BY agent_id, query_source;
