-- One session's diagnostic (its last outcome by event time), as the worker wrote it.
SELECT session_id, outcome, failure_category, failure_context, injected_observation_ids,
       injected_graph_entity_ids, injected_graph_edge_keys, tool_call_summary,
       files_modified, errors_encountered, helpful_observation_ids,
       misleading_observation_ids, ignored_observation_ids, search_count, followup_count,
       ts, agent_id, org_id, project_id, event_id
FROM session_diagnostics
WHERE session_id = $session_id;
