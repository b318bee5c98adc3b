-- Used and ignored verdicts, optionally of one org, one project, since a time.
SELECT count(*) FILTER (WHERE signal = 'used') AS used,
       count(*) FILTER (WHERE signal = 'ignored') AS ignored,
       count(DISTINCT observation_id) AS observations
FROM retrieval_feedback
WHERE ($org_id IS NULL OR org_id = $org_id)
  AND ($project_id IS NULL OR project_id = $project_id)
  AND ($since IS NULL OR ts >= $since);
