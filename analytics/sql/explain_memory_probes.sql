-- memdiag explain-memory: the memory's probes, the latest first, with where each one's query
-- came from (query_source), the first k results (what came back instead) and why each name
-- probe missed. The latest probe of each source is always among them (`latest_of_source`),
-- also past $limit: it is the memory's verdict (SRR's for the name).
SELECT event_id, ts, query_source, hit, rank, score, k, threshold, result_count, miss_reason,
       top_ids, latest_of_source, total
FROM (
    SELECT *, count(*) OVER () AS total,
           row_number() OVER (ORDER BY ts DESC, event_id DESC) AS n,
           row_number() OVER (PARTITION BY query_source ORDER BY ts DESC, event_id DESC) = 1
               AS latest_of_source
    FROM recall_probes
    WHERE agent_id = $agent_id AND memory_id = $memory_id
)
WHERE n <= $limit OR (latest_of_source AND $limit > 0)
ORDER BY ts DESC, event_id DESC;
