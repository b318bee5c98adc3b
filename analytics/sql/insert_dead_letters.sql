-- The first sighting of a bad input stands; a replay of the same bytes adds nothing.
INSERT INTO dead_letters (dead_letter_id, topic, "partition", "offset", batch_index, key, reason,
                          detail, payload, payload_bytes, payload_truncated, ts)
SELECT dead_letter_id, topic, "partition", "offset", batch_index, key, reason, detail, payload,
       payload_bytes, payload_truncated, CAST(ts AS TIMESTAMPTZ)
FROM batch
ON CONFLICT (dead_letter_id) DO NOTHING;
