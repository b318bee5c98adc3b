-- Strength records: a step (one history row per (observation, session, turn), rewritten when a
-- late or corrected verdict takes the steps after it again) or a step taken back (`retracted`:
-- its row goes). Either carries the observation's state after its newest step (`current_*`):
-- the current strength is the record of the highest owner version.
DELETE FROM observation_strength_history
USING batch
WHERE batch.retracted
  AND observation_strength_history.observation_id = batch.observation_id
  AND observation_strength_history.session_id = batch.session_id
  AND observation_strength_history.turn_id = batch.turn_id;

INSERT INTO observation_strength_history (observation_id, session_id, turn_id, signal, alpha,
                                          previous_strength, strength, step, ts)
SELECT observation_id, session_id, turn_id, signal, alpha, previous_strength, strength, step,
       CAST(ts AS TIMESTAMPTZ)
FROM batch
WHERE NOT retracted
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

-- no verdict of the observation stands any more: as if it was never judged (no row), which
-- is what the same events give in order
DELETE FROM observation_strength
WHERE step = 0 AND observation_id IN (SELECT observation_id FROM batch);
