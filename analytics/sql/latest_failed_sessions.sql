-- The newest failed sessions (by their outcome's event time), for the report.
SELECT session_id, agent_id, outcome, failure_category, search_count, followup_count,
       len(ignored_observation_ids) AS ignored, len(misleading_observation_ids) AS misleading,
       ts
FROM session_diagnostics
WHERE outcome IN ('rejected', 'rework')
ORDER BY ts DESC, session_id
LIMIT $limit;
