-- One observation's used/ignored counts, with its current weight when it has one.
SELECT $observation_id AS observation_id,
       coalesce(s.used, 0) AS used,
       coalesce(s.ignored, 0) AS ignored,
       w.weight,
       w.failed_sessions,
       w.accepted_sessions,
       w.misleading,
       w.updated_at
FROM (SELECT 1) AS one
LEFT JOIN observation_feedback_stats s ON s.observation_id = $observation_id
LEFT JOIN observation_weights w ON w.observation_id = $observation_id;
