-- The newest failed sessions (by their outcome's event time), optionally of one org, one
-- project, since a time; `total` is how many there are in all (the list says "10 of 218").
SELECT session_id, agent_id, outcome, failure_category, search_count, followup_count,
       len(ignored_observation_ids) AS ignored, len(misleading_observation_ids) AS misleading,
       ts, org_id, project_id, count(*) OVER () AS total
FROM session_diagnostics
WHERE outcome IN ('rejected', 'rework')
  AND ($org_id IS NULL OR org_id = $org_id)
  AND ($project_id IS NULL OR project_id = $project_id)
  AND ($since IS NULL OR ts >= $since)
ORDER BY ts DESC, session_id
LIMIT $limit;
