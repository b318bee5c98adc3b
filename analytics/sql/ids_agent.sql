-- Every agent memdiag knows: of the recall pipeline, or named by a session or a search.
SELECT agent_id AS id FROM pipeline_agents
UNION SELECT agent_id FROM memory_pipeline
UNION SELECT agent_id FROM recall_probe_events
UNION SELECT agent_id FROM session_diagnostics
UNION SELECT agent_id FROM searches
