-- How many memories one agent's recall pipeline has.
SELECT count(*) AS memories FROM memory_pipeline WHERE agent_id = $agent_id;
