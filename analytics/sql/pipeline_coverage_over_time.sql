-- Pipeline coverage per agent and time bucket of written_at (the report's chart): of the
-- memories written in the bucket, the share indexed. Buckets split the agents' written
-- range in $buckets equal parts.
WITH bounds AS (
    SELECT min(written_at) AS lo, max(written_at) AS hi FROM memory_pipeline
),
width AS (
    SELECT lo, greatest(epoch_us(hi) - epoch_us(lo), 1) / $buckets AS us FROM bounds
),
bucketed AS (
    SELECT m.agent_id,
           least(floor((epoch_us(m.written_at) - epoch_us(w.lo)) / w.us)::BIGINT,
                 $buckets - 1) AS bucket,
           m.status = 'indexed' AS is_indexed
    FROM memory_pipeline m, width w
    WHERE m.written_at IS NOT NULL
)
SELECT b.agent_id,
       make_timestamptz(CAST(epoch_us(w.lo) + b.bucket * w.us AS BIGINT)) AS bucket_start,
       count(*) AS written,
       count(*) FILTER (WHERE is_indexed) AS indexed,
       (count(*) FILTER (WHERE is_indexed))::DOUBLE / count(*) AS pipeline_coverage
FROM bucketed b, width w
GROUP BY b.agent_id, b.bucket, w.lo, w.us
ORDER BY b.agent_id, b.bucket;
