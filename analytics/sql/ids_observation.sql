-- Every observation (memory) a session injected: judged, weighed or strengthened.
SELECT observation_id AS id FROM retrieval_feedback
UNION SELECT observation_id FROM observation_weights
UNION SELECT observation_id FROM observation_strength
