-- Rows where recomputing the followup verdict at $window disagrees with the stream's.
SELECT count(*) FILTER (WHERE disjoint_new_query IS NOT NULL) AS checked,
       count(*) FILTER (WHERE disjoint_new_query IS NOT NULL
                        AND is_followup IS DISTINCT FROM
                            (disjoint_new_query AND gap_seconds <= $window)) AS disagree
FROM searches;
