-- A late search changed its successor's predecessor: rewrite the successor's verdict.
UPDATE searches
SET is_followup = batch.is_followup,
    prev_event_id = batch.prev_event_id,
    gap_seconds = batch.gap_seconds
FROM batch
WHERE searches.event_id = batch.event_id;
