-- The event time the sessions, searches and verdicts span: what an empty --since window is
-- told.
SELECT min(ts) AS first, max(ts) AS last
FROM (SELECT ts FROM session_diagnostics
      UNION ALL SELECT ts FROM searches
      UNION ALL SELECT ts FROM retrieval_feedback)
