-- memdiag explain-memory: the names and name keys of the memories its probes returned.
SELECT memory_id, name, name_key(name) AS name_key, status
FROM memory_pipeline
WHERE agent_id = $agent_id AND list_contains($memory_ids, memory_id);
