-- One observation's outcome weight, step by step in outcome order: each session it was in,
-- its outcome and category (a memory's outcome history).
SELECT h.step, h.ts, h.session_id, h.outcome, d.failure_category, h.alpha,
       h.previous_weight, h.new_weight, h.aggressive, h.misleading, d.agent_id
FROM observation_weight_history h
LEFT JOIN session_diagnostics d USING (session_id)
WHERE h.observation_id = $observation_id
ORDER BY h.step, h.ts, h.session_id;
