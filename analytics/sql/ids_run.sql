-- Every benchmark run.
SELECT DISTINCT run_id AS id FROM judgements
