-- The agents whose recall pipeline has a memory of this id (memory ids are an agent's own).
SELECT agent_id FROM memory_pipeline WHERE memory_id = $memory_id
UNION SELECT agent_id FROM recall_probe_events WHERE memory_id = $memory_id
ORDER BY agent_id;
