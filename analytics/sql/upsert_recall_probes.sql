-- One row per recall_probe event: a function of the event alone, so a redelivery or a replay
-- writes the same values. ingested_at keeps its first value. (miss_reason is the view
-- recall_probes': it follows the agent's writes and index events whenever they arrive.) A
-- record from a worker older than query_source has none: its probe was a name probe.
INSERT INTO recall_probe_events (event_id, agent_id, memory_id, hit, rank, ts, score, k,
                                 threshold, result_count, top_ids, ingested_at, query_source)
SELECT event_id, agent_id, memory_id, hit, rank, CAST(ts AS TIMESTAMPTZ), score, k, threshold,
       result_count, top_ids, current_timestamp, coalesce(query_source, 'name')
FROM batch
ON CONFLICT (agent_id, event_id) DO UPDATE SET
    memory_id = EXCLUDED.memory_id,
    hit = EXCLUDED.hit,
    rank = EXCLUDED.rank,
    ts = EXCLUDED.ts,
    score = EXCLUDED.score,
    k = EXCLUDED.k,
    threshold = EXCLUDED.threshold,
    result_count = EXCLUDED.result_count,
    top_ids = EXCLUDED.top_ids,
    query_source = EXCLUDED.query_source;
