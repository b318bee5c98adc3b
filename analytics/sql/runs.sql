-- Benchmark runs, newest first, with what makes them comparable: their judged answers (the
-- ones that count), questions, conditions, repeats, re-judged answers (answers judged more
-- than once), accuracy and mean score (every question weighs the same: the mean over
-- (condition, question) of each one's mean, conditions pooled), time span and provenance. A
-- provenance field that differs within a run lists its values (comma-separated): the run
-- mixes configurations.
WITH artifacts AS (
    SELECT run_id, count(*) AS rejudged
    FROM (SELECT run_id FROM judgement_artifacts
          GROUP BY run_id, question_id, condition, repeat_index HAVING count(*) > 1)
    GROUP BY run_id
),
per_question AS (
    SELECT run_id, avg(CASE WHEN judge_correct THEN 1.0 ELSE 0.0 END) AS share,
           avg(score) AS score
    FROM judgements
    GROUP BY run_id, condition, question_id
),
accuracy AS (
    -- avg leaves out the questions without a graded score, as the score metric does
    SELECT run_id, avg(share) AS accuracy, avg(score) AS mean_score
    FROM per_question GROUP BY run_id
)
SELECT j.run_id,
       count(*) AS judgements,
       count(DISTINCT j.question_id) AS questions,
       string_agg(DISTINCT nullif(j.condition, ''), ', ' ORDER BY nullif(j.condition, ''))
           AS conditions,
       count(DISTINCT j.repeat_index) AS repeats,
       coalesce(any_value(a.rejudged), 0) AS rejudged,
       any_value(q.accuracy) AS accuracy,
       any_value(q.mean_score) AS mean_score,
       min(j.ts) AS first_at,
       max(j.ts) AS last_at,
       string_agg(DISTINCT j.run_group_id, ', ' ORDER BY j.run_group_id) AS run_group_id,
       string_agg(DISTINCT j.suite_id, ', ' ORDER BY j.suite_id) AS suite_id,
       string_agg(DISTINCT j.suite_version, ', ' ORDER BY j.suite_version) AS suite_version,
       string_agg(DISTINCT j.suite_checksum, ', ' ORDER BY j.suite_checksum) AS suite_checksum,
       string_agg(DISTINCT j.fixture_checksum, ', ' ORDER BY j.fixture_checksum) AS fixture_checksum,
       string_agg(DISTINCT j.config_fingerprint, ', ' ORDER BY j.config_fingerprint) AS config_fingerprint,
       string_agg(DISTINCT j.git_head, ', ' ORDER BY j.git_head) AS git_head,
       string_agg(DISTINCT j.service_version, ', ' ORDER BY j.service_version) AS service_version,
       max(j.duration_ms) AS duration_ms,
       count(*) OVER () AS total
FROM judgements j
LEFT JOIN artifacts a USING (run_id)
LEFT JOIN accuracy q USING (run_id)
GROUP BY j.run_id
ORDER BY last_at DESC, j.run_id
LIMIT $limit;
