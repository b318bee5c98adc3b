SELECT outcome, count(*) AS sessions FROM session_diagnostics GROUP BY outcome ORDER BY sessions DESC;
