SELECT m.observation_id, m.fail_count, m.success_count, w.weight
FROM misleading_observations(org_id := $org_id, since := $since) m
LEFT JOIN observation_weights w USING (observation_id)
ORDER BY m.fail_count DESC, m.observation_id
LIMIT $limit;
