-- memdiag breaks: every session with an outcome and its agent's pipeline state then.
SELECT session_id, agent_id, failed, pipeline_state, ts, break_since, break_until
FROM session_pipeline
ORDER BY ts, session_id;
