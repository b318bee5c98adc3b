-- One row per session: the diagnostic of its latest outcome (by event time; on a tie,
-- the one written last). A redelivery rewrites the same values. observation_outcome_days
-- follows in the same transaction: minus each replaced row, plus each written one, so a
-- redelivery adds nothing there either.
CREATE OR REPLACE TEMP TABLE _sd_replaced AS
SELECT d.org_id, d.ts, d.outcome, d.injected_observation_ids
FROM session_diagnostics d JOIN batch b USING (session_id)
WHERE CAST(b.ts AS TIMESTAMPTZ) >= d.ts;

CREATE OR REPLACE TEMP TABLE _sd_written AS
SELECT b.org_id, CAST(b.ts AS TIMESTAMPTZ) AS ts, b.outcome, b.injected_observation_ids
FROM batch b LEFT JOIN session_diagnostics d USING (session_id)
WHERE d.session_id IS NULL OR CAST(b.ts AS TIMESTAMPTZ) >= d.ts;

INSERT INTO session_diagnostics (session_id, outcome, failure_category, failure_context,
                                 injected_observation_ids, injected_graph_entity_ids,
                                 injected_graph_edge_keys, tool_call_summary, files_modified,
                                 errors_encountered, helpful_observation_ids,
                                 misleading_observation_ids, ignored_observation_ids,
                                 search_count, followup_count, ts, agent_id, org_id,
                                 project_id, event_id, ingested_at)
SELECT session_id, outcome, failure_category, failure_context, injected_observation_ids,
       injected_graph_entity_ids,
       list_transform(injected_graph_edge_keys,
                      lambda e: e.source_id || '|' || e.target_id || '|' || e.relationship),
       tool_call_summary, files_modified, errors_encountered, helpful_observation_ids,
       misleading_observation_ids, ignored_observation_ids, search_count, followup_count,
       CAST(ts AS TIMESTAMPTZ), agent_id, org_id, project_id, event_id, current_timestamp
FROM batch
ON CONFLICT (session_id) DO UPDATE SET
    outcome = EXCLUDED.outcome,
    failure_category = EXCLUDED.failure_category,
    failure_context = EXCLUDED.failure_context,
    injected_observation_ids = EXCLUDED.injected_observation_ids,
    injected_graph_entity_ids = EXCLUDED.injected_graph_entity_ids,
    injected_graph_edge_keys = EXCLUDED.injected_graph_edge_keys,
    tool_call_summary = EXCLUDED.tool_call_summary,
    files_modified = EXCLUDED.files_modified,
    errors_encountered = EXCLUDED.errors_encountered,
    helpful_observation_ids = EXCLUDED.helpful_observation_ids,
    misleading_observation_ids = EXCLUDED.misleading_observation_ids,
    ignored_observation_ids = EXCLUDED.ignored_observation_ids,
    search_count = EXCLUDED.search_count,
    followup_count = EXCLUDED.followup_count,
    ts = EXCLUDED.ts,
    agent_id = EXCLUDED.agent_id,
    org_id = EXCLUDED.org_id,
    project_id = EXCLUDED.project_id,
    event_id = EXCLUDED.event_id
WHERE EXCLUDED.ts >= session_diagnostics.ts;

INSERT INTO observation_outcome_days (org_id, day, observation_id, failed, accepted)
SELECT org_id, day, observation_id, sum(failed), sum(accepted)
FROM (
    SELECT coalesce(org_id, '') AS org_id, CAST(ts AT TIME ZONE 'UTC' AS DATE) AS day,
           unnest(injected_observation_ids) AS observation_id,
           sign * CASE WHEN outcome = 'accepted' THEN 0 ELSE 1 END AS failed,
           sign * CASE WHEN outcome = 'accepted' THEN 1 ELSE 0 END AS accepted
    FROM (SELECT *, -1 AS sign FROM _sd_replaced UNION ALL SELECT *, 1 AS sign FROM _sd_written)
)
GROUP BY ALL
HAVING sum(failed) <> 0 OR sum(accepted) <> 0
ON CONFLICT (org_id, day, observation_id) DO UPDATE SET
    failed = observation_outcome_days.failed + EXCLUDED.failed,
    accepted = observation_outcome_days.accepted + EXCLUDED.accepted;

DELETE FROM observation_outcome_days WHERE failed = 0 AND accepted = 0;
DROP TABLE _sd_replaced;
DROP TABLE _sd_written;
