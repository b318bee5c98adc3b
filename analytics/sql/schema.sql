-- memdiag's DuckDB schema (docs/tables.md). Idempotent: run on every sink start.
-- Natural keys are primary keys, so every write is an upsert and a replay changes nothing.

-- One row per search event, keyed by its session and its id: a producer that numbers each
-- session's events from 1 gives two sessions' searches one id, and both are searches.
CREATE TABLE IF NOT EXISTS searches (
    event_id      VARCHAR NOT NULL,
    session_id    VARCHAR NOT NULL,
    ts            TIMESTAMPTZ NOT NULL,
    source        VARCHAR NOT NULL,      -- agent | viewer
    result_count  INTEGER NOT NULL,
    evaluated     BOOLEAN NOT NULL,      -- agent search with results: judged by the followup rule
    is_followup   BOOLEAN NOT NULL,
    prev_event_id VARCHAR,               -- the remembered search it was judged against
    gap_seconds   DOUBLE,                -- ts - prev.ts
    disjoint_new_query BOOLEAN,          -- prev exists, other query, no shared result id:
                                         -- is_followup = this AND gap_seconds <= window
    agent_id      VARCHAR,
    org_id        VARCHAR,
    project_id    VARCHAR,
    query         VARCHAR,               -- only with MEMDIAG_STORE_TEXT=1
    published_at  TIMESTAMPTZ,           -- Kafka timestamp of the input message
    ingested_at   TIMESTAMPTZ,           -- when the sink first wrote the row (wall clock)
    PRIMARY KEY (session_id, event_id)
);
-- Files from before memdiag calibrate: the column is NULL on their older rows.
ALTER TABLE searches ADD COLUMN IF NOT EXISTS disjoint_new_query BOOLEAN;

CREATE TABLE IF NOT EXISTS dead_letters (
    dead_letter_id    VARCHAR PRIMARY KEY, -- sha256 of source topic and where in it: a replay is one row
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
    ts                TIMESTAMPTZ,         -- when the message was published (broker time)
    session_id        VARCHAR              -- its session: the payload's, else the key on events
);
-- memdiag explain: a session's dead letters, found by the index, not by a scan
CREATE INDEX IF NOT EXISTS dead_letters_by_session ON dead_letters (session_id);

CREATE OR REPLACE VIEW followup_rate AS
SELECT
    count(*) FILTER (WHERE source = 'agent') AS agent_searches,
    count(*) FILTER (WHERE is_followup) AS followups,
    CASE WHEN count(*) FILTER (WHERE source = 'agent') = 0 THEN NULL
         ELSE (count(*) FILTER (WHERE is_followup))::DOUBLE
              / count(*) FILTER (WHERE source = 'agent') END AS rate
FROM searches;

-- One row per (session, turn, injected observation): the used/ignored verdict.
CREATE TABLE IF NOT EXISTS retrieval_feedback (
    session_id     VARCHAR NOT NULL,
    turn_id        VARCHAR NOT NULL,
    observation_id VARCHAR NOT NULL,
    signal         VARCHAR NOT NULL,      -- used | ignored
    match_ratio    DOUBLE NOT NULL,       -- matched_count / keyword_count (0 without keywords)
    keyword_count  INTEGER NOT NULL,      -- distinct normalised words > 4 chars of the content
    matched_count  INTEGER NOT NULL,      -- of those, also words of the response
    ts             TIMESTAMPTZ NOT NULL,  -- event time of the join: the later of the two halves
    agent_id       VARCHAR,
    org_id         VARCHAR,
    project_id     VARCHAR,
    ingested_at    TIMESTAMPTZ,
    PRIMARY KEY (session_id, turn_id, observation_id)
);
-- MEMDIAG_DETECTOR=semantic (contract section 3): the similarity of memory and response, and
-- the rule that made the verdict (rows from before these columns were keyword verdicts).
ALTER TABLE retrieval_feedback ADD COLUMN IF NOT EXISTS similarity DOUBLE;  -- NULL: keyword
ALTER TABLE retrieval_feedback ADD COLUMN IF NOT EXISTS detector VARCHAR DEFAULT 'keyword';

-- One row per session: the diagnostic of its (last) outcome. Id lists are VARCHAR[];
-- an edge key is 'source_id|target_id|relationship'.
CREATE TABLE IF NOT EXISTS session_diagnostics (
    session_id                 VARCHAR PRIMARY KEY,
    outcome                    VARCHAR NOT NULL,   -- accepted | rejected | rework
    failure_category           VARCHAR,            -- NULL for accepted sessions
    failure_context            VARCHAR,            -- the outcome's failure_context, as JSON text
    injected_observation_ids   VARCHAR[] NOT NULL, -- distinct, first-seen order
    injected_graph_entity_ids  VARCHAR[] NOT NULL,
    injected_graph_edge_keys   VARCHAR[] NOT NULL,
    tool_call_summary          STRUCT(tool VARCHAR, file VARCHAR, success BOOLEAN)[], -- NULL if accepted
    files_modified             VARCHAR[],                                             -- NULL if accepted
    errors_encountered         STRUCT(message VARCHAR, tool VARCHAR, recoverable BOOLEAN)[], -- NULL if accepted
    helpful_observation_ids    VARCHAR[] NOT NULL,
    misleading_observation_ids VARCHAR[] NOT NULL, -- misleading once this session is counted
    ignored_observation_ids    VARCHAR[] NOT NULL, -- ignored in every evaluated turn (>= 1)
    search_count               INTEGER NOT NULL,   -- agent searches of the session
    followup_count             INTEGER NOT NULL,
    ts                         TIMESTAMPTZ NOT NULL, -- event time of the outcome
    agent_id                   VARCHAR,
    org_id                     VARCHAR,
    project_id                 VARCHAR,
    event_id                   VARCHAR NOT NULL,   -- the session_outcome event
    ingested_at                TIMESTAMPTZ
);

-- One row per judged answer of a benchmark run (the latest judgement of each, by event time).
CREATE TABLE IF NOT EXISTS judgements (
    run_id                VARCHAR NOT NULL,
    question_id           VARCHAR NOT NULL,
    condition             VARCHAR NOT NULL,   -- '' when the judgement names none
    repeat_index          INTEGER NOT NULL,
    judge_correct         BOOLEAN NOT NULL,
    failure_mode          VARCHAR,            -- reader_failure | retrieval_failure | unattributed; NULL if correct
    gold_evidence_ids     VARCHAR[] NOT NULL,
    retrieved_context_ids VARCHAR[] NOT NULL,
    ts                    TIMESTAMPTZ NOT NULL,
    gold_retrieved        INTEGER NOT NULL,   -- gold ids that were in the context
    latency_ms            DOUBLE,
    tokens                BIGINT,
    event_id              VARCHAR NOT NULL,
    ingested_at           TIMESTAMPTZ,
    PRIMARY KEY (run_id, question_id, condition, repeat_index)
);
-- Every judgement ever received, once per event: immutable artifacts (contract section 2).
-- `judgements` is the one that counts per answer; this keeps re-judged ones too.
-- Keyed by the run and the judgement's id: ids a harness numbers per run are two runs' own.
CREATE TABLE IF NOT EXISTS judgement_artifacts (
    event_id              VARCHAR NOT NULL,
    run_id                VARCHAR NOT NULL,
    question_id           VARCHAR NOT NULL,
    condition             VARCHAR NOT NULL,
    repeat_index          INTEGER NOT NULL,
    judge_correct         BOOLEAN NOT NULL,
    failure_mode          VARCHAR,
    gold_evidence_ids     VARCHAR[] NOT NULL,
    retrieved_context_ids VARCHAR[] NOT NULL,
    ts                    TIMESTAMPTZ NOT NULL,
    gold_retrieved        INTEGER NOT NULL,
    latency_ms            DOUBLE,
    tokens                BIGINT,
    ingested_at           TIMESTAMPTZ,
    input_tokens          BIGINT,
    output_tokens         BIGINT,
    score                 DOUBLE,
    duration_ms           DOUBLE,
    run_group_id          VARCHAR,
    suite_id              VARCHAR,
    suite_version         VARCHAR,
    suite_checksum        VARCHAR,
    fixture_checksum      VARCHAR,
    config_fingerprint    VARCHAR,
    git_head              VARCHAR,
    service_version       VARCHAR,
    PRIMARY KEY (run_id, event_id)
);

-- The graded score, the token split and the run's provenance (contract section 2): NULL where
-- the judgement did not give them (and on rows written before memdiag read them).
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS input_tokens BIGINT;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS output_tokens BIGINT;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS score DOUBLE;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS duration_ms DOUBLE;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS run_group_id VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS suite_id VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS suite_version VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS suite_checksum VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS fixture_checksum VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS config_fingerprint VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS git_head VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS service_version VARCHAR;
-- Hygiene (contract section 2): whether a person reviewed the gold label, and the split.
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS label_status VARCHAR;
ALTER TABLE judgements ADD COLUMN IF NOT EXISTS split VARCHAR;
ALTER TABLE judgement_artifacts ADD COLUMN IF NOT EXISTS label_status VARCHAR;
ALTER TABLE judgement_artifacts ADD COLUMN IF NOT EXISTS split VARCHAR;

-- The current weight of each observation (the memory system gets the same on `weights`).
CREATE TABLE IF NOT EXISTS observation_weights (
    observation_id    VARCHAR PRIMARY KEY,
    weight            DOUBLE NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL, -- event time of the outcome of the newest step
    step              BIGINT NOT NULL,      -- steps taken (sessions counted)
    failed_sessions   INTEGER NOT NULL,
    accepted_sessions INTEGER NOT NULL,
    misleading        BOOLEAN NOT NULL,
    version           BIGINT NOT NULL DEFAULT 0 -- the owner's version: a row only moves forward
);
ALTER TABLE observation_weights ADD COLUMN IF NOT EXISTS version BIGINT DEFAULT 0;

-- The current strength of each observation: an EMA of its used/ignored verdicts, one step
-- per judged turn in turn order (the memory system gets the same on `weights`, kind
-- `strength`). Not the outcome weight: see docs/rules.md, "Strength".
CREATE TABLE IF NOT EXISTS observation_strength (
    observation_id VARCHAR PRIMARY KEY,
    strength       DOUBLE NOT NULL,
    updated_at     TIMESTAMPTZ,          -- the newest step's turn time (NULL: none kept)
    step           BIGINT NOT NULL,      -- verdicts counted (judged turns)
    used_turns     BIGINT NOT NULL,      -- of which used
    version        BIGINT NOT NULL       -- the owner's version: a row only moves forward
);

-- Every strength step: one per (observation, session, turn). A late or corrected verdict
-- takes the steps after it again: their rows are rewritten in place; one taken back goes.
CREATE TABLE IF NOT EXISTS observation_strength_history (
    observation_id    VARCHAR NOT NULL,
    session_id        VARCHAR NOT NULL,
    turn_id           VARCHAR NOT NULL,
    signal            VARCHAR NOT NULL,     -- used | ignored
    alpha             DOUBLE NOT NULL,      -- MEMDIAG_ALPHA_USED or MEMDIAG_ALPHA_IGNORED
    previous_strength DOUBLE NOT NULL,
    strength          DOUBLE NOT NULL,
    step              BIGINT NOT NULL,      -- its place in the observation's turn order
    ts                TIMESTAMPTZ NOT NULL, -- the turn's time (the later of its two halves)
    PRIMARY KEY (observation_id, session_id, turn_id)
);

-- Every EMA step: one per (observation, session), from the session's last outcome. A late
-- session recomputes the steps after it: their rows are rewritten in place.
CREATE TABLE IF NOT EXISTS observation_weight_history (
    observation_id   VARCHAR NOT NULL,
    session_id       VARCHAR NOT NULL,
    outcome          VARCHAR NOT NULL,
    alpha            DOUBLE NOT NULL,
    previous_weight  DOUBLE NOT NULL,
    new_weight       DOUBLE NOT NULL,
    aggressive       BOOLEAN NOT NULL,   -- alpha doubled: misleading after this session
    ts               TIMESTAMPTZ NOT NULL, -- event time of the session's (last) outcome
    outcome_event_id VARCHAR NOT NULL,
    step             BIGINT NOT NULL,    -- its place in the observation's outcome order
    misleading       BOOLEAN NOT NULL,
    PRIMARY KEY (observation_id, session_id)
);

CREATE OR REPLACE VIEW observation_feedback_stats AS
SELECT observation_id,
       count(*) FILTER (WHERE signal = 'used') AS used,
       count(*) FILTER (WHERE signal = 'ignored') AS ignored
FROM retrieval_feedback
GROUP BY observation_id;

-- Failed sessions per category, every category listed (zeros included).
CREATE OR REPLACE MACRO failure_category_distribution(org_id := NULL, project_id := NULL, since := NULL) AS TABLE
WITH categories(failure_category, ord) AS (
    VALUES ('test_failure', 1), ('style', 2), ('regression', 3), ('incomplete', 4),
           ('wrong_approach', 5), ('other', 6), ('unknown', 7)
),
failed AS (
    SELECT CASE WHEN d.failure_category IN ('test_failure', 'style', 'regression',
                     'incomplete', 'wrong_approach', 'other')
                THEN d.failure_category ELSE 'unknown' END AS failure_category
    FROM session_diagnostics d
    WHERE d.outcome IN ('rejected', 'rework')
      AND (org_id IS NULL OR d.org_id = org_id)
      AND (project_id IS NULL OR d.project_id = project_id)
      AND (since IS NULL OR d.ts >= CAST(since AS TIMESTAMPTZ))
),
counted AS (SELECT failure_category, count(*) AS sessions FROM failed GROUP BY ALL)
SELECT c.failure_category, coalesce(n.sessions, 0)::BIGINT AS sessions
FROM categories c LEFT JOIN counted n USING (failure_category)
ORDER BY c.ord;

-- Graph feedback: every injected graph entity and edge takes the outcome step an observation
-- takes (the memory system gets the same on `graph_weights`). `id` is the topic's key:
-- `entity:ID` or `edge:SOURCE|TARGET|RELATIONSHIP`; `graph_kind` the part before the colon,
-- `graph_id` the part after it (docs/memory-system.md, "Names").
CREATE TABLE IF NOT EXISTS graph_weights (
    id                VARCHAR PRIMARY KEY,
    kind              VARCHAR NOT NULL,     -- deprecated: the same as graph_kind
    graph_id          VARCHAR NOT NULL,     -- the entity id, or SOURCE|TARGET|RELATIONSHIP
    weight            DOUBLE NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL,
    step              BIGINT NOT NULL,
    failed_sessions   INTEGER NOT NULL,
    accepted_sessions INTEGER NOT NULL,
    misleading        BOOLEAN NOT NULL,
    version           BIGINT NOT NULL,
    graph_kind        VARCHAR               -- entity | edge, as the topic's field names it
);

CREATE TABLE IF NOT EXISTS graph_weight_history (
    id               VARCHAR NOT NULL,
    kind             VARCHAR NOT NULL,  -- deprecated: the same as graph_kind
    graph_id         VARCHAR NOT NULL,
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
    graph_kind       VARCHAR,           -- entity | edge (`kind`: the same, deprecated)
    PRIMARY KEY (id, session_id)
);
-- Files from before `graph_kind` (the name memdiag.graph_weights gives entity | edge; the
-- topic's `kind` is the message kind): the column, filled from `kind`, last in both tables.
ALTER TABLE graph_weights ADD COLUMN IF NOT EXISTS graph_kind VARCHAR;
ALTER TABLE graph_weight_history ADD COLUMN IF NOT EXISTS graph_kind VARCHAR;
UPDATE graph_weights SET graph_kind = kind WHERE graph_kind IS NULL;
UPDATE graph_weight_history SET graph_kind = kind WHERE graph_kind IS NULL;

-- Graph entities (edges) seen in >= 3 failed sessions and no accepted one, over the sessions
-- selected, as misleading_observations. One column `id`: the entity id, or the edge as
-- SOURCE|TARGET|RELATIONSHIP. Unnests session_diagnostics (no daily rollup: graph ids are few
-- per session; on 10 million sessions, expect seconds, not tenths).
CREATE OR REPLACE MACRO misleading_graph_entities(org_id := NULL, since := NULL) AS TABLE
SELECT id
FROM (
    SELECT unnest(d.injected_graph_entity_ids) AS id, d.outcome
    FROM session_diagnostics d
    WHERE (org_id IS NULL OR d.org_id = org_id)
      AND (since IS NULL OR d.ts >= CAST(since AS TIMESTAMPTZ))
)
GROUP BY id
HAVING count(*) FILTER (WHERE outcome <> 'accepted') >= 3
   AND count(*) FILTER (WHERE outcome = 'accepted') = 0
ORDER BY count(*) DESC, id;

CREATE OR REPLACE MACRO misleading_graph_edges(org_id := NULL, since := NULL) AS TABLE
SELECT id
FROM (
    SELECT unnest(d.injected_graph_edge_keys) AS id, d.outcome
    FROM session_diagnostics d
    WHERE (org_id IS NULL OR d.org_id = org_id)
      AND (since IS NULL OR d.ts >= CAST(since AS TIMESTAMPTZ))
)
GROUP BY id
HAVING count(*) FILTER (WHERE outcome <> 'accepted') >= 3
   AND count(*) FILTER (WHERE outcome = 'accepted') = 0
ORDER BY count(*) DESC, id;

-- Per (org, UTC day, observation): sessions that injected it, failed and accepted. Kept
-- by the sink in the same transaction as session_diagnostics (see
-- upsert_session_diagnostics.sql), so misleading_observations need not unnest every
-- session's id list: 10 million sessions hold about 100 million (session, observation) pairs.
CREATE TABLE IF NOT EXISTS observation_outcome_days (
    org_id         VARCHAR NOT NULL,  -- '' for sessions without an org
    day            DATE NOT NULL,     -- UTC day of the outcome
    observation_id VARCHAR NOT NULL,
    failed         BIGINT NOT NULL,
    accepted       BIGINT NOT NULL,
    PRIMARY KEY (org_id, day, observation_id)
);

-- Observations seen in >= 3 failed sessions and no accepted one (over the sessions selected).
-- Whole UTC days come from observation_outcome_days; when `since` falls inside a day, the
-- rest of that day is counted from session_diagnostics itself.
CREATE OR REPLACE MACRO misleading_observations(org_id := NULL, since := NULL) AS TABLE
WITH bound AS (
    SELECT CAST(since AS TIMESTAMPTZ) AS since_ts,
           CAST(CAST(since AS TIMESTAMPTZ) AT TIME ZONE 'UTC' AS DATE) AS since_day,
           CAST(CAST(since AS TIMESTAMPTZ) AT TIME ZONE 'UTC' AS DATE)
             + CASE WHEN CAST(CAST(since AS TIMESTAMPTZ) AT TIME ZONE 'UTC' AS TIME) = TIME '00:00:00'
                    THEN 0 ELSE 1 END AS first_full_day
),
counted AS (
    SELECT r.observation_id, r.failed, r.accepted
    FROM observation_outcome_days r, bound b
    WHERE (org_id IS NULL OR r.org_id = org_id)
      AND (since IS NULL OR r.day >= b.first_full_day)
    UNION ALL
    SELECT unnest(d.injected_observation_ids) AS observation_id,
           CASE WHEN d.outcome = 'accepted' THEN 0 ELSE 1 END AS failed,
           CASE WHEN d.outcome = 'accepted' THEN 1 ELSE 0 END AS accepted
    FROM session_diagnostics d, bound b
    WHERE since IS NOT NULL AND b.first_full_day > b.since_day
      AND d.ts >= b.since_ts
      AND d.ts < CAST(b.first_full_day AS TIMESTAMP) AT TIME ZONE 'UTC'
      AND (org_id IS NULL OR d.org_id = org_id)
)
SELECT observation_id,
       sum(failed)::BIGINT AS fail_count,
       sum(accepted)::BIGINT AS success_count
FROM counted
GROUP BY observation_id
HAVING sum(failed) >= 3 AND sum(accepted) = 0
ORDER BY fail_count DESC, observation_id;

-- Recall pipeline health (docs/rules.md, "Recall pipeline health"): written, indexed,
-- recalled. One row per (agent, memory) a memory_written or memory_indexed event named.
CREATE TABLE IF NOT EXISTS memory_pipeline (
    agent_id            VARCHAR NOT NULL,
    memory_id           VARCHAR NOT NULL,
    name                VARCHAR,              -- of its first write in event time
    written_at          TIMESTAMPTZ,          -- first memory_written; NULL: none came (yet)
    indexed_at          TIMESTAMPTZ,          -- first memory_indexed, whatever the store
    status              VARCHAR NOT NULL,     -- indexed | pending | unindexed | not_written
    store               VARCHAR,              -- where it was written
    indexed_store       VARCHAR,              -- where it was first indexed
    index_delay_seconds DOUBLE,               -- indexed_at - written_at, whole milliseconds
    ever_unindexed      BOOLEAN,              -- past the deadline unindexed at some point
    write_event_id      VARCHAR,
    index_event_id      VARCHAR,
    updated_at          TIMESTAMPTZ,          -- when the sink last wrote the row (wall clock)
    PRIMARY KEY (agent_id, memory_id)
);

-- One row per recall_probe event; each memory's latest name probe (ts, then event_id) is its
-- SRR verdict.
-- (Named recall_probes before miss_reason: db.init_schema renames an older file's table.)
CREATE TABLE IF NOT EXISTS recall_probe_events (
    agent_id     VARCHAR NOT NULL,
    memory_id    VARCHAR NOT NULL,             -- the memory the probe's query was made from
    hit          BOOLEAN NOT NULL,             -- in the first k with score >= threshold
    rank         INTEGER,                      -- 1-based position in the results; NULL: absent
    ts           TIMESTAMPTZ NOT NULL,
    event_id     VARCHAR NOT NULL,             -- unique within its agent
    score        DOUBLE,                       -- its score, when the probe gave scores
    k            INTEGER,
    threshold    DOUBLE,
    result_count INTEGER,
    ingested_at  TIMESTAMPTZ,
    PRIMARY KEY (agent_id, event_id)
);
ALTER TABLE recall_probe_events ADD COLUMN IF NOT EXISTS top_ids VARCHAR[];  -- the first k results
-- Where the probe's query came from (contract section 9): `name` (made from the memory's name:
-- what SRR and the miss reasons count) or `task` (from the text of a task it should serve). A
-- file's rows from before the column were name probes: the default fills them.
ALTER TABLE recall_probe_events ADD COLUMN IF NOT EXISTS query_source VARCHAR DEFAULT 'name';

-- A memory name's key for aliasing (contract section 9): lowercased, every character that is
-- not a (Unicode) letter removed: `daily-2026-11-01.md` and `daily-2026-11-02.md` share `dailymd`.
-- The final sigma is folded into sigma (lowercasing may give either, by position).
CREATE OR REPLACE MACRO name_key(name) AS
    regexp_replace(replace(lower(name), 'ς', 'σ'), '[^\p{L}]', '', 'g');

-- A memory name's tokens: the lowercased maximal runs of (Unicode) letters or of decimal digits,
-- as a set: `proving-loop-medqa-023.md` is {proving, loop, medqa, 023, md}. The final sigma as
-- in name_key.
CREATE OR REPLACE MACRO name_tokens(name) AS
    list_distinct(list_transform(regexp_extract_all(coalesce(name, ''), '\p{L}+|\p{Nd}+'),
                                 lambda t: replace(lower(t), 'ς', 'σ')));

-- Two names are look-alikes (contract section 9) when they share a non-empty name key, or when
-- their token sets overlap by half or more (|A ∩ B| / |A ∪ B| >= 0.5, in whole numbers: 2|A ∩ B|
-- >= |A ∪ B|): `proving-loop-medqa-023.md` and `proving-medqa-023.md` (4 of 5). An empty key or
-- no token never aliases. Symmetric, and a name with a token is a look-alike of itself.
CREATE OR REPLACE MACRO look_alike(a, b) AS
    coalesce((name_key(a) <> '' AND name_key(a) = name_key(b))
             OR (len(name_tokens(a)) > 0
                 AND 2 * len(list_intersect(name_tokens(a), name_tokens(b)))
                     >= len(list_distinct(list_concat(name_tokens(a), name_tokens(b))))),
             false);

-- Each probe with why it missed: the first that holds of not_indexed (no memory_indexed of the
-- target at or before the probe), below_threshold (in the first k, scored below the
-- threshold), aliased (one of the first k results is a look-alike of the target: look_alike
-- of their names), outranked; NULL for a hit, and for a task probe (the reasons are the name
-- probes': contract section 9; a task probe's miss is the query-formulation gap,
-- recall_by_query_source). A view over the memories as they stand, so a late write or index
-- event changes the reason by itself.
CREATE OR REPLACE VIEW recall_probes AS
WITH aliased AS (
    -- missed name probes with a look-alike among their first k: each result id looked up by name
    SELECT r.agent_id, r.event_id
    FROM (SELECT p.event_id, p.agent_id, p.memory_id, t.name,
                 unnest(p.top_ids[1:coalesce(p.k, 3)]) AS other
          FROM recall_probe_events p
          JOIN memory_pipeline t ON t.agent_id = p.agent_id AND t.memory_id = p.memory_id
          WHERE NOT p.hit AND p.query_source = 'name' AND t.name IS NOT NULL) AS r
    JOIN memory_pipeline o
      ON o.agent_id = r.agent_id AND o.memory_id = r.other AND look_alike(r.name, o.name)
    WHERE r.other <> r.memory_id
    GROUP BY r.agent_id, r.event_id
)
SELECT p.agent_id, p.memory_id, p.hit, p.rank,
       CASE
           WHEN p.hit OR p.query_source <> 'name' THEN NULL
           WHEN t.indexed_at IS NULL OR t.indexed_at > p.ts THEN 'not_indexed'
           WHEN p.rank IS NOT NULL AND p.rank <= coalesce(p.k, 3) THEN 'below_threshold'
           WHEN a.event_id IS NOT NULL THEN 'aliased'
           ELSE 'outranked'
       END AS miss_reason,
       p.ts, p.event_id, p.score, p.k, p.threshold, p.result_count, p.top_ids, p.ingested_at,
       p.query_source
FROM recall_probe_events p
LEFT JOIN memory_pipeline t ON t.agent_id = p.agent_id AND t.memory_id = p.memory_id
LEFT JOIN aliased a ON a.agent_id = p.agent_id AND a.event_id = p.event_id;

-- One row per ambient_context event: what was injected as ambient cues, and when (the latest
-- one is also pipeline_agents'; the trends read them all).
CREATE TABLE IF NOT EXISTS ambient_contexts (
    event_id    VARCHAR NOT NULL,              -- unique within its agent
    agent_id    VARCHAR NOT NULL,
    session_id  VARCHAR,
    memory_ids  VARCHAR[],
    ts          TIMESTAMPTZ NOT NULL,
    ingested_at TIMESTAMPTZ,
    PRIMARY KEY (agent_id, event_id)
);

-- One row per agent: what its memories' rows do not say.
CREATE TABLE IF NOT EXISTS pipeline_agents (
    agent_id           VARCHAR PRIMARY KEY,
    clock              TIMESTAMPTZ,            -- newest ts of the agent's memory events
    last_indexed_at    TIMESTAMPTZ,            -- newest memory_indexed, of any memory
    ambient_at         TIMESTAMPTZ,            -- the latest ambient_context
    ambient_session_id VARCHAR,
    ambient_memory_ids VARCHAR[],
    broken_since       TIMESTAMPTZ,            -- the break holds: the oldest unindexed write
    deadline_seconds   DOUBLE,                 -- MEMDIAG_INDEX_DEADLINE_SECONDS it ran with
    updated_at         TIMESTAMPTZ
);

-- One row per break episode the worker raised (pipeline_break), closed by its
-- pipeline_recovered. The live record of the alerts; pipeline_agents.broken_since is the
-- break as the events say.
CREATE TABLE IF NOT EXISTS pipeline_breaks (
    agent_id         VARCHAR NOT NULL,
    episode          INTEGER NOT NULL,          -- the agent's n-th break
    since            TIMESTAMPTZ NOT NULL,     -- written_at of the oldest unindexed memory
    broken_at        TIMESTAMPTZ,              -- the agent's clock when it was raised
    recovered_at     TIMESTAMPTZ,              -- the agent's clock when it stopped holding
    oldest_memory_id VARCHAR,
    unindexed        INTEGER,                  -- unindexed memories when raised
    PRIMARY KEY (agent_id, episode)
);

CREATE OR REPLACE VIEW pipeline_health AS
WITH memories AS (
    SELECT agent_id,
           count(*) FILTER (WHERE written_at IS NOT NULL) AS written,
           count(*) FILTER (WHERE status = 'indexed') AS indexed,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'unindexed') AS unindexed,
           max(written_at) AS last_written_at,
           max(indexed_at) AS last_memory_indexed_at
    FROM memory_pipeline
    GROUP BY agent_id
),
-- SRR and the miss reasons count name probes only (contract section 9): each memory's latest
latest_probes AS (
    SELECT agent_id, hit
    FROM recall_probe_events
    WHERE query_source = 'name'
    QUALIFY row_number() OVER (PARTITION BY agent_id, memory_id ORDER BY ts DESC, event_id DESC) = 1
),
probes AS (
    SELECT agent_id, count(*) AS probed, count(*) FILTER (WHERE hit) AS hits
    FROM latest_probes
    GROUP BY agent_id
),
-- each probed memory's latest probe, by why it missed: with the hits they make up `probed`
latest_reasons AS (
    SELECT agent_id, miss_reason
    FROM recall_probes
    WHERE query_source = 'name'
    QUALIFY row_number() OVER (PARTITION BY agent_id, memory_id ORDER BY ts DESC, event_id DESC) = 1
),
misses AS (
    SELECT agent_id,
           count(*) FILTER (WHERE miss_reason = 'not_indexed') AS not_indexed_misses,
           count(*) FILTER (WHERE miss_reason = 'below_threshold') AS below_threshold_misses,
           count(*) FILTER (WHERE miss_reason = 'aliased') AS aliased_misses,
           count(*) FILTER (WHERE miss_reason = 'outranked') AS outranked_misses
    FROM latest_reasons
    GROUP BY agent_id
),
ambient AS (
    SELECT a.agent_id, count(DISTINCT m.memory_id) AS in_ambient
    FROM (SELECT agent_id, unnest(ambient_memory_ids) AS memory_id FROM pipeline_agents) AS a
    JOIN memory_pipeline m
      ON m.agent_id = a.agent_id AND m.memory_id = a.memory_id AND m.written_at IS NOT NULL
    GROUP BY a.agent_id
),
-- written memories past the deadline unindexed and not in the latest ambient context: no
-- path brings them back (a pending one may still be indexed)
unreachable AS (
    SELECT m.agent_id, count(*) AS unreachable
    FROM memory_pipeline m
    LEFT JOIN pipeline_agents a USING (agent_id)
    WHERE m.status = 'unindexed'
      AND NOT list_contains(coalesce(a.ambient_memory_ids, []::VARCHAR[]), m.memory_id)
    GROUP BY m.agent_id
),
agents AS (
    SELECT agent_id FROM memory_pipeline
    UNION SELECT agent_id FROM recall_probe_events
    UNION SELECT agent_id FROM pipeline_agents
)
SELECT g.agent_id,
       coalesce(m.written, 0) AS written,
       coalesce(m.indexed, 0) AS indexed,
       coalesce(m.pending, 0) AS pending,
       coalesce(m.unindexed, 0) AS unindexed,
       CASE WHEN coalesce(m.written, 0) = 0 THEN NULL
            ELSE m.indexed::DOUBLE / m.written END AS pipeline_coverage,
       CASE WHEN coalesce(p.probed, 0) = 0 THEN NULL
            ELSE p.hits::DOUBLE / p.probed END AS semantic_recall_rate,
       CASE WHEN coalesce(m.written, 0) = 0 OR a.ambient_at IS NULL THEN NULL
            ELSE coalesce(x.in_ambient, 0)::DOUBLE / m.written END AS ambient_trigger_rate,
       m.last_written_at,
       coalesce(a.last_indexed_at, m.last_memory_indexed_at) AS last_indexed_at,
       a.broken_since IS NOT NULL AS broken,
       a.broken_since,
       coalesce(p.probed, 0) AS probed,
       coalesce(p.probed, 0) - coalesce(p.hits, 0) AS missed,
       coalesce(r.not_indexed_misses, 0) AS not_indexed_misses,
       coalesce(r.below_threshold_misses, 0) AS below_threshold_misses,
       coalesce(r.aliased_misses, 0) AS aliased_misses,
       coalesce(r.outranked_misses, 0) AS outranked_misses,
       CASE WHEN coalesce(p.probed, 0) = 0 THEN NULL
            ELSE coalesce(r.aliased_misses, 0)::DOUBLE / p.probed END AS aliasing_rate,
       coalesce(u.unreachable, 0) AS unreachable,
       CASE WHEN coalesce(m.written, 0) = 0 THEN NULL
            ELSE coalesce(u.unreachable, 0)::DOUBLE / m.written END AS unreachable_share
FROM agents g
LEFT JOIN memories m USING (agent_id)
LEFT JOIN probes p USING (agent_id)
LEFT JOIN misses r USING (agent_id)
LEFT JOIN pipeline_agents a USING (agent_id)
LEFT JOIN ambient x USING (agent_id)
LEFT JOIN unreachable u USING (agent_id);

-- Per agent and query source (contract section 9): `probed` the memories with a probe of that
-- source, `hits` those whose latest probe of that source (ts, then event_id) hit. A memory
-- probed both ways counts once in each. The name row is pipeline_health's SRR; the gap between
-- it and the task row is the recall paper's query-formulation failure (docs/rules.md).
CREATE OR REPLACE VIEW recall_by_query_source AS
WITH latest AS (
    SELECT agent_id, query_source, hit
    FROM recall_probe_events
    QUALIFY row_number() OVER (PARTITION BY agent_id, memory_id, query_source
                               ORDER BY ts DESC, event_id DESC) = 1
)
SELECT agent_id, query_source, count(*) AS probed, count(*) FILTER (WHERE hit) AS hits,
       (count(*) FILTER (WHERE hit))::DOUBLE / count(*) AS recall_rate
FROM latest
GROUP BY agent_id, query_source;

-- When each agent's pipeline was down, by the events, in hindsight (docs/rules.md, "Sessions
-- during breaks"): from the first write that no index event followed within the deadline,
-- to the next index event (NULL: still down). The index events are the memories' first
-- (memory_pipeline.indexed_at); a span's memories all wait for the same next index, so the
-- spans of one agent never overlap. A view: late events move it by themselves.
CREATE OR REPLACE VIEW pipeline_break_spans AS
WITH indexes AS (
    SELECT agent_id, indexed_at FROM memory_pipeline WHERE indexed_at IS NOT NULL
),
starts AS (
    -- the next index at or after the write (an as-of join: the first one not before it); a
    -- memory's own index stamped before its write (clocks apart) ends its own wait there
    SELECT m.agent_id, m.memory_id, m.written_at,
           least(i.indexed_at,
                 CASE WHEN m.indexed_at < m.written_at THEN m.written_at END) AS until,
           a.clock, coalesce(a.deadline_seconds, 600) AS deadline_seconds
    FROM memory_pipeline m
    JOIN pipeline_agents a USING (agent_id)
    ASOF LEFT JOIN indexes i ON i.agent_id = m.agent_id AND i.indexed_at >= m.written_at
    WHERE m.written_at IS NOT NULL
)
SELECT agent_id, min(written_at) AS since, until,
       arg_min(memory_id, (written_at, memory_id)) AS first_memory_id,
       count(*) AS memories
FROM starts
WHERE epoch_ms(coalesce(until, clock)) - epoch_ms(written_at) > round(deadline_seconds * 1000)
GROUP BY agent_id, until;

-- Each session with an outcome, and whether its agent's pipeline was down at the outcome's
-- time (pipeline_break_spans): pipeline_state is broken or healthy, or no_agent_id (the
-- session names no agent) or no_memory_events (its agent sent none): those two are counted
-- apart, never as healthy.
CREATE OR REPLACE VIEW session_pipeline AS
SELECT s.session_id, s.agent_id, s.outcome, s.failure_category,
       s.outcome IN ('rejected', 'rework') AS failed, s.ts,
       CASE WHEN s.agent_id IS NULL THEN 'no_agent_id'
            WHEN a.agent_id IS NULL THEN 'no_memory_events'
            WHEN b.since IS NOT NULL THEN 'broken'
            ELSE 'healthy' END AS pipeline_state,
       b.since AS break_since, b.until AS break_until, b.first_memory_id AS break_first_memory_id
FROM session_diagnostics s
LEFT JOIN pipeline_agents a ON a.agent_id = s.agent_id
LEFT JOIN pipeline_break_spans b
       ON b.agent_id = s.agent_id AND s.ts >= b.since AND (b.until IS NULL OR s.ts < b.until);

-- The memory-count bucket of n (docs/rules.md, "Recall trends"): powers of two, so 1, 2, 3-4,
-- 5-8, 9-16, ...; the bucket's upper end (0 and 1 are their own).
CREATE OR REPLACE MACRO memory_count_bucket(n) AS
    CASE WHEN n <= 1 THEN n ELSE CAST(1 AS BIGINT) << length(bin(n - 1)) END;

-- Each agent's memory count at each of its writes (memories with a memory_written at or before
-- it): an as-of join on it gives the count at any time.
CREATE OR REPLACE VIEW memory_counts AS
SELECT agent_id, written_at,
       count(*) OVER (PARTITION BY agent_id ORDER BY written_at
                      RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS memory_count
FROM memory_pipeline
WHERE written_at IS NOT NULL;

-- Every probe and every ambient context with the agent's memory count at its ts: a probe's
-- hit and query source, an ambient context's share of those memories it names (its ATR).
-- What the trends aggregate.
CREATE OR REPLACE VIEW recall_trend_points AS
WITH points AS (
    SELECT 'probe' AS kind, agent_id, ts, event_id, memory_id, hit, NULL::VARCHAR[] AS memory_ids,
           query_source
    FROM recall_probe_events
    UNION ALL
    SELECT 'ambient', agent_id, ts, event_id, NULL, NULL, memory_ids, NULL
    FROM ambient_contexts
),
named AS (
    -- of each ambient context, the distinct memories it names written by its ts
    SELECT a.agent_id, a.event_id, count(DISTINCT m.memory_id) AS in_context
    FROM (SELECT event_id, agent_id, ts, unnest(memory_ids) AS memory_id
          FROM ambient_contexts) AS a
    JOIN memory_pipeline m
      ON m.agent_id = a.agent_id AND m.memory_id = a.memory_id AND m.written_at <= a.ts
    GROUP BY a.agent_id, a.event_id
)
SELECT p.kind, p.agent_id, p.ts, p.event_id, p.memory_id, p.hit,
       coalesce(c.memory_count, 0) AS memory_count,
       CASE WHEN p.kind = 'ambient' THEN coalesce(x.in_context, 0) END AS in_context,
       CASE WHEN p.kind = 'ambient' AND coalesce(c.memory_count, 0) > 0
            THEN coalesce(x.in_context, 0)::DOUBLE / c.memory_count END AS ambient_trigger_rate,
       p.query_source
FROM points p
ASOF LEFT JOIN memory_counts c ON c.agent_id = p.agent_id AND p.ts >= c.written_at
LEFT JOIN named x
  ON x.agent_id = p.agent_id AND x.event_id = p.event_id AND p.kind = 'ambient';

-- The trends' one rule (docs/rules.md, "Recall trends"), per agent and bucket: SRR of each
-- memory's latest name probe in the bucket, the task recall the same of its task probes
-- (query_source task), ATR the mean of the bucket's ambient contexts' (those with a rate). The bucket is the time bucket's number when bucket_seconds is given (aligned
-- on Monday 1970-01-05 00:00 UTC, by exact floor division), else the memory-count bucket's
-- upper end (memory_count_bucket). A row for each bucket with a probe or an ambient context.
CREATE OR REPLACE MACRO recall_buckets(bucket_seconds := NULL) AS TABLE
WITH points AS (
    SELECT *, CASE WHEN bucket_seconds IS NULL THEN memory_count_bucket(memory_count)
                   ELSE (x - ((x % us) + us) % us) // us END AS bucket
    FROM (SELECT *, epoch_us(ts) - 345600000000 AS x,  -- from 1970-01-05, a Monday, in µs
                 CAST(round(bucket_seconds * 1e6) AS BIGINT) AS us
          FROM recall_trend_points)
),
latest AS (
    SELECT agent_id, bucket, hit, query_source
    FROM points
    WHERE kind = 'probe'
    QUALIFY row_number() OVER (PARTITION BY agent_id, bucket, memory_id, query_source
                               ORDER BY ts DESC, event_id DESC) = 1
),
probes AS (
    SELECT agent_id, bucket,
           count(*) FILTER (WHERE query_source = 'name') AS probed,
           count(*) FILTER (WHERE query_source = 'name' AND hit) AS hits,
           count(*) FILTER (WHERE query_source = 'task') AS task_probed,
           count(*) FILTER (WHERE query_source = 'task' AND hit) AS task_hits
    FROM latest GROUP BY agent_id, bucket
),
ambient AS (
    SELECT agent_id, bucket, count(*) AS ambient_contexts,
           avg(ambient_trigger_rate) AS ambient_trigger_rate
    FROM points WHERE kind = 'ambient' GROUP BY agent_id, bucket
)
SELECT agent_id, bucket,
       coalesce(p.probed, 0) AS probed,
       coalesce(p.hits, 0) AS hits,
       CASE WHEN coalesce(p.probed, 0) > 0 THEN p.hits::DOUBLE / p.probed END
           AS semantic_recall_rate,
       coalesce(a.ambient_contexts, 0) AS ambient_contexts,
       a.ambient_trigger_rate,
       coalesce(p.task_probed, 0) AS task_probed,
       coalesce(p.task_hits, 0) AS task_hits,
       CASE WHEN coalesce(p.task_probed, 0) > 0 THEN p.task_hits::DOUBLE / p.task_probed END
           AS task_recall_rate
FROM probes p
FULL JOIN ambient a USING (agent_id, bucket);

-- SRR and ATR per agent and time bucket of bucket_seconds (recall_buckets: days are UTC days,
-- weeks start on Monday), with the agent's memory count at the bucket's end (written).
CREATE OR REPLACE MACRO recall_trend(bucket_seconds := 86400) AS TABLE
WITH r AS (
    SELECT *, CAST(round(bucket_seconds * 1e6) AS BIGINT) AS us,
           CAST(345600000000 AS BIGINT) AS origin  -- as recall_buckets'
    FROM recall_buckets(bucket_seconds := bucket_seconds)
),
b AS (
    SELECT *, make_timestamptz(origin + bucket * us) AS bucket_start,
           make_timestamptz(origin + (bucket + 1) * us) AS bucket_end
    FROM r
)
SELECT b.agent_id, b.bucket_start, coalesce(c.memory_count, 0) AS written, b.probed, b.hits,
       b.semantic_recall_rate, b.ambient_contexts, b.ambient_trigger_rate, b.task_probed,
       b.task_hits, b.task_recall_rate
FROM b
ASOF LEFT JOIN memory_counts c ON c.agent_id = b.agent_id AND b.bucket_end > c.written_at;

-- recall_trend by UTC day.
CREATE OR REPLACE VIEW recall_by_day AS
SELECT agent_id, CAST(timezone('UTC', bucket_start) AS DATE) AS day, written, probed, hits,
       semantic_recall_rate, ambient_contexts, ambient_trigger_rate, task_probed, task_hits,
       task_recall_rate
FROM recall_trend(bucket_seconds := 86400);

-- SRR and ATR per agent and memory-count bucket (recall_buckets by memory count): "does recall
-- decay as memory grows".
CREATE OR REPLACE VIEW recall_by_memory_count AS
SELECT agent_id, CASE WHEN bucket <= 1 THEN bucket ELSE bucket // 2 + 1 END AS memory_count_from,
       bucket AS memory_count_to, probed, hits, semantic_recall_rate, ambient_contexts,
       ambient_trigger_rate, task_probed, task_hits, task_recall_rate
FROM recall_buckets(bucket_seconds := NULL);

-- Per agent with name probes, SRR in the window_seconds up to its clock (the newest ts of its
-- memory events) and in the window before: each memory's latest name probe in the window
-- (window_end - window_seconds, window_end], and the same before it. What `status` flags a
-- fall of.
CREATE OR REPLACE MACRO recall_change(window_seconds := 86400) AS TABLE
WITH ends AS (
    SELECT p.agent_id, epoch_us(coalesce(any_value(a.clock), max(p.ts))) AS end_us
    FROM recall_probe_events p
    LEFT JOIN pipeline_agents a USING (agent_id)
    WHERE p.query_source = 'name'
    GROUP BY p.agent_id
),
placed AS (
    SELECT p.agent_id, p.memory_id, p.hit, p.ts, p.event_id,
           CASE WHEN epoch_us(p.ts) > e.end_us - CAST(round(window_seconds * 1e6) AS BIGINT)
                THEN 'current' ELSE 'previous' END AS side
    FROM recall_probe_events p
    JOIN ends e USING (agent_id)
    WHERE p.query_source = 'name'
      AND epoch_us(p.ts) > e.end_us - 2 * CAST(round(window_seconds * 1e6) AS BIGINT)
      AND epoch_us(p.ts) <= e.end_us
),
latest AS (
    SELECT agent_id, side, hit
    FROM placed
    QUALIFY row_number() OVER (PARTITION BY agent_id, side, memory_id
                               ORDER BY ts DESC, event_id DESC) = 1
),
sides AS (
    SELECT agent_id,
           count(*) FILTER (WHERE side = 'current') AS probed,
           count(*) FILTER (WHERE side = 'current' AND hit) AS hits,
           count(*) FILTER (WHERE side = 'previous') AS previous_probed,
           count(*) FILTER (WHERE side = 'previous' AND hit) AS previous_hits
    FROM latest GROUP BY agent_id
)
SELECT e.agent_id, make_timestamptz(e.end_us) AS window_end,
       coalesce(s.probed, 0) AS probed, coalesce(s.hits, 0) AS hits,
       CASE WHEN s.probed > 0 THEN s.hits::DOUBLE / s.probed END AS semantic_recall_rate,
       coalesce(s.previous_probed, 0) AS previous_probed,
       coalesce(s.previous_hits, 0) AS previous_hits,
       CASE WHEN s.previous_probed > 0 THEN s.previous_hits::DOUBLE / s.previous_probed END
           AS previous_semantic_recall_rate
FROM ends e
LEFT JOIN sides s USING (agent_id);
