-- One session's inputs memdiag could not take: the dead letters keyed by the session (as a
-- keyed producer sends its events) or whose payload names it (an unkeyed one, or a row the
-- sink refused). Newest first, the first 20 of them, with how many there are in all.
WITH theirs AS (
    SELECT reason, detail, topic, "offset", ts,
           TRY(json_extract_string(payload, '$.event_id')) AS event_id,
           TRY(json_extract_string(payload, '$.kind')) AS event_kind
    FROM dead_letters
    -- the sink's session_id: named by the payload, or keyed by the session on the events
    -- topic (another topic's key is a run or an agent); a look-up in its index
    WHERE session_id = $session_id
)
SELECT *, count(*) OVER () AS in_all
FROM theirs
ORDER BY ts DESC NULLS LAST, event_id
LIMIT 20;
