-- Dead letters by reason, newest first, with the newest $samples of each: what the page and
-- `memdiag query dead-letters` show.
WITH ranked AS (
    SELECT reason, topic, "partition", "offset", batch_index, key, detail,
           left(payload, 2000) AS payload, payload_bytes, payload_truncated, ts,
           count(*) OVER (PARTITION BY reason) AS dead_letters,
           max(ts) OVER (PARTITION BY reason) AS latest,
           row_number() OVER (PARTITION BY reason ORDER BY ts DESC NULLS LAST, dead_letter_id) AS n
    FROM dead_letters
    WHERE $reason IS NULL OR reason = $reason
)
SELECT reason, any_value(dead_letters) AS dead_letters, any_value(latest) AS latest,
       list({'topic': topic, 'partition': "partition", 'offset': "offset",
             'batch_index': batch_index, 'key': key, 'detail': detail, 'payload': payload,
             'payload_bytes': payload_bytes, 'payload_truncated': payload_truncated, 'ts': ts}
            ORDER BY n) FILTER (WHERE n <= $samples) AS samples
FROM ranked
GROUP BY reason
ORDER BY dead_letters DESC, reason;
