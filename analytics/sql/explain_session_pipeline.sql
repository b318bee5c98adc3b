-- memdiag explain: the session's agent's memory pipeline at the outcome's time.
SELECT pipeline_state, break_since, break_until, break_first_memory_id
FROM session_pipeline
WHERE session_id = $session_id;
