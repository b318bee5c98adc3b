-- memdiag's DuckDB schema (CONTRACT section 5). Idempotent: run on every sink start.
-- Natural keys are primary keys, so every write is an upsert and a replay changes nothing.

CREATE TABLE IF NOT EXISTS searches (
    event_id      VARCHAR PRIMARY KEY,
    session_id    VARCHAR NOT NULL,
    ts            TIMESTAMPTZ NOT NULL,
    source        VARCHAR NOT NULL,      -- agent | viewer
    result_count  INTEGER NOT NULL,
    evaluated     BOOLEAN NOT NULL,      -- agent search with results: judged by the followup rule
    is_followup   BOOLEAN NOT NULL,
    prev_event_id VARCHAR,               -- the remembered search it was judged against
    gap_seconds   DOUBLE,                -- ts - prev.ts
    agent_id      VARCHAR,
    org_id        VARCHAR,
    project_id    VARCHAR,
    query         VARCHAR,               -- only with MEMDIAG_STORE_TEXT=1
    published_at  TIMESTAMPTZ,           -- Kafka timestamp of the input message
    ingested_at   TIMESTAMPTZ            -- when the sink first wrote the row (wall clock)
);

CREATE TABLE IF NOT EXISTS dead_letters (
    dead_letter_id    VARCHAR PRIMARY KEY, -- sha256 of source topic and payload: a replay is one row
    topic             VARCHAR NOT NULL,
    "partition"       INTEGER,
    "offset"          BIGINT,
    batch_index       INTEGER,             -- position in a batch message; 0 for a single event
    key               VARCHAR,
    reason            VARCHAR NOT NULL,
    detail            VARCHAR NOT NULL,
    payload           VARCHAR,             -- the bad event (first MEMDIAG_DEADLETTER_PAYLOAD_BYTES)
    payload_bytes     BIGINT,
    payload_truncated BOOLEAN,
    ts                TIMESTAMPTZ          -- when the message was published (broker time)
);

CREATE OR REPLACE VIEW followup_rate AS
SELECT
    count(*) FILTER (WHERE source = 'agent') AS agent_searches,
    count(*) FILTER (WHERE is_followup) AS followups,
    CASE WHEN count(*) FILTER (WHERE source = 'agent') = 0 THEN NULL
         ELSE (count(*) FILTER (WHERE is_followup))::DOUBLE
              / count(*) FILTER (WHERE source = 'agent') END AS rate
FROM searches;
