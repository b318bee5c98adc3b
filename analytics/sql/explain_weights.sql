-- The weight step this session gave each of its memories, with the weight and the strength
-- now.
SELECT h.observation_id, h.previous_weight, h.new_weight, h.alpha, h.aggressive,
       h.misleading, h.step, w.weight AS weight_now, w.misleading AS misleading_now,
       w.failed_sessions, w.accepted_sessions, st.strength AS strength_now
FROM observation_weight_history h
LEFT JOIN observation_weights w USING (observation_id)
LEFT JOIN observation_strength st USING (observation_id)
WHERE h.session_id = $session_id
ORDER BY h.misleading DESC, h.new_weight, h.observation_id;
