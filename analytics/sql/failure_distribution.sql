SELECT failure_category, sessions
FROM failure_category_distribution(org_id := $org_id, project_id := $project_id, since := $since);
