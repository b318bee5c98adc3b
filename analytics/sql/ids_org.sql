-- Every org_id the sessions, searches and verdicts name (an unknown --org lists the closest).
SELECT org_id AS id FROM session_diagnostics
UNION SELECT org_id FROM searches
UNION SELECT org_id FROM retrieval_feedback
