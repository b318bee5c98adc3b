-- Misleading observations with their weight now and the failed session (of the org and time
-- selected) they were last in: where to look first; `total` is how many there are in all.
SELECT m.observation_id, m.fail_count, m.success_count, w.weight,
       (SELECT h.session_id FROM observation_weight_history h
        JOIN session_diagnostics d ON d.session_id = h.session_id
        WHERE h.observation_id = m.observation_id AND h.outcome IN ('rejected', 'rework')
          AND ($org_id IS NULL OR d.org_id = $org_id)
          AND ($since IS NULL OR d.ts >= $since)
        ORDER BY h.ts DESC, h.session_id LIMIT 1) AS latest_failed_session_id,
       count(*) OVER () AS total
FROM misleading_observations(org_id := $org_id, since := $since) m
LEFT JOIN observation_weights w USING (observation_id)
ORDER BY m.fail_count DESC, m.observation_id
LIMIT $limit;
