-- Dead weight: memories judged in at least $min_injections (session, turn) pairs (with the
-- turn's time at or after $since) and used in none of them, with their strength and their
-- last judged turn. What a consolidation job would prune or demote, least used first.
SELECT f.observation_id,
       count(*) AS judged_turns,
       count(DISTINCT f.session_id) AS sessions,
       max(f.ts) AS last_judged_at,
       st.strength,
       w.weight,
       count(*) OVER () AS total
FROM retrieval_feedback f
LEFT JOIN observation_strength st ON st.observation_id = f.observation_id
LEFT JOIN observation_weights w ON w.observation_id = f.observation_id
WHERE $since IS NULL OR f.ts >= $since
GROUP BY f.observation_id, st.strength, w.weight
HAVING count(*) >= $min_injections AND count(*) FILTER (WHERE f.signal = 'used') = 0
ORDER BY judged_turns DESC, st.strength NULLS LAST, f.observation_id
LIMIT $limit;
