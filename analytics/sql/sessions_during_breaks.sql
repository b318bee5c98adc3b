-- One agent's sessions whose outcome fell while its pipeline was down (session_pipeline), the
-- newest first; `total` in all.
SELECT session_id, outcome, failure_category, failed, ts, break_since, break_until,
       count(*) OVER () AS total
FROM session_pipeline
WHERE agent_id = $agent_id AND pipeline_state = 'broken'
ORDER BY ts DESC, session_id
LIMIT $limit;
