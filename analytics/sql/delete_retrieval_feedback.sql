-- An observation no longer in a turn (a late span moved it to another turn of its session):
-- its verdict in that turn is taken back. Keyed as the upsert is.
DELETE FROM retrieval_feedback
USING batch
WHERE retrieval_feedback.session_id = batch.session_id
  AND retrieval_feedback.turn_id = batch.turn_id
  AND retrieval_feedback.observation_id = batch.observation_id;
