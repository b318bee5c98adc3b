-- A file from before history rows were one per (observation, session): keep each pair's
-- newest row by event time (its session's last outcome), under the new key.
CREATE TABLE observation_weight_history_v2 (
    observation_id   VARCHAR NOT NULL,
    session_id       VARCHAR NOT NULL,
    outcome          VARCHAR NOT NULL,
    alpha            DOUBLE NOT NULL,
    previous_weight  DOUBLE NOT NULL,
    new_weight       DOUBLE NOT NULL,
    aggressive       BOOLEAN NOT NULL,
    ts               TIMESTAMPTZ NOT NULL,
    outcome_event_id VARCHAR NOT NULL,
    step             BIGINT NOT NULL,
    misleading       BOOLEAN NOT NULL,
    PRIMARY KEY (observation_id, session_id)
);
INSERT INTO observation_weight_history_v2
SELECT observation_id, session_id, outcome, alpha, previous_weight, new_weight, aggressive, ts,
       outcome_event_id, step, misleading
FROM observation_weight_history
QUALIFY row_number() OVER (PARTITION BY observation_id, session_id ORDER BY ts DESC, step DESC) = 1;
DROP TABLE observation_weight_history;
ALTER TABLE observation_weight_history_v2 RENAME TO observation_weight_history;
