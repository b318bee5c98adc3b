-- One observation's outcome weight, step by step in outcome order, each with its session's
-- outcome and category: at most about $points of them spread evenly (a memory of thousands of
-- sessions is thinned for its chart), the first and the last, and the newest $newest whole
-- (its table); `total` is how many steps it has.
WITH steps AS (
    SELECT h.*, row_number() OVER (ORDER BY h.step, h.ts, h.session_id) AS n,
           count(*) OVER () AS total
    FROM observation_weight_history h
    WHERE h.observation_id = $observation_id
),
kept AS (
    SELECT * FROM steps
    WHERE total <= $points OR (n - 1) % ceil(total / $points)::BIGINT = 0 OR n = total
       OR n > total - $newest
)
SELECT k.step, k.ts, k.session_id, k.outcome, d.failure_category, k.alpha, k.previous_weight,
       k.new_weight, k.aggressive, k.misleading, d.agent_id, k.n, k.total
FROM kept k
LEFT JOIN session_diagnostics d USING (session_id)
ORDER BY k.n;
