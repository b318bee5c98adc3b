-- memdiag status: per agent, SRR in the $window_seconds up to its clock and in the window
-- before (the recall_change macro).
SELECT agent_id, window_end, probed, hits, semantic_recall_rate, previous_probed, previous_hits,
       previous_semantic_recall_rate
FROM recall_change(window_seconds := $window_seconds)
ORDER BY agent_id;
