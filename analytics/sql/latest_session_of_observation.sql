-- The newest failed session an observation was injected in (by its outcome's event time).
SELECT session_id
FROM observation_weight_history
WHERE observation_id = $observation_id AND outcome IN ('rejected', 'rework')
ORDER BY ts DESC, session_id
LIMIT 1;
