-- One session's evaluated turns: each injected memory's verdict, turns in event time, and
-- the strength step each verdict gave its memory, and the similarity under the semantic rule.
SELECT f.turn_id, f.observation_id, f.signal, f.match_ratio, f.keyword_count,
       f.matched_count, f.similarity, f.detector, f.ts, f.agent_id, f.org_id, f.project_id,
       h.previous_strength, h.strength
FROM retrieval_feedback f
LEFT JOIN observation_strength_history h
       ON h.observation_id = f.observation_id AND h.session_id = f.session_id
      AND h.turn_id = f.turn_id
WHERE f.session_id = $session_id
ORDER BY min(f.ts) OVER (PARTITION BY f.turn_id), f.turn_id, f.match_ratio DESC,
         f.observation_id;
