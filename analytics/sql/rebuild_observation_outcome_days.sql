-- Rebuild observation_outcome_days from session_diagnostics: for a file written by an
-- older memdiag (the sink runs it on start when the rollup is empty and sessions are not),
-- or after a bulk load that bypassed the sink.
DELETE FROM observation_outcome_days;
INSERT INTO observation_outcome_days (org_id, day, observation_id, failed, accepted)
SELECT org_id, day, observation_id, sum(failed), sum(accepted)
FROM (
    SELECT coalesce(org_id, '') AS org_id, CAST(ts AT TIME ZONE 'UTC' AS DATE) AS day,
           unnest(injected_observation_ids) AS observation_id,
           CASE WHEN outcome = 'accepted' THEN 0 ELSE 1 END AS failed,
           CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END AS accepted
    FROM session_diagnostics
)
GROUP BY ALL;
