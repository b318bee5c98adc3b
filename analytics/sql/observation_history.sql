-- One observation's verdicts, most recent first, with their session's outcome and category;
-- `total` is how many verdicts it has in all.
SELECT f.ts, f.session_id, f.turn_id, f.signal, f.match_ratio, f.keyword_count,
       f.matched_count, f.similarity, f.detector, d.outcome, d.failure_category, f.org_id, f.project_id,
       count(*) OVER () AS total
FROM retrieval_feedback f
LEFT JOIN session_diagnostics d USING (session_id)
WHERE f.observation_id = $observation_id
ORDER BY f.ts DESC, f.session_id, f.turn_id
LIMIT $limit;
