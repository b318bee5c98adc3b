-- The stored verdicts against a recomputation at $window, and the windows they are
-- consistent with: at least the longest followup gap, less than the shortest gap of a
-- disjoint new query that was not a followup. Same filters as calibration_sessions.
WITH judged AS (
    SELECT s.is_followup, s.disjoint_new_query, s.gap_seconds
    FROM searches s
    JOIN session_diagnostics d USING (session_id)
    WHERE s.disjoint_new_query IS NOT NULL
      AND ($org_id IS NULL OR d.org_id = $org_id)
      AND ($project_id IS NULL OR d.project_id = $project_id)
      AND ($since IS NULL OR d.ts >= CAST($since AS TIMESTAMPTZ))
)
SELECT count(*) AS checked,
       count(*) FILTER (WHERE is_followup IS DISTINCT FROM
                              (disjoint_new_query AND gap_seconds <= $window)) AS disagree,
       max(gap_seconds) FILTER (WHERE is_followup) AS window_at_least,
       min(gap_seconds) FILTER (WHERE disjoint_new_query AND NOT is_followup) AS window_below
FROM judged;
