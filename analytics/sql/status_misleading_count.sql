SELECT count(*) AS observations FROM misleading_observations(org_id := $org_id, since := $since);
