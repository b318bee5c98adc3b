-- One agent's pipeline break spans (pipeline_break_spans), the newest first, with the
-- sessions that ended in each and how many of those failed.
SELECT b.since, b.until, b.first_memory_id, b.memories,
       count(s.session_id) AS sessions,
       count(s.session_id) FILTER (WHERE s.failed) AS failed_sessions
FROM pipeline_break_spans b
LEFT JOIN session_pipeline s
       ON s.agent_id = b.agent_id AND s.pipeline_state = 'broken' AND s.break_since = b.since
WHERE b.agent_id = $agent_id
GROUP BY ALL
ORDER BY b.since DESC;
