-- memdiag explain-memory: the names and name keys of the memories its probes returned, and
-- whether each is a look-alike of the target's name.
SELECT memory_id, name, name_key(name) AS name_key, status,
       look_alike(CAST($target_name AS VARCHAR), name) AS look_alike
FROM memory_pipeline
WHERE agent_id = $agent_id AND list_contains($memory_ids, memory_id);
