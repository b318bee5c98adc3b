-- Misleading graph entities and edges (over the sessions selected), with their weight now.
SELECT kind, id, weight, failed_sessions, accepted_sessions, count(*) OVER () AS total
FROM (
    SELECT 'entity' AS kind, m.id, g.weight, g.failed_sessions, g.accepted_sessions
    FROM misleading_graph_entities(org_id := $org_id, since := $since) m
    LEFT JOIN graph_weights g ON g.id = 'entity:' || m.id
    UNION ALL
    SELECT 'edge' AS kind, m.id, g.weight, g.failed_sessions, g.accepted_sessions
    FROM misleading_graph_edges(org_id := $org_id, since := $since) m
    LEFT JOIN graph_weights g ON g.id = 'edge:' || m.id
)
ORDER BY failed_sessions DESC NULLS LAST, kind, id
LIMIT $limit;
