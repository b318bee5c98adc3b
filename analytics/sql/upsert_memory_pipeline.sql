-- One row per (agent, memory): the worker sends the whole row whenever it changes, and again
-- on a redelivery; the last one sent is the memory as its agent's events say.
INSERT INTO memory_pipeline (agent_id, memory_id, name, written_at, indexed_at, status, store,
                             indexed_store, index_delay_seconds, ever_unindexed,
                             write_event_id, index_event_id, updated_at)
SELECT agent_id, memory_id, name, CAST(written_at AS TIMESTAMPTZ),
       CAST(indexed_at AS TIMESTAMPTZ), status, store, indexed_store, index_delay_seconds,
       ever_unindexed, write_event_id, index_event_id, current_timestamp
FROM batch
ON CONFLICT (agent_id, memory_id) DO UPDATE SET
    name = EXCLUDED.name,
    written_at = EXCLUDED.written_at,
    indexed_at = EXCLUDED.indexed_at,
    status = EXCLUDED.status,
    store = EXCLUDED.store,
    indexed_store = EXCLUDED.indexed_store,
    index_delay_seconds = EXCLUDED.index_delay_seconds,
    ever_unindexed = EXCLUDED.ever_unindexed,
    write_event_id = EXCLUDED.write_event_id,
    index_event_id = EXCLUDED.index_event_id,
    updated_at = EXCLUDED.updated_at;
