-- One row per session with an outcome: is it failed, its agent searches, the gaps of its
-- disjoint new queries (a followup under any window >= the gap), its ignored memories, and
-- how many of its judged searches predate disjoint_new_query (their verdict is unknown).
WITH s AS (
    SELECT session_id,
           list(gap_seconds ORDER BY gap_seconds) FILTER (WHERE disjoint_new_query) AS gaps,
           count(*) FILTER (WHERE evaluated AND prev_event_id IS NOT NULL
                            AND disjoint_new_query IS NULL) AS unknown
    FROM searches
    GROUP BY session_id
)
SELECT d.session_id,
       d.agent_id,
       d.outcome IN ('rejected', 'rework') AS failed,
       d.search_count AS agent_searches,
       coalesce(s.gaps, []) AS gaps,
       len(d.ignored_observation_ids) > 0 AS ignored,
       coalesce(s.unknown, 0) AS unknown
FROM session_diagnostics d
LEFT JOIN s USING (session_id)
WHERE ($org_id IS NULL OR d.org_id = $org_id)
  AND ($project_id IS NULL OR d.project_id = $project_id)
  AND ($since IS NULL OR d.ts >= CAST($since AS TIMESTAMPTZ))
ORDER BY d.session_id;
