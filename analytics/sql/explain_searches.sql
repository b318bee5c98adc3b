-- One session's searches, in event time (equal times: in the order they were published).
SELECT event_id, ts, source, result_count, evaluated, is_followup, disjoint_new_query,
       prev_event_id, gap_seconds, query, agent_id, org_id, project_id
FROM searches
WHERE session_id = $session_id
ORDER BY ts, published_at, event_id;
