-- One observation's used/ignored counts, with its current weight and strength when it has
-- them.
SELECT $observation_id AS observation_id,
       coalesce(s.used, 0) AS used,
       coalesce(s.ignored, 0) AS ignored,
       w.weight,
       w.failed_sessions,
       w.accepted_sessions,
       w.misleading,
       w.updated_at,
       st.strength,
       st.step AS strength_steps,
       st.updated_at AS strength_updated_at
FROM (SELECT 1) AS one
LEFT JOIN observation_feedback_stats s ON s.observation_id = $observation_id
LEFT JOIN observation_weights w ON w.observation_id = $observation_id
LEFT JOIN observation_strength st ON st.observation_id = $observation_id;
