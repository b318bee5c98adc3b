-- Every agent that sent memory events (memdiag.memory): the recall pipeline's agents.
SELECT agent_id AS id FROM pipeline_agents
UNION SELECT agent_id FROM memory_pipeline
UNION SELECT agent_id FROM recall_probe_events
UNION SELECT agent_id FROM ambient_contexts
