-- Weight steps: every one into the history, the newest (highest step) as the current weight.
-- A redelivered or older step leaves the current weight alone.
INSERT INTO observation_weight_history (observation_id, session_id, outcome, alpha,
                                        previous_weight, new_weight, aggressive, ts,
                                        outcome_event_id, step, misleading)
SELECT observation_id, session_id, outcome, alpha, previous_weight, weight, aggressive,
       CAST(ts AS TIMESTAMPTZ), outcome_event_id, step, misleading
FROM batch
ON CONFLICT (observation_id, session_id, outcome_event_id) DO UPDATE SET
    outcome = EXCLUDED.outcome,
    alpha = EXCLUDED.alpha,
    previous_weight = EXCLUDED.previous_weight,
    new_weight = EXCLUDED.new_weight,
    aggressive = EXCLUDED.aggressive,
    ts = EXCLUDED.ts,
    step = EXCLUDED.step,
    misleading = EXCLUDED.misleading;

INSERT INTO observation_weights (observation_id, weight, updated_at, step, failed_sessions,
                                 accepted_sessions, misleading)
SELECT observation_id, arg_max(weight, step), arg_max(CAST(ts AS TIMESTAMPTZ), step),
       max(step), arg_max(failed_sessions, step), arg_max(accepted_sessions, step),
       arg_max(misleading, step)
FROM batch
GROUP BY observation_id
ON CONFLICT (observation_id) DO UPDATE SET
    weight = EXCLUDED.weight,
    updated_at = EXCLUDED.updated_at,
    step = EXCLUDED.step,
    failed_sessions = EXCLUDED.failed_sessions,
    accepted_sessions = EXCLUDED.accepted_sessions,
    misleading = EXCLUDED.misleading
WHERE EXCLUDED.step > observation_weights.step;
