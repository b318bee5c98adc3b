-- Sessions by outcome, optionally of one org, one project, since a time.
SELECT outcome, count(*) AS sessions
FROM session_diagnostics
WHERE ($org_id IS NULL OR org_id = $org_id)
  AND ($project_id IS NULL OR project_id = $project_id)
  AND ($since IS NULL OR ts >= $since)
GROUP BY outcome
ORDER BY sessions DESC, outcome;
