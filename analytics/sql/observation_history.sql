-- One observation's verdicts, most recent first.
SELECT ts, session_id, turn_id, signal, match_ratio, keyword_count, matched_count,
       org_id, project_id
FROM retrieval_feedback
WHERE observation_id = $observation_id
ORDER BY ts DESC, session_id, turn_id
LIMIT $limit;
