-- One observation's strength, step by step in turn order.
SELECT step, ts, session_id, turn_id, signal, alpha, previous_strength, strength
FROM observation_strength_history
WHERE observation_id = $observation_id
ORDER BY step, ts, session_id, turn_id;
