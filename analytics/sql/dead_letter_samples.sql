-- Dead letters by reason, newest first, with the newest $samples of each: what the page and
-- `memdiag query dead-letters` show. The ranking reads no payload; only the chosen samples
-- fetch theirs (the first 2,000 characters).
WITH ranked AS (
    SELECT dead_letter_id, reason,
           count(*) OVER (PARTITION BY reason) AS dead_letters,
           max(ts) OVER (PARTITION BY reason) AS latest,
           row_number() OVER (PARTITION BY reason ORDER BY ts DESC NULLS LAST, dead_letter_id) AS n
    FROM dead_letters
    WHERE $reason IS NULL OR reason = $reason
),
reasons AS (
    SELECT reason, any_value(dead_letters) AS dead_letters, any_value(latest) AS latest
    FROM ranked GROUP BY reason
),
chosen AS (
    SELECT r.reason, r.n, d.dead_letter_id, d.topic, d."partition", d."offset", d.batch_index, d.key, d.detail,
           left(d.payload, 2000) AS payload, d.payload_bytes, d.payload_truncated, d.ts
    FROM ranked r JOIN dead_letters d USING (dead_letter_id)
    WHERE r.n <= $samples
)
SELECT s.reason, s.dead_letters, s.latest,
       list({'dead_letter_id': c.dead_letter_id, 'topic': c.topic, 'partition': c."partition", 'offset': c."offset",
             'batch_index': c.batch_index, 'key': c.key, 'detail': c.detail, 'payload': c.payload,
             'payload_bytes': c.payload_bytes, 'payload_truncated': c.payload_truncated,
             'ts': c.ts} ORDER BY c.n) FILTER (WHERE c.n IS NOT NULL) AS samples
FROM reasons s
LEFT JOIN chosen c USING (reason)
GROUP BY s.reason, s.dead_letters, s.latest
ORDER BY s.dead_letters DESC, s.reason;
