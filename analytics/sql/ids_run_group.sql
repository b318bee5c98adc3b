-- Every run group (judgement.run_group_id).
SELECT DISTINCT run_group_id AS id FROM judgements WHERE run_group_id IS NOT NULL
