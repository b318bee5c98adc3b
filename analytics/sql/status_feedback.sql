SELECT count(*) FILTER (WHERE signal = 'used') AS used,
       count(*) FILTER (WHERE signal = 'ignored') AS ignored,
       count(DISTINCT observation_id) AS observations
FROM retrieval_feedback;
