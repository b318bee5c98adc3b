-- One row per session: the diagnostic of its latest outcome (by event time; on a tie,
-- the one written last). A redelivery rewrites the same values.
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
