-- The most recent benchmark runs (by their newest judgement), reader vs retrieval failures.
SELECT run_id,
       count(*) AS judgements,
       avg(judge_correct::INTEGER) AS accuracy,
       count(*) FILTER (WHERE failure_mode = 'reader_failure') AS reader_failures,
       count(*) FILTER (WHERE failure_mode = 'retrieval_failure') AS retrieval_failures,
       count(*) FILTER (WHERE failure_mode = 'unattributed') AS unattributed,
       max(ts) AS last_judgement
FROM judgements
GROUP BY run_id
ORDER BY last_judgement DESC, run_id
LIMIT $limit;
