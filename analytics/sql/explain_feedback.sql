-- One session's evaluated turns: each injected memory's verdict, turns in event time.
SELECT turn_id, observation_id, signal, match_ratio, keyword_count, matched_count, ts,
       agent_id, org_id, project_id
FROM retrieval_feedback
WHERE session_id = $session_id
ORDER BY min(ts) OVER (PARTITION BY turn_id), turn_id, match_ratio DESC, observation_id;
