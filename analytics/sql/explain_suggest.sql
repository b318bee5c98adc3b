-- Sessions whose id contains the one asked for (a typo, a prefix), newest first; else the
-- newest failed sessions.
SELECT session_id, outcome, failure_category, ts
FROM session_diagnostics
WHERE CASE WHEN EXISTS (SELECT 1 FROM session_diagnostics
                        WHERE contains(lower(session_id), lower($session_id)))
           THEN contains(lower(session_id), lower($session_id))
           ELSE outcome IN ('rejected', 'rework') END
ORDER BY ts DESC, session_id
LIMIT $limit;
