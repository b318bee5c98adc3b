-- The time range of the probes and ambient contexts (the report picks its trend grain by it).
SELECT min(ts) AS first, max(ts) AS last
FROM (SELECT ts FROM recall_probe_events UNION ALL SELECT ts FROM ambient_contexts);
