-- The recall paper's query-formulation failure per agent (memdiag query pipeline-health): over
-- the memories probed both ways (each by its latest probe of each source, ts then event_id),
-- the name probes' recall minus the task probes', and how many memories their name found and
-- a task did not. Rates over other memories would mix two populations.
WITH latest AS (
    SELECT agent_id, memory_id, query_source, hit
    FROM recall_probe_events
    QUALIFY row_number() OVER (PARTITION BY agent_id, memory_id, query_source
                               ORDER BY ts DESC, event_id DESC) = 1
),
both_ways AS (
    SELECT n.agent_id, n.hit AS name_hit, t.hit AS task_hit
    FROM latest n
    JOIN latest t ON t.agent_id = n.agent_id AND t.memory_id = n.memory_id
    WHERE n.query_source = 'name' AND t.query_source = 'task'
)
SELECT agent_id, count(*) AS probed_both_ways,
       count(*) FILTER (WHERE name_hit AND NOT task_hit) AS found_by_name_only,
       avg(name_hit::INTEGER) - avg(task_hit::INTEGER) AS gap
FROM both_ways
WHERE $agent_id IS NULL OR agent_id = $agent_id
GROUP BY agent_id;
