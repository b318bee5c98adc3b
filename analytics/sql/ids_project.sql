-- Every project_id the sessions, searches and verdicts name.
SELECT project_id AS id FROM session_diagnostics
UNION SELECT project_id FROM searches
UNION SELECT project_id FROM retrieval_feedback
