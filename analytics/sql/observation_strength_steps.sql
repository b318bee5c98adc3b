-- One observation's strength, step by step in turn order: at most about $points of them spread
-- evenly, the first and the last (its chart).
WITH steps AS (
    SELECT *, row_number() OVER (ORDER BY step, ts, session_id, turn_id) AS n,
           count(*) OVER () AS total
    FROM observation_strength_history
    WHERE observation_id = $observation_id
)
SELECT step, ts, session_id, turn_id, signal, alpha, previous_strength, strength, n, total
FROM steps
WHERE total <= $points OR (n - 1) % ceil(total / $points)::BIGINT = 0 OR n = total
ORDER BY n;
