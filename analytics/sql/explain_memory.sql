-- memdiag explain-memory ID --agent A: the memory as the pipeline has it, its name key, how
-- many of the agent's memories are its look-alikes (look_alike), and whether a path reaches it.
SELECT m.agent_id, m.memory_id, m.name, name_key(m.name) AS name_key, m.status, m.store,
       m.written_at, m.indexed_at, m.indexed_store, m.index_delay_seconds, m.ever_unindexed,
       list_contains(coalesce(a.ambient_memory_ids, []::VARCHAR[]), m.memory_id) AS in_ambient,
       a.ambient_at, a.ambient_session_id, a.broken_since, a.clock AS agent_clock,
       (SELECT count(*) FROM memory_pipeline o
        WHERE o.agent_id = m.agent_id AND o.memory_id <> m.memory_id
          AND look_alike(m.name, o.name))
           AS look_alikes
FROM memory_pipeline m
LEFT JOIN pipeline_agents a USING (agent_id)
WHERE m.agent_id = $agent_id AND m.memory_id = $memory_id;
