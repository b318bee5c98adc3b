-- The first sighting of a bad input stands; a replay of the same bytes adds nothing.
-- session_id: what the payload names, else the key on the events topic (analytics/db.py
-- DEAD_LETTER_SESSION, which fills older files' rows the same way).
INSERT INTO dead_letters (dead_letter_id, topic, "partition", "offset", batch_index, key, reason,
                          detail, payload, payload_bytes, payload_truncated, ts, session_id)
SELECT dead_letter_id, topic, "partition", "offset", batch_index, key, reason, detail, payload,
       payload_bytes, payload_truncated, CAST(ts AS TIMESTAMPTZ),
       COALESCE(TRY(json_extract_string(payload, '$.session_id')),
                CASE WHEN ends_with(topic, 'events') THEN key END)
FROM batch
ON CONFLICT (dead_letter_id) DO NOTHING;
