SELECT observation_id, used, ignored FROM observation_feedback_stats
ORDER BY used + ignored DESC, observation_id
LIMIT $limit;
