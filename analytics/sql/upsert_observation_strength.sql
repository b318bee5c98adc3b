-- Strength steps: one history row per (observation, session, turn), rewritten when a late or
-- corrected verdict takes the steps after it again; the current strength from the record of
-- the highest owner version (every record carries the observation's state after its newest
-- step, `current_*`).
INSERT INTO observation_strength_history (observation_id, session_id, turn_id, signal, alpha,
                                          previous_strength, strength, step, ts)
SELECT observation_id, session_id, turn_id, signal, alpha, previous_strength, strength, step,
       CAST(ts AS TIMESTAMPTZ)
FROM batch
ON CONFLICT (observation_id, session_id, turn_id) DO UPDATE SET
    signal = EXCLUDED.signal,
    alpha = EXCLUDED.alpha,
    previous_strength = EXCLUDED.previous_strength,
    strength = EXCLUDED.strength,
    step = EXCLUDED.step,
    ts = EXCLUDED.ts;

INSERT INTO observation_strength (observation_id, strength, updated_at, step, used_turns,
                                  version)
SELECT observation_id, arg_max(current_strength, version),
       arg_max_null(CAST(updated_at AS TIMESTAMPTZ), version), arg_max(current_step, version),
       arg_max(current_used_turns, version), max(version)
FROM batch
GROUP BY observation_id
ON CONFLICT (observation_id) DO UPDATE SET
    strength = EXCLUDED.strength,
    updated_at = EXCLUDED.updated_at,
    step = EXCLUDED.step,
    used_turns = EXCLUDED.used_turns,
    version = EXCLUDED.version
WHERE EXCLUDED.version > observation_strength.version;
