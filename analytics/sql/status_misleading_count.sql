SELECT count(*) AS observations FROM misleading_observations();
