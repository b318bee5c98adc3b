-- Graph entity and edge weight steps, as observations' (upsert_observation_weights.sql): one
-- history row per (entity or edge, session), rewritten when a late session recomputes it;
-- the current weight from the record of the highest owner version. `kind` is the deprecated
-- name of `graph_kind` (entity | edge): both get the topic's `graph_kind`.
INSERT INTO graph_weight_history (id, kind, graph_id, session_id, outcome, alpha,
                                  previous_weight, new_weight, aggressive, ts, outcome_event_id,
                                  step, misleading, graph_kind)
SELECT id, graph_kind, graph_id, session_id, outcome, alpha, previous_weight, weight,
       aggressive, CAST(ts AS TIMESTAMPTZ), outcome_event_id, step, misleading, graph_kind
FROM batch
ON CONFLICT (id, session_id) DO UPDATE SET
    outcome = EXCLUDED.outcome,
    alpha = EXCLUDED.alpha,
    previous_weight = EXCLUDED.previous_weight,
    new_weight = EXCLUDED.new_weight,
    aggressive = EXCLUDED.aggressive,
    ts = EXCLUDED.ts,
    outcome_event_id = EXCLUDED.outcome_event_id,
    step = EXCLUDED.step,
    misleading = EXCLUDED.misleading;

INSERT INTO graph_weights (id, kind, graph_id, weight, updated_at, step, failed_sessions,
                           accepted_sessions, misleading, version, graph_kind)
SELECT id, any_value(graph_kind), any_value(graph_id), arg_max(current_weight, version),
       arg_max(CAST(updated_at AS TIMESTAMPTZ), version), arg_max(current_step, version),
       arg_max(current_failed_sessions, version), arg_max(current_accepted_sessions, version),
       arg_max(current_misleading, version), max(version), any_value(graph_kind)
FROM batch
GROUP BY id
ON CONFLICT (id) DO UPDATE SET
    weight = EXCLUDED.weight,
    updated_at = EXCLUDED.updated_at,
    step = EXCLUDED.step,
    failed_sessions = EXCLUDED.failed_sessions,
    accepted_sessions = EXCLUDED.accepted_sessions,
    misleading = EXCLUDED.misleading,
    version = EXCLUDED.version
WHERE EXCLUDED.version > graph_weights.version;
