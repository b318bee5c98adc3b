-- Agent searches and followups per time bucket: the span of the data cut into $buckets.
WITH span AS (
    SELECT min(ts) AS t0,
           greatest(epoch(max(ts)) - epoch(min(ts)), 1) / $buckets AS width
    FROM searches WHERE source = 'agent'
)
-- the newest search is at the span's end: it belongs to the last bucket, not to one past it
SELECT to_timestamp(epoch(span.t0)
                    + least(floor((epoch(s.ts) - epoch(span.t0)) / span.width), $buckets - 1)
                      * span.width) AS bucket,
       count(*) AS agent_searches,
       count(*) FILTER (WHERE s.is_followup) AS followups,
       count(*) FILTER (WHERE s.is_followup)::DOUBLE / count(*) AS rate
FROM searches s, span
WHERE s.source = 'agent'
GROUP BY bucket
ORDER BY bucket;
