-- Every session DuckDB has a row of.
SELECT session_id AS id FROM session_diagnostics
UNION SELECT session_id FROM searches
UNION SELECT session_id FROM retrieval_feedback
