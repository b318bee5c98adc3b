-- Every memory id of the recall pipeline (any agent's: ids are an agent's own).
SELECT memory_id AS id FROM memory_pipeline
UNION SELECT memory_id FROM recall_probe_events
