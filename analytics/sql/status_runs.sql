-- The most recent benchmark runs (by their newest judgement), reader vs retrieval failures.
-- Accuracy: every question weighs the same (the mean over (condition, question) of each
-- one's share of right answers, conditions pooled), as `memdiag report scores` folds it.
WITH accuracy AS (
    SELECT run_id, avg(share) AS accuracy
    FROM (SELECT run_id, avg(judge_correct::INTEGER) AS share
          FROM judgements GROUP BY run_id, condition, question_id)
    GROUP BY run_id
)
SELECT run_id,
       count(*) AS judgements,
       any_value(accuracy) AS accuracy,
       count(*) FILTER (WHERE failure_mode = 'reader_failure') AS reader_failures,
       count(*) FILTER (WHERE failure_mode = 'retrieval_failure') AS retrieval_failures,
       count(*) FILTER (WHERE failure_mode = 'unattributed') AS unattributed,
       max(ts) AS last_judgement
FROM judgements
LEFT JOIN accuracy USING (run_id)
GROUP BY run_id
ORDER BY last_judgement DESC, run_id
LIMIT $limit;
