-- memdiag explain-memory: the memory's probes, the latest first, with the first k results
-- (what came back instead) and why each missed.
SELECT event_id, ts, hit, rank, score, k, threshold, result_count, miss_reason, top_ids,
       count(*) OVER () AS total
FROM recall_probes
WHERE agent_id = $agent_id AND memory_id = $memory_id
ORDER BY ts DESC, event_id DESC
LIMIT $limit;
