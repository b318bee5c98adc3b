-- The recall pipeline's agents and the broken ones (for the status cards: the whole
-- pipeline_health view computes every rate, which the cards do not show), in the order
-- pipeline health lists them: the worst coverage first.
WITH agents AS (
    SELECT agent_id FROM memory_pipeline
    UNION SELECT agent_id FROM recall_probe_events
    UNION SELECT agent_id FROM pipeline_agents
),
memories AS (
    SELECT agent_id,
           count(*) FILTER (WHERE status = 'unindexed') AS unindexed,
           count(*) FILTER (WHERE status = 'indexed')::DOUBLE
               / nullif(count(*) FILTER (WHERE written_at IS NOT NULL), 0) AS coverage
    FROM memory_pipeline
    GROUP BY agent_id
)
SELECT (SELECT count(*) FROM agents) AS agents,
       coalesce(list({'agent_id': a.agent_id, 'since': a.broken_since,
                      'unindexed': coalesce(m.unindexed, 0)}
                     ORDER BY m.coverage ASC NULLS LAST, a.agent_id), []) AS broken
FROM pipeline_agents a
LEFT JOIN memories m USING (agent_id)
WHERE a.broken_since IS NOT NULL;
