-- The followup rate (the followup_rate view), optionally of one org, one project, since a time.
SELECT count(*) FILTER (WHERE source = 'agent') AS agent_searches,
       count(*) FILTER (WHERE is_followup) AS followups,
       CASE WHEN count(*) FILTER (WHERE source = 'agent') = 0 THEN NULL
            ELSE (count(*) FILTER (WHERE is_followup))::DOUBLE
                 / count(*) FILTER (WHERE source = 'agent') END AS rate,
       count(*) AS searches
FROM searches
WHERE ($org_id IS NULL OR org_id = $org_id)
  AND ($project_id IS NULL OR project_id = $project_id)
  AND ($since IS NULL OR ts >= $since);
